"""The inspector's HTML: the session list, one session's timeline, the replay view, login and
error pages (proxy layer, http).

Pure string building from typed values: every value that came from a client, the log or the
store goes through ``html.escape`` (``_e``), every URL part through ``quote``. No inline script
or style: the page's behaviour is ``/admin/ui/static/ui.js`` and the CSP allows nothing else.
"""

from __future__ import annotations

import html
from collections.abc import Iterator
from typing import Any, Final
from urllib.parse import quote, urlencode

import msgspec

from ...policy.events import (
    CheckpointEvent,
    Event,
    ForkedEvent,
    QuarantineEvent,
    RecoveredEvent,
    RejectedEvent,
    RequestEvent,
    ResponseEvent,
    ResponseRecorded,
    VariantEvent,
    answer,
    answers,
    type_of,
    LinkedEvent,
)
from ...policy.model import short_id as short
from ...policy.fold import SessionState
from ..config import CONSOLE_PATH
from ..call.conversations import linked_session
from ..sessionlog.summary import SessionSummary

UI: Final = CONSOLE_PATH
#: Lines of a body shown per side in the replay view (the rest is cut, and said so).
MAX_LINES: Final = 4000
#: Why a call shows no replay link.
NO_REPLAY: Final = ('Calls recorded in "metadata" mode (the default) keep no bodies, so they cannot be replayed. '
                    'Set record.mode = "full" to replay the calls recorded from then on; '
                    '`projectionist replay --body FILE` replays one whose inbound body you still have.')
#: Differing paths listed above the replay view's bodies.
MAX_PATHS: Final = 200


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _id(attachment_id: str) -> str:
    """An id shortened as placeholders name it, the whole of it on hover."""
    return f'<code title="{_e(attachment_id)}">{_e(short(attachment_id))}</code>'


def session_url(session: str, tail: str = "", **query: object) -> str:
    url = f"{UI}/sessions/{quote(session, safe='')}{tail}"
    return f"{url}?{urlencode(query)}" if query else url


def page(title: str, body: str, *, csrf: str = "", signed_in: bool = True) -> str:
    meta = f'<meta name="csrf-token" content="{_e(csrf)}">' if csrf else ""
    logout = '<button type="button" id="logout">Sign out</button>' if signed_in else ""
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'{meta}<title>{_e(title)} · projectionist</title>'
        f'<link rel="icon" href="{UI}/static/icon.svg" type="image/svg+xml">'
        f'<link rel="stylesheet" href="{UI}/static/ui.css"></head>\n'
        f'<body><header><a class="brand" href="{UI}">projectionist inspector</a>{logout}</header>\n'
        f'<main>{body}</main>\n<script src="{UI}/static/ui.js"></script></body></html>\n'
    )


def login_page(next_url: str, message: str = "") -> str:
    notice = f'<p class="error" role="alert">{_e(message)}</p>' if message else ""
    return page("Sign in", (
        '<h1>Sign in</h1><p>The inspector needs the admin token (<code>PROJECTIONIST_ADMIN_TOKEN</code>).</p>'
        f'{notice}<form method="post" action="{UI}/login" class="login">'
        f'<input type="hidden" name="next" value="{_e(next_url)}">'
        '<label>Admin token <input type="password" name="token" id="token" autocomplete="current-password" '
        'required autofocus></label> <button type="submit" id="sign-in">Sign in</button></form>'), signed_in=False)


def error_page(status: int, code: str, message: str, csrf: str) -> str:
    return page(f"{status} {code}", f'<h1>{status} <code>{_e(code)}</code></h1><p class="error">{_e(message)}</p>'
                f'<p><a href="{UI}">All sessions</a></p>', csrf=csrf)


# -- the session list ------------------------------------------------------------------------------

