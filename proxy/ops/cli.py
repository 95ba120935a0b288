"""The ``projectionist`` command: serve, demo, and the admin verbs
sessions|timeline|events|quarantine|recover|fork|replay (proxy layer).

Admin verbs work directly on the configured store and log (the log's conditional append makes
that safe next to a running server), so they need no token and no running proxy. Each verb that
takes a session (as an argument; ``replay`` also as ``--session``, as it once did) finds it as the
log holds it, or by the name its client gave it when the log holds it under one tenant
(``<tenant>~name``); a session whose log holds no event exits 1 with ``SESSION_NOT_FOUND``, as the
admin API answers 404, and a name several tenants have exits 1 with ``SESSION_AMBIGUOUS``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from ...policy.errors import Code, Conflict, InvalidRequest, ProjectionistError
from ...policy.model import TENANT_MARK, check_id, check_scoped_session, is_tenant
from ...policy.projection import recover
from ..console.admin import events_view, no_session, quarantine_view, session_events, session_state
from ..edge.app import open_log, open_store
from ..config import Config, Format, load_config, parse_upstream_spec, with_upstreams
from .serve import StartupError, serve
from .workers import supervise
from .demo import DemoFailed, run_demo, write_snapshot
from .fake_upstream import MARKER, FakeUpstream
from ..call import refusals
from ..call.replay import rebuild, send_and_compare
from ..observe.logger import setup_logging
from .tables import sessions_table, timeline_table
from ..sessionlog.base import Log
from ..sessionlog.cached import CachedLog
from ..sessionlog.retention import prune as prune_log
from ..sessionlog.summary import summaries
from ..stores.base import Store

T = TypeVar("T")


def _parse_upstream(value: str) -> tuple[str, Format | None, str]:
    try:
        return parse_upstream_spec(value)
    except ProjectionistError as error:
        raise argparse.ArgumentTypeError(error.message) from None


def _positive(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {value!r}")
    return int(value)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="TOML config file (every key with its default: config/projectionist.toml "
                                         "in the source tree)")
    parser.add_argument("--data-dir", help="data directory of the embedded store and log")


DESCRIPTION = ("An LLM provider proxy that projects image attachment references into each provider's format "
               "and keeps a per-session event log. The admin verbs work directly on the configured store "
               "and log: no token, no running proxy.")


def version() -> str:
    """The installed package's version (from its metadata)."""
    try:
        return importlib.metadata.version("projectionist")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


SESSION_HELP = ("session id: as the client sent it (X-Session-Id, /s/{session}/), or as the log holds it "
                "(<tenant>~<session> with client tokens)")