def sessions_page(found: list[SessionSummary], csrf: str, *, page_number: int = 0, more: bool = False) -> str:
    rows = "".join(
        f'<tr class="{"held" if s.quarantined else ""}"><td><a href="{_e(session_url(s.session))}">{_e(s.session)}</a></td>'
        f'<td class="num">{s.events}</td><td class="num">{s.quarantined}</td>'
        f'<td class="num">{s.last_seq}</td><td>{_e(s.last_activity)}</td></tr>'
        for s in sorted(found, key=lambda s: (s.last_activity, s.session), reverse=True))
    table = (f'<table id="sessions"><thead><tr><th>session</th><th>events</th><th>quarantined</th><th>last seq</th>'
             f'<th>last activity</th></tr></thead><tbody>{rows}</tbody></table>') if found else \
        '<p class="empty">No sessions yet: a request with a session id starts one.</p>'
    held = sum(1 for s in found if s.quarantined)
    pager = "".join([
        f'<a rel="prev" href="{UI}?page={page_number - 1}">newer sessions</a> ' if page_number else "",
        f'<a rel="next" href="{UI}?page={page_number + 1}">older sessions</a>' if more else ""])
    where = f" on page {page_number + 1}" if page_number or more else ""
    return page("Sessions", f'<h1>Sessions</h1><p class="summary">{_count(len(found), "session")}{where}, {held} with '
                f'quarantined images.</p>{table}' + (f'<p class="pager">{pager}</p>' if pager else ""), csrf=csrf)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


# -- one session -----------------------------------------------------------------------------------

def session_page(session: str, state: SessionState, events: list[Event], *, first: int, csrf: str) -> str:
    """``events`` is the window of the timeline shown; ``first`` the seq before it."""
    held = _held(session, state)
    return page(f"Session {session}", (
        f'<h1>Session <code>{_e(session)}</code></h1>'
        f'<p class="summary">{_count(state.last_seq, "event")} · <span id="held-count">{len(state.quarantined) + len(state.rejected)}'
        '</span> quarantined</p>'
        f'<section><h2>Quarantined references</h2>{held}</section>'
        f'<section><h2>Fork</h2>{_fork_form(session, state.last_seq)}</section>'
        f'<section><h2>Timeline</h2>{_pager(session, first, events, state.last_seq)}{_bodiless(events)}'
        f'{_timeline(session, events)}</section>'), csrf=csrf)


def _bodiless(events: list[Event]) -> str:
    """Why the calls of the window recorded without their body offer no replay, once (none: "")."""
    if not any(isinstance(e, RequestEvent) and e.data.inbound_blob is None for e in events):
        return ""
    return f'<p class="note" id="no-replay">{_e(NO_REPLAY)}</p>'


def _held(session: str, state: SessionState) -> str:
    entries: list[tuple[str, str, str | None, bool, str]] = [
        (q.attachment_id, q.failure, q.name, q.retryable, state.since.get(q.attachment_id, ""))
        for q in state.quarantined.values()]
    entries += [(r.attachment_id, f"rejected by {r.format}", r.name, False, "") for r in state.rejected.values()]
    if not entries:
        return '<p class="empty" id="no-held">Nothing is quarantined.</p>'
    rows = []
    for aid, failure, name, retryable, since in entries:
        action = session_url(session, f"/attachments/{quote(aid, safe='')}/recover")
        rows.append(
            f'<tr class="held" data-aid="{_e(aid)}"><td class="thumb"><img class="thumb" alt="" width="80" height="80" '
            f'src="{UI}/attachments/{_e(quote(aid, safe=""))}/thumb"></td>'
            f'<td>{_id(aid)}<br>{_e(name) if name else "<i>no name</i>"}</td>'
            f'<td class="failure">{_e(failure)}{" (retryable)" if retryable else ""}</td><td>{_e(since)}</td>'
            f'<td><button type="button" class="recover" data-url="{_e(action)}">Recover</button>'
            '<div class="result" role="status"></div></td></tr>')
    return ('<table id="held"><thead><tr><th></th><th>reference</th><th>failure</th><th>since</th><th></th></tr>'
            f'</thead><tbody>{"".join(rows)}</tbody></table>')