def _session(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("session", help=SESSION_HELP)


def _json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="one JSON document for scripts instead of a table")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="projectionist", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}",
                        help="print the version and exit")
    sub = parser.add_subparsers(dest="command", required=True, title="commands", metavar="COMMAND",
                                help="what to do; `projectionist COMMAND --help` describes each")
    serve = sub.add_parser("serve", help="run the proxy", description="Run the proxy.")
    _common(serve)
    serve.add_argument("--host", help="listen address (default 127.0.0.1 or [server] host)")
    serve.add_argument("--port", type=int, help="listen port (default 8787 or [server] port)")
    serve.add_argument("--admin-listen", metavar="HOST:PORT",
                       help="where the console and admin API listen (default: auto, 127.0.0.1 on the port + 1)")
    serve.add_argument("--workers", metavar="N",
                       help="server processes sharing the port (1-64, default 1 or [server] workers)")
    serve.add_argument("--admin-token", help="admin bearer token (visible in the process list: prefer "
                                             "--admin-token-file or PROJECTIONIST_ADMIN_TOKEN)")
    serve.add_argument("--admin-token-file", metavar="FILE", help="read the admin bearer token from FILE")
    serve.add_argument("--upstream", action="append", type=_parse_upstream, default=[], metavar="NAME=[FORMAT:]URL",
                       help="override an upstream's base URL (openai=http://127.0.0.1:9000) or declare a named "
                            "one (deepseek=openai:https://api.deepseek.com); repeatable")
    serve.add_argument("--insecure-open-proxy", action="store_true",
                       help="serve a non-loopback address with no client tokens (anyone who reaches the port "
                            "reads every image and session, and spends any server-held key)")
    serve.add_argument("--fake-upstream", action="store_true",
                       help="try the proxy without provider keys: every upstream is a built-in fake provider in "
                            "this process (canned answers in every format, streamed too); it refuses any image "
                            f"whose bytes contain {MARKER.decode()!r}, as a provider refuses one")
    serve.add_argument("--fake-refuse-images", action="store_true",
                       help="with --fake-upstream: the fake provider refuses every inlined image")
    demo = sub.add_parser("demo", help="play the keyless story of a session surviving bad images",
                          description="Play the keyless story of a session surviving bad images.")
    demo.add_argument("--json", metavar="FILE", help="write the snapshot as JSON to FILE ('-' for stdout)")
    demo.add_argument("--keep", action="store_true",
                      help="keep the demo's data dir and print how to serve it and open it in the console")
    sessions = sub.add_parser("sessions", help="list the sessions: events, quarantines, last activity",
                              description="List the sessions, the most recently active first.")
    _common(sessions)
    sessions.add_argument("--limit", type=_positive, metavar="N", help="only the N most recently active sessions")
    _json_flag(sessions)
    timeline = sub.add_parser("timeline", help="print a session's events as a table, one line each",
                              description="Print a session's events, one line each: seq, time, type, summary.")
    _common(timeline)
    _session(timeline)
    timeline.add_argument("--after", type=int, default=0, help="only events with seq > AFTER")
    _json_flag(timeline)
    for verb, helptext in (("events", "print a session's events as JSON"),
                           ("quarantine", "print what is quarantined in a session, as JSON")):
        cmd = sub.add_parser(verb, help=helptext, description=helptext[0].upper() + helptext[1:] + ".")
        _common(cmd)
        _session(cmd)
        if verb == "events":
            cmd.add_argument("--after", type=int, default=0, help="only events with seq > AFTER")
    rec = sub.add_parser("recover", help="lift a quarantine after a full verified read",
                         description="Lift a quarantine after a full verified read (exit 1 with the code if refused).")
    _common(rec)
    _session(rec)
    rec.add_argument("attachment_id", help="the quarantined image, sha256:<64 hex>")
    replay = sub.add_parser("replay", help="rebuild a recorded call from the log, check its digest, resend it",
                            description="Rebuild a recorded call from the log and check its digest; "
                                        "exit 0 when it matches, 3 when it does not.")
    _common(replay)
    replay.add_argument("session", nargs="?", help=SESSION_HELP + ", of the recorded call")
    replay.add_argument("--session", dest="session_flag", metavar="SESSION",
                        help="the session as a flag, as older versions took it (the same as the argument)")
    replay.add_argument("--seq", type=int, help="seq of the request/recorded event (default: the last call)")
    replay.add_argument("--request-id", help="the call whose x-projectionist-request-id this was")
    action = replay.add_mutually_exclusive_group()
    action.add_argument("--show", action="store_true", help="print the rebuilt upstream body (base64 shortened)")
    action.add_argument("--send", action="store_true", help="send it to its upstream and print the answer")
    action.add_argument("--diff", action="store_true", help="send it and compare the answer with the recorded one")
    replay.add_argument("--upstream", dest="send_to", metavar="URL",
                        help="send to this base URL instead of the recorded upstream's")
    replay.add_argument("--body", metavar="FILE", help="the inbound body, for calls recorded in metadata mode")
    replay.add_argument("--header", action="append", default=[], metavar="'NAME: VALUE'",
                        help="header to send (e.g. an Authorization the upstream needs); repeatable")
    replay.add_argument("--json", action="store_true", help="one JSON document for scripts")
    fork = sub.add_parser("fork", help="copy a session's log prefix into a new session",
                          description="Copy a session's log prefix into a new session, then a session/forked marker.")
    _common(fork)
    _session(fork)
    fork.add_argument("new_session", help="id of the new session (must not exist yet)")
    fork.add_argument("--at-seq", type=int, help="copy events up to this seq (default: all of them)")
    prune = sub.add_parser("prune", help="prune the calls' records older than the retention; state events stay",
                           description="Turn every call record older than --older-than days (default: [record] "
                                       "keep_days) into a stand-in of its seq, time and type. State events "
                                       "(quarantines, recoveries, forks, variant pins, refusals) are never touched.")
    _common(prune)
    prune.add_argument("--older-than", type=float, metavar="DAYS",
                       help="prune records older than DAYS days (0: every record up to now)")
    prune.add_argument("--session", dest="only", metavar="SESSION", help="prune one session only")
    _json_flag(prune)
    return parser