def _fork_form(session: str, last_seq: int) -> str:
    return (f'<form id="fork" data-url="{_e(session_url(session, "/fork"))}">'
            '<label>New session id <input name="new_session_id" id="fork-id" required maxlength="256" '
            'pattern="[\\x21-\\x7e]+"></label> '
            f'<label>at seq <input name="at_seq" id="fork-seq" type="number" min="0" max="{last_seq}" '
            f'placeholder="{last_seq}"></label> <button type="submit">Fork</button>'
            '<div class="result" id="fork-result" role="status"></div></form>')


def _pager(session: str, first: int, events: list[Event], last_seq: int) -> str:
    shown_to = events[-1].seq if events else first
    links = []
    if first > 0:
        links.append(f'<a href="{_e(session_url(session, after=max(0, first - len(events))))}">earlier</a>')
    if shown_to < last_seq:
        links.append(f'<a href="{_e(session_url(session, after=shown_to))}">later</a>')
    return (f'<p class="pager">seq {first + 1 if events else first}–{shown_to} of {last_seq} '
            f'{" · ".join(links)}</p>')


def _timeline(session: str, events: list[Event]) -> str:
    calls = {e.seq: e.data.request_id for e in events if isinstance(e, RequestEvent)}
    # a response is shown on its call's row when the call is in the window
    found = {key: outcome for key, outcome in answers(events).items() if key in calls or key in calls.values()}
    rows = []
    for event in events:
        if isinstance(event, ResponseEvent) and (event.data.request_seq or event.data.request_id) in found:
            continue
        kind, cells = _describe(session, event, found)
        rows.append(f'<tr class="ev {kind}" id="seq-{event.seq}"><td class="num">{event.seq}</td>'
                    f'<td class="time">{_e(event.time)}</td><td class="type">{_e(type_of(event))}</td><td>{cells}</td></tr>')
    if not rows:
        return '<p class="empty">No events.</p>'
    return ('<table id="timeline"><thead><tr><th>seq</th><th>time</th><th>event</th><th></th></tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>')