def config_from_args(args: argparse.Namespace) -> Config:
    config = load_config(
        args.config,
        **{
            "server.data_dir": args.data_dir,
            "server.host": getattr(args, "host", None),
            "server.port": getattr(args, "port", None),
            "admin.listen": getattr(args, "admin_listen", None),
            "server.admin_token": getattr(args, "admin_token", None) or _token_file(getattr(args, "admin_token_file", None)),
            "server.workers": workers_flag(getattr(args, "workers", None)),
        },
    )
    return with_upstreams(config, getattr(args, "upstream", []))


def _token_file(path: str | None) -> str | None:
    """The token in ``--admin-token-file`` (its first line), or an INVALID_CONFIG naming the flag."""
    if path is None:
        return None
    try:
        token = Path(path).read_text(encoding="utf-8").splitlines()[0].strip() if Path(path).stat().st_size else ""
    except (OSError, UnicodeDecodeError, IndexError) as exc:
        raise ProjectionistError(f"--admin-token-file {path}: cannot be read ({type(exc).__name__})",
                                 code=Code.INVALID_CONFIG) from None
    if not token:
        raise ProjectionistError(f"--admin-token-file {path}: holds no token", code=Code.INVALID_CONFIG)
    return token


def workers_flag(value: str | None) -> int | None:
    """``--workers N`` as an int; the config checks its range (1 to 64), all as INVALID_CONFIG."""
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise InvalidRequest(f"--workers {value!r}: expected a whole number from 1 to 64",
                             code=Code.INVALID_CONFIG) from None


def _print_json(payload: Any) -> None:
    sys.stdout.buffer.write(msgspec.json.format(msgspec.json.encode(payload), indent=2) + b"\n")


async def _with_backends(config: Config, action: Callable[[Store, Log], Awaitable[T]]) -> T:
    store, log = open_store(config), open_log(config)
    try:
        return await action(store, log)
    finally:
        await store.close()
        await log.close()


def check_data_dir(config: Config) -> None:
    """The admin verbs read an existing log: a mistyped ``--data-dir`` is an error, never a new
    empty store and log that report no events."""
    if config.log.kind == "sqlite" and not config.log_path.is_file():
        holds = "no store or log" if config.store.kind != "filesystem" or not config.store_path.is_dir() \
            else "no session log"
        raise InvalidRequest(f"{config.data_dir} holds {holds} ({config.log_path.name} missing): is --data-dir right?",
                             code=Code.EMPTY_DATA_DIR)


#: The CLI only reads: its folds never add a checkpoint to the log.
READ_ONLY = 2**62


def session_arg(args: argparse.Namespace) -> str:
    """The session a verb names ('' for ``sessions``): ``replay`` takes it as an argument or, as it
    did before, as ``--session``; both at once must agree."""
    given = getattr(args, "session", None) or ""
    flag = getattr(args, "session_flag", None)
    if flag is not None and given and flag != given:
        raise InvalidRequest(f"two sessions named: {given!r} and --session {flag!r}", code=Code.INVALID_REQUEST)
    given = given or flag or ""
    if not given and args.command == "replay":
        raise InvalidRequest("replay needs a session: projectionist replay SESSION", code=Code.INVALID_REQUEST)
    return check_scoped_session(given) if given else ""