def _describe(session: str, event: Event, found: dict[int | str, ResponseRecorded]) -> tuple[str, str]:
    """The row class and the detail cell of one event."""
    if isinstance(event, RequestEvent):
        r = event.data
        outcome = answer(event, found)
        status = "—" if outcome is None else f"{outcome.status}" + (f" {outcome.error_code}" if outcome.error_code else "")
        refs = "".join(f'<li><code>{_e(ref.path)}</code> <code>{_e(short(ref.attachment_id))}</code> {_e(ref.outcome)}'
                       f'{f" ({_e(ref.failure)})" if ref.failure else ""}{f" as {_e(short(ref.variant))}" if ref.variant else ""}</li>'
                       for ref in r.refs)
        # a call recorded without its body (metadata mode) cannot be rebuilt: no link that ends in a 409
        replay = (f'<a class="replay" href="{_e(session_url(session, "/replay", seq=event.seq))}">replay</a>'
                  if r.inbound_blob is not None else
                  f'<span class="no-replay" title="{_e(NO_REPLAY)}">no replay: no body kept</span>')
        return "call", (f'<span class="method">{_e(r.method)}</span> <code>{_e(r.path)}</code> → {_e(r.upstream)} '
                        f'({_e(r.adapter)}) <span class="status">{_e(status)}</span> {replay}'
                        f'{f"<ul class=refs>{refs}</ul>" if refs else ""}')
    if isinstance(event, ResponseEvent):
        a = event.data
        return "response", f"request {_e(a.request_id)}: status {_e(a.status)}"
    if isinstance(event, QuarantineEvent):
        q = event.data
        name = f' "{_e(q.name)}"' if q.name else ""
        return "quarantine", (f'{_id(q.attachment_id)}{name}: '
                              f'{_e(q.failure)}{" (retryable)" if q.retryable else ""}')
    if isinstance(event, RecoveredEvent):
        d = event.data
        return "recovered", (f'{_id(d.attachment_id)} verified: '
                             f'{_e(d.media_type)}, {d.bytes} bytes, {d.width}×{d.height}'
                             f'{" (automatic)" if d.automatic else ""}')
    if isinstance(event, RejectedEvent):
        j = event.data
        return "rejected", (f'{_id(j.attachment_id)} refused by '
                            f'{_e(j.format)} ({j.suspects} suspect{"s" if j.suspects != 1 else ""})')
    if isinstance(event, ForkedEvent):
        f = event.data
        return "forked", f'from <a href="{_e(session_url(f.parent))}">{_e(f.parent)}</a> at seq {f.at_seq}'
    if isinstance(event, VariantEvent):
        v = event.data
        return "variant", (f'<code>{_e(short(v.attachment_id))}</code> for {_e(v.target)}: '
                           f'<code>{_e(short(v.variant_id))}</code> {_e(v.media_type)} {v.width}×{v.height} ({_e(v.recipe)})')
    if isinstance(event, CheckpointEvent):
        c = event.data
        held = "".join(f"<li><code>{_e(short(h.quarantine.attachment_id))}</code> {_e(h.quarantine.failure)}</li>"
                       for h in c.quarantined)
        return "checkpoint", (f'<details><summary>state at seq {c.state_seq}: {len(c.quarantined)} quarantined, '
                              f'{len(c.rejected)} rejected, {len(c.variants)} variants</summary>'
                              f'<ul>{held}</ul></details>')
    if isinstance(event, LinkedEvent):
        k = event.data
        return "linked", (f'image key <code>{_e(k.key[:12])}</code> of the conversation '
                          f'<a href="{_e(session_url(linked_session(session, k.session)))}">{_e(k.session)}</a>')
    return "unknown", "an event type this version does not know"


# -- replay ----------------------------------------------------------------------------------------

def replay_page(session: str, report: dict[str, Any], recorded: Any, rebuilt: Any, csrf: str) -> str:
    """The replay report of one call; ``recorded`` is the recorded inbound body and ``rebuilt``
    the rebuilt upstream body (both decoded, base64 shortened; None when not available)."""
    marked = differences(recorded, rebuilt) if recorded is not None and rebuilt is not None else set()
    mismatch = report.get("first_difference") or ""
    reason = f": {_e(report['reason'])}" if report.get("reason") else ""
    verdict = ('<span class="ok">matches the record</span>' if report["matches"] else
               f'<span class="bad">DOES NOT MATCH the record</span>{reason}')
    facts = [("call", f'seq {report["seq"]}, request <code>{_e(report["request_id"])}</code>'),
             ("route", f'{_e(report["method"])} <code>{_e(report["path"])}</code> → {_e(report["upstream"])} '
                       f'({_e(report["adapter"])})'),
             ("inbound body", f'<code>{_e(report["inbound"])}</code>'),
             ("recorded digest", f'<code>{_e(report["recorded_digest"])}</code>'),
             ("rebuilt digest", f'<code>{_e(report["rebuilt_digest"] or "—")}</code>'),
             ("verdict", verdict)]
    if mismatch:
        facts.append(("first difference", f'<code class="mismatch">{_e(mismatch)}</code>'))
    table = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in facts)
    refs = "".join(f'<tr><td><code>{_e(r["path"])}</code></td><td><code>{_e(short(r["attachment_id"]))}</code></td>'
                   f'<td>{_e(r["outcome"])}{_failure(r.get("failure"))}</td></tr>' for r in report["refs"])
    paths = sorted(marked)
    listed = "".join(f"<li><code>{_e(p)}</code></li>" for p in paths[:MAX_PATHS])
    more = f"<li>… {len(paths) - MAX_PATHS} more</li>" if len(paths) > MAX_PATHS else ""
    return page(f"Replay {session} seq {report['seq']}", (
        f'<h1>Replay of seq {report["seq"]} in <a href="{_e(session_url(session))}"><code>{_e(session)}</code></a></h1>'
        f'<table class="facts" id="replay-facts">{table}</table>'
        f'<h2>References as recorded</h2><table id="replay-refs"><tbody>{refs}</tbody></table>'
        f'<h2>Recorded inbound body and rebuilt upstream body</h2>'
        f'<p>{len(paths)} differing JSON paths (marked): what projection changed, and where the rebuild '
        f'differs from the record.</p><ul class="paths" id="diff-paths">{listed}{more}</ul>'
        '<div class="sides">'
        f'<div class="side"><h3>recorded (inbound, as the client sent it)</h3>{_json_block(recorded, marked, "", "recorded")}</div>'
        f'<div class="side"><h3>rebuilt (upstream, as replay projects it)</h3>{_json_block(rebuilt, marked, mismatch, "rebuilt")}</div>'
        '</div>'), csrf=csrf)


def _failure(failure: object) -> str:
    return f" ({_e(failure)})" if failure else ""


def differences(old: Any, new: Any, path: str = "") -> set[str]:
    """Every JSON path where ``old`` and ``new`` differ (a member or item only one side has, or a
    value that differs); inside a differing path nothing more is listed."""
    if isinstance(old, dict) and isinstance(new, dict):
        found: set[str] = set()
        for key in [*old, *(k for k in new if k not in old)]:
            if key not in old or key not in new:
                found.add(f"{path}/{key}")
            else:
                found |= differences(old[key], new[key], f"{path}/{key}")
        return found
    if isinstance(old, list) and isinstance(new, list):
        found = set()
        for i, (a, b) in enumerate(zip(old, new)):
            found |= differences(a, b, f"{path}/{i}")
        longer = old if len(old) > len(new) else new
        found.update(f"{path}/{i}" for i in range(min(len(old), len(new)), len(longer)))
        return found
    return set() if old == new else {path or "/"}


def _json_block(value: Any, marked: set[str], mismatch: str, side: str) -> str:
    if value is None:
        return '<p class="empty">not available</p>'
    lines = []
    for n, (path, text) in enumerate(_json_lines(value)):
        if n == MAX_LINES:
            lines.append('<span class="line cut">… cut here</span>')
            break
        classes = "line"
        if _under(path, marked):
            classes += " diff"
        if mismatch and (path == mismatch or path.startswith(mismatch + "/")):
            classes += " mismatch"
        lines.append(f'<span class="{classes}" data-path="{_e(path)}">{_e(text)}</span>')
    return f'<pre class="json" id="body-{side}">{"".join(lines)}</pre>'  # each line a block


def _under(path: str, marked: set[str]) -> bool:
    """Whether ``path`` or one of its ancestors is marked."""
    while True:
        if path in marked:
            return True
        if not path:
            return False
        path = path.rpartition("/")[0]


def _json_lines(value: Any, path: str = "", indent: int = 0, key: str | None = None,
                comma: str = "") -> Iterator[tuple[str, str]]:
    """Pretty JSON, one (path, text) per line."""
    pad = "  " * indent
    head = pad + (msgspec.json.encode(key).decode() + ": " if key is not None else "")
    if isinstance(value, dict) and value:
        yield path, head + "{"
        items = list(value.items())
        for i, (k, v) in enumerate(items):
            yield from _json_lines(v, f"{path}/{k}", indent + 1, str(k), "," if i < len(items) - 1 else "")
        yield path, pad + "}" + comma
    elif isinstance(value, list) and value:
        yield path, head + "["
        for i, v in enumerate(value):
            yield from _json_lines(v, f"{path}/{i}", indent + 1, None, "," if i < len(value) - 1 else "")
        yield path, pad + "]" + comma
    else:
        yield path, head + msgspec.json.encode(value).decode() + comma