async def find_session(log: Log, name: str) -> str:
    """The id the log holds session ``name`` under: ``name`` itself when it has events; else the one
    tenant's session of that name (``<tenant>~name``: with client tokens the log scopes each
    client's sessions). Several tenants' sessions of that name are ``SESSION_AMBIGUOUS``, naming
    them; none at all is ``SESSION_NOT_FOUND``."""
    if await log.session_stats(name):
        return name
    tail = TENANT_MARK + name
    scoped = sorted(s.session for s in await log.session_stats()
                    if s.session.endswith(tail) and is_tenant(s.session[:-len(tail)]))
    if len(scoped) > 1:
        raise Conflict(f"{len(scoped)} tenants have a session {name!r}; name one as the log holds it: "
                       + ", ".join(scoped), code=Code.SESSION_AMBIGUOUS)
    if not scoped:
        raise no_session(name)
    print(f"projectionist: session {name!r} is {scoped[0]!r} in the log", file=sys.stderr)
    return scoped[0]


def _admin_verb(args: argparse.Namespace, config: Config) -> int:
    given = session_arg(args)
    session = given
    check_data_dir(config)

    async def sessions(store: Store, log: Log) -> int:
        found = await summaries(CachedLog(log, checkpoint_every=READ_ONLY), limit=args.limit)
        if args.json:
            _print_json({"sessions": found})
        else:
            print(sessions_table(found))
        return 0

    async def timeline(store: Store, log: Log) -> int:
        events = await session_events(log, log, session, args.after)
        if args.json:
            _print_json(events_view(session, events))
        else:
            print(timeline_table(events))
        return 0

    async def events(store: Store, log: Log) -> int:
        _print_json(events_view(session, await session_events(log, log, session, args.after)))
        return 0

    async def quarantine(store: Store, log: Log) -> int:
        _print_json(quarantine_view(session, await session_state(log, session)))
        return 0

    async def recover_verb(store: Store, log: Log) -> int:  # find_session made sure it exists
        result = await recover(check_id(args.attachment_id), store=store, log=log, session_id=session)
        lifted = await refusals.lift(store, log, log, session, args.attachment_id,
                                     tenants=bool(config.tenants())) if result.event is not None else 0
        _print_json({"session": session, "attachment_id": args.attachment_id,
                     "recovered": result.event is not None, "tenant_lifted": lifted, "event": result.event})
        return 0

    async def fork(store: Store, log: Log) -> int:
        new = check_scoped_session(args.new_session)
        if session != given and TENANT_MARK not in new:  # named without its tenant: the copy is the tenant's too
            new = check_scoped_session(session.removesuffix(given) + new)
        event = await log.fork(session, new, args.at_seq)
        _print_json({"session": new, "parent": session, "event": event})
        return 0

    async def replay(store: Store, log: Log) -> int:
        return await replay_verb(args, config, store, log, session)

    async def prune(store: Store, log: Log) -> int:
        keep_days = args.older_than if args.older_than is not None else config.record.keep_days
        if args.older_than is None and keep_days == 0:
            raise InvalidRequest("[record] keep_days is 0 (keep every record): say --older-than DAYS",
                                 code=Code.INVALID_CONFIG)
        if not 0 <= keep_days <= 36500:  # (and not NaN)
            raise InvalidRequest("--older-than must be from 0 to 36500 days", code=Code.INVALID_CONFIG)
        # an empty --session "$SID" is an error, never every session
        only = await find_session(log, check_scoped_session(args.only)) if args.only is not None else None
        done = await prune_log(log, keep_days, only)
        if args.json:
            _print_json({"keep_days": keep_days, **done._asdict()})
        else:
            print(f"pruned {done.records} records in {done.sessions} sessions older than {keep_days:g} days: "
                  f"{done.bytes_before} bytes -> {done.bytes_after}"
                  + (f"; {done.damaged} damaged rows left as they are (see the log)" if done.damaged else ""))
        return 0

    actions = {"sessions": sessions, "timeline": timeline, "events": events, "quarantine": quarantine,
               "recover": recover_verb, "fork": fork, "replay": replay, "prune": prune}

    async def run(store: Store, log: Log) -> int:
        nonlocal session
        if session:
            session = await find_session(log, session)
        return await actions[args.command](store, log)

    return asyncio.run(_with_backends(config, run))


async def replay_verb(args: argparse.Namespace, config: Config, store: Store, log: Log, session: str) -> int:
    """``projectionist replay``: exit 0 when the rebuilt body matches its record (and, with
    --diff, the new answer matches the recorded one), 3 when it does not."""
    inbound = Path(args.body).read_bytes() if args.body else None
    rebuilt = await rebuild(log, store, session, args.seq, inbound, request_id=args.request_id,
                            fit=config.policy.fit_images)
    report: dict[str, Any] = rebuilt.summary(show=args.show)
    headers = {name.strip(): value.strip() for name, _, value in (h.partition(":") for h in args.header)}
    if args.send or args.diff:
        report.update(await send_and_compare(rebuilt, config, store, upstream_url=args.send_to, headers=headers,
                                             compare=args.diff))
    if args.json:
        _print_json(report)
    else:
        print(_replay_text(report))
    same = rebuilt.matches and report.get("diff", {}).get("identical", True) is not False
    return 0 if same else 3


def _replay_text(report: dict[str, Any]) -> str:
    lines = [f"call seq {report['seq']}: request {report['request_id']}, {report['adapter']} -> "
             f"{report['upstream']} {report['method']} {report['path']}",
             f"inbound body: {report['inbound']}"]
    if report["matches"]:
        lines.append(f"rebuilt from the log: projected digest {report['rebuilt_digest']} matches the record")
    else:
        lines.append(f"rebuilt from the log: DOES NOT MATCH the record ({report['reason']}); "
                     f"first difference at {report['first_difference'] or '/'}")
    for ref in report["refs"]:
        failure = f" ({ref['failure']})" if ref.get("failure") else ""
        lines.append(f"  {ref['path']:<32} {ref['attachment_id'][:15]}  {ref['outcome']}{failure}")
    if "body" in report:
        lines.append(msgspec.json.format(msgspec.json.encode(report["body"]), indent=2).decode())
    if "sent" in report:
        sent = report["sent"]
        lines.append(f"sent: HTTP {sent['status']}, {sent['bytes']} bytes ({sent['content_type']})")
        if "diff" not in report:
            lines.append(sent["body"])
    if "diff" in report:
        found = report["diff"]
        if not found["compared"]:
            lines.append(f"diff: {found['reason']}")
        elif found["identical"]:
            lines.append("diff: the new answer matches the recorded one (ids and clocks ignored)")
        else:
            lines.append(f"diff: the new answer differs from the recorded one at {found['first_difference']}")
    return "\n".join(lines)


#: Codes of mistakes in how projectionist was started (exit status 2, like a usage error).
SETUP_ERRORS = frozenset({Code.INVALID_CONFIG, Code.EMPTY_DATA_DIR, Code.MISSING_EXTRA})


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "demo":
            setup_logging("warning", json=True)
            snapshot = asyncio.run(run_demo(print if args.json != "-" else _stderr, keep=args.keep))
            if args.json:
                write_snapshot(snapshot, args.json)
            return 0
        config = config_from_args(args)
        if args.command == "serve":
            return _serve(args, config)
        code = _admin_verb(args, config)
        sys.stdout.flush()  # a reader that left shows here, inside the try, not at the interpreter's exit
        return code
    except ProjectionistError as error:
        message = error.message.removeprefix(f"{error.code}: ")  # a boundary's message may open with its code
        print(f"projectionist: {error.code}: {message}", file=sys.stderr)
        return 2 if error.code in SETUP_ERRORS or isinstance(error, StartupError) else 1
    except DemoFailed as failed:
        print(f"projectionist demo: FAILED: {failed}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # the reader left (``| head -1``): no traceback, the exit a shell's SIGPIPE gives
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def _serve(args: argparse.Namespace, config: Config) -> int:
    if args.fake_refuse_images and not args.fake_upstream:
        raise InvalidRequest("--fake-refuse-images needs --fake-upstream", code=Code.INVALID_CONFIG)
    if not args.fake_upstream:
        run = supervise if config.server.workers > 1 else serve
        run(config, insecure_open_proxy=args.insecure_open_proxy)
        return 0
    if config.server.workers > 1:  # the fake lives in the serving process: one process only
        raise InvalidRequest("--fake-upstream serves in one process: drop --workers", code=Code.INVALID_CONFIG)
    serve(config, insecure_open_proxy=args.insecure_open_proxy, fake=FakeUpstream(refuse_all=args.fake_refuse_images))
    return 0


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
