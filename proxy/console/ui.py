"""The session inspector at ``/admin/ui``: server-rendered pages behind the admin token (proxy layer, http).

A browser cannot put a bearer header on a navigation, so the token is given once to a login form;
the answer is an ``HttpOnly; SameSite=Strict`` cookie holding an expiry and its HMAC under a key
derived from the admin token (never the token: a new token signs everyone out). Every route checks
it (or a bearer admin token, for scripts). The two actions, recover and fork, run the admin API's
own handlers and also need ``X-CSRF-Token``, an HMAC of the cookie that only the inspector's own
pages carry and only its script sends. Without an admin token the inspector answers like the
admin API does: 401 ``ADMIN_UNAUTHORIZED``. Thumbnails are re-encoded by Pillow from a verified
store read, never the stored bytes themselves.
"""

from __future__ import annotations

from functools import partial
import hashlib
import hmac
import secrets
import io
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final
from urllib.parse import urlencode

import msgspec
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy
from PIL import Image

from ...adapters.redact import shorten
from ...policy.errors import (
    AttachmentError,
    Code,
    InvalidRequest,
    NotFound,
    ProjectionistError,
    Unauthorized,
)
from ...policy.failures import retried
from ...policy.fold import EMPTY
from ...policy.model import check_id, check_scoped_session, short_id
from ...policy.projection import refresh
from . import admin
from ..inbound.auth import Guard
from ..inbound.context import ERROR_CODE_HEADER, Handler, context
from ..inbound.services import SERVICES, Services
from .ui_assets import CSS, ICON, JS
from .ui_pages import (
    UI,
    error_page,
    login_page,
    replay_page,
    session_page,
    sessions_page,
)
from ..lanes import Busy
from ..sessionlog.summary import summaries
from ..call.replay import rebuild
from ..inbound.params import natural
from ..call.relay import CONSOLE_COOKIE

#: Sessions on one page of the session list, and the last page one may ask for.
SESSIONS_PER_PAGE: Final = 200
MAX_PAGE: Final = 500
COOKIE: Final = CONSOLE_COOKIE  # an upstream can never set it: the relay drops such a Set-Cookie
CSRF_HEADER: Final = "X-CSRF-Token"
#: How long a sign-in lasts.
TTL: Final = 12 * 3600
#: The longest side of a thumbnail, in pixels.
THUMB: Final = 160
#: Events of the timeline shown at once.
PAGE: Final = 200
SECURITY_HEADERS: Final = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                               "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}

Page = Callable[[web.Request, str], Awaitable[web.StreamResponse]]


# -- the cookie and the CSRF token -------------------------------------------------------------------

def _key(guard: Guard) -> bytes:
    return hmac.new(guard.admin_token, b"projectionist admin ui v1", hashlib.sha256).digest()


def _mac(guard: Guard, message: str) -> str:
    return hmac.new(_key(guard), message.encode(), hashlib.sha256).hexdigest()


def issue(guard: Guard, now: float) -> str:
    """A sign-in cookie value: its expiry, a nonce of its own (so signing out revokes this one
    sign-in, never the next), and their HMAC."""
    expires = int(now) + TTL
    nonce = secrets.token_hex(8)
    return f"{expires}.{nonce}.{_mac(guard, f'session|{expires}|{nonce}')}"


def valid(guard: Guard, cookie: str | None, now: float) -> bool:
    if not guard.admin_token or not cookie or cookie in guard.revoked:
        return False
    expires, _, rest = cookie.partition(".")
    nonce, _, mac = rest.partition(".")
    until = natural(expires)
    if until is None or until < now or len(nonce) != 16:
        return False
    return hmac.compare_digest(mac.encode("utf-8", "surrogateescape"),
                               _mac(guard, f"session|{expires}|{nonce}").encode())


def csrf_of(guard: Guard, cookie: str) -> str:
    return _mac(guard, f"csrf|{cookie}")


def _secured(response: web.StreamResponse, cache: str = "no-store") -> web.StreamResponse:
    response.headers.update(SECURITY_HEADERS)
    response.headers.setdefault("Cache-Control", cache)
    return response


def _enabled(request: web.Request) -> Services:
    services = request.app[SERVICES]
    if not services.guard.admin_token:
        raise Unauthorized("admin API disabled: set PROJECTIONIST_ADMIN_TOKEN or --admin-token")
    return services


def _cookie(request: web.Request, services: Services) -> str | None:
    """The request's sign-in cookie when it is valid."""
    cookie = request.cookies.get(COOKIE)
    return cookie if valid(services.guard, cookie, time.time()) else None


def _safe_next(value: str) -> str:
    """Where a sign-in may send the browser: an inspector path of this proxy, nothing else."""
    ok = value == UI or value.startswith((UI + "/", UI + "?"))
    return value if ok and "\\" not in value and value.isprintable() and "//" not in value else UI


# -- route wrappers ----------------------------------------------------------------------------------

def _page(handler: Page) -> Handler:
    """A page: signed in (or a bearer admin token), else sent to the login form; an error is a page too."""
    async def guarded(request: web.Request) -> web.StreamResponse:
        services = _enabled(request)
        cookie = _cookie(request, services)
        if cookie is None and not services.guard.is_admin(request.headers):
            return _secured(web.Response(status=303, headers={"Location": f"{UI}/login?{urlencode({'next': request.path_qs})}"}))
        csrf = csrf_of(services.guard, cookie) if cookie else ""
        try:
            await services.recording.drain()  # the records of calls that already finished
            return _secured(await handler(request, csrf))
        except ProjectionistError as error:
            context(request).fields["error_code"] = error.code
            response = web.Response(text=error_page(error.status, error.code, error.public_message, csrf),
                                    status=error.status, content_type="text/html", headers={ERROR_CODE_HEADER: error.code})
            return _secured(response)
    return guarded


def _allowed(request: web.Request) -> Services:
    """Signed in with the CSRF token, or a bearer admin token; else 401 (no sign-in) or 403."""
    services = _enabled(request)
    cookie = _cookie(request, services)
    if cookie is not None:
        presented = request.headers.get(CSRF_HEADER, "")
        if not hmac.compare_digest(presented.encode("utf-8", "surrogateescape"), csrf_of(services.guard, cookie).encode()):
            raise ProjectionistError("missing or wrong X-CSRF-Token: use the inspector's own page",
                                     code=Code.CSRF_REJECTED, status=403)
    elif not services.guard.is_admin(request.headers):
        raise Unauthorized("sign in at /admin/ui/login, or send the admin bearer token")
    return services


def _action(handler: Handler) -> Handler:
    """An action of the admin API (``admin.post_recover``, ``admin.post_fork``), from a page."""
    async def guarded(request: web.Request) -> web.StreamResponse:
        services = _allowed(request)
        await services.recording.drain()
        session_id = check_scoped_session(request.match_info["sid"])
        context(request).fields.update(session=session_id, ui=True)
        return _secured(await handler(request))
    return guarded


# -- sign-in -----------------------------------------------------------------------------------------

async def get_login(request: web.Request) -> web.StreamResponse:
    _enabled(request)
    return _secured(web.Response(text=login_page(_safe_next(request.query.get("next", UI))), content_type="text/html"))


async def post_login(request: web.Request) -> web.StreamResponse:
    services = _enabled(request)
    try:
        form = await request.post()
    except (ValueError, KeyError, AssertionError):  # aiohttp's words for a malformed form
        raise InvalidRequest("the sign-in form is malformed", code=Code.INVALID_MULTIPART) from None
    token, target = form.get("token"), _safe_next(str(form.get("next", UI)))
    presented: CIMultiDictProxy[str] = CIMultiDictProxy(CIMultiDict(
        {"Authorization": f"Bearer {token}"} if isinstance(token, str) and token else {}))
    if not services.guard.is_admin(presented):
        context(request).fields["error_code"] = Code.ADMIN_UNAUTHORIZED
        response = web.Response(text=login_page(target, "That is not the admin token."), status=401,
                                content_type="text/html", headers={ERROR_CODE_HEADER: Code.ADMIN_UNAUTHORIZED})
        return _secured(response)
    response = web.Response(status=303, headers={"Location": target})
    # Secure when the browser came over TLS, here or at a terminator in front (an https public_url)
    secure = request.secure or services.config.public_url.startswith("https://")
    response.set_cookie(COOKIE, issue(services.guard, time.time()), max_age=TTL, path=UI, httponly=True,
                        samesite="Strict", secure=secure)
    return _secured(response)


def revoke(guard: Guard, cookie: str | None, now: float) -> None:
    """Sign ``cookie`` out for good (until it would have expired), on this process; the expired
    revocations are forgotten (only a signed-in operator adds one: the set stays small)."""
    for old in [c for c, until in guard.revoked.items() if until < now]:
        del guard.revoked[old]
    if cookie and valid(guard, cookie, now):
        guard.revoked[cookie] = float(natural(cookie.partition(".")[0]) or now)


async def post_logout(request: web.Request) -> web.StreamResponse:
    _allowed(request)
    revoke(request.app[SERVICES].guard, request.cookies.get(COOKIE), time.time())
    response = web.Response(status=204)
    response.del_cookie(COOKIE, path=UI)
    return _secured(response)


# -- pages -------------------------------------------------------------------------------------------

async def sessions(request: web.Request, csrf: str) -> web.StreamResponse:
    """One page of sessions, the most recently active first (``?page=N``, ``SESSIONS_PER_PAGE``
    each): a proxy of 20,000 sessions renders 200 rows, not 11 MB on the event loop."""
    number = _int_query(request, "page") or 0
    if number > MAX_PAGE:
        raise InvalidRequest(f"'page' must be at most {MAX_PAGE}", code=Code.INVALID_QUERY)
    start = number * SESSIONS_PER_PAGE
    found = await summaries(request.app[SERVICES].log, limit=start + SESSIONS_PER_PAGE + 1, skip=start)
    more = len(found) > SESSIONS_PER_PAGE
    return web.Response(text=sessions_page(found[:SESSIONS_PER_PAGE], csrf, page_number=number, more=more),
                        content_type="text/html")


def _int_query(request: web.Request, name: str) -> int | None:
    value = request.query.get(name)
    if value is None or value == "":
        return None
    number = natural(value)
    if number is None or number >= 2**62:
        raise InvalidRequest(f"'{name}' must be a non-negative integer", code=Code.INVALID_QUERY)
    return number


async def session(request: web.Request, csrf: str) -> web.StreamResponse:
    """One session: its standing quarantines (from the cached fold), and a window of its timeline
    (the latest ``PAGE`` events, or the ``PAGE`` after ``?after=N``)."""
    log = request.app[SERVICES].log
    sid = check_scoped_session(request.match_info["sid"])
    context(request).fields.update(session=sid)
    after = _int_query(request, "after")
    state = await refresh(log, sid, log.state(sid) or EMPTY)
    first = after if after is not None else max(0, state.last_seq - PAGE)
    events = (await log.read(sid, first))[:PAGE]
    return web.Response(text=session_page(sid, state, events, first=first, csrf=csrf), content_type="text/html")


async def replay(request: web.Request, csrf: str) -> web.StreamResponse:
    """The replay view of one call (``?seq=N``; the last call without it): the recorded inbound
    body beside the rebuilt upstream body, base64 shortened, their differing paths marked."""
    services = request.app[SERVICES]
    sid = check_scoped_session(request.match_info["sid"])
    context(request).fields.update(session=sid)
    rebuilt = await rebuild(services.log, services.store, sid, _int_query(request, "seq"),
                            fit=services.config.policy.fit_images)
    report = rebuilt.summary(show=True)
    recorded: Any = None
    blob = rebuilt.request.inbound_blob
    inbound = await services.store.get_blob(blob) if blob else None
    if inbound is not None:
        try:
            recorded = shorten(msgspec.json.decode(inbound))
        except msgspec.DecodeError:
            recorded = None
    return web.Response(text=replay_page(sid, report, recorded, report.get("body"), csrf), content_type="text/html")


# -- thumbnails and assets ---------------------------------------------------------------------------

def make_thumbnail(data: bytes, side: int = THUMB) -> bytes:
    """A PNG no larger than ``side`` x ``side`` of verified image bytes (the first frame)."""
    with Image.open(io.BytesIO(data)) as image:
        image.draft("RGB", (side, side))  # JPEG: decode at a reduced scale
        image.thumbnail((side, side))
        frame = image if image.mode in ("RGB", "RGBA", "L", "LA") else image.convert("RGBA")
        out = io.BytesIO()
        frame.save(out, format="PNG")
        return out.getvalue()


async def thumbnail(request: web.Request) -> web.StreamResponse:
    services = _enabled(request)
    if _cookie(request, services) is None and not services.guard.is_admin(request.headers):
        raise Unauthorized("sign in at /admin/ui/login, or send the admin bearer token")
    attachment_id = check_id(request.match_info["aid"])
    context(request).fields.update(attachment=attachment_id[:15])
    etag = f'"thumb{THUMB}-{attachment_id.removeprefix("sha256:")[:32]}"'
    cache = "private, max-age=86400, immutable"  # content-addressed: the same id is the same picture
    if etag in request.headers.get("If-None-Match", ""):
        return _secured(web.Response(status=304, headers={"ETag": etag}), cache)
    try:
        image = await services.store.read_image(attachment_id)
    except AttachmentError as error:
        if retried(error.code):  # a transient failure: 503, try again
            raise
        raise NotFound(f"no verified bytes for {attachment_id[:15]} ({error.code})", code=Code.FILE_NOT_FOUND) from None
    try:  # Pillow's work on the variants lane: bounded, timed, never the default executor
        png = await services.variants.lane.run(partial(make_thumbnail, image.data))
    except TimeoutError:
        raise Busy(f"rendering the thumbnail of {short_id(attachment_id)} timed out", code=Code.STORE_BUSY) from None
    return _secured(web.Response(body=png, content_type="image/png", headers={"ETag": etag}), cache)


def _asset(body: str, content_type: str) -> Handler:
    async def serve(request: web.Request) -> web.StreamResponse:
        _enabled(request)
        return _secured(web.Response(text=body, content_type=content_type), "private, max-age=300")
    return serve


def add_ui_routes(router: web.UrlDispatcher) -> None:
    """The inspector's routes (before the ``/admin`` catch-all takes what is left)."""
    router.add_get(UI, _page(sessions), allow_head=False, name="ui.sessions")
    router.add_get(f"{UI}/login", get_login, allow_head=False, name="ui.login")
    router.add_post(f"{UI}/login", post_login, name="ui.login")
    router.add_post(f"{UI}/logout", post_logout, name="ui.logout")
    router.add_get(f"{UI}/static/ui.css", _asset(CSS, "text/css"), allow_head=False, name="ui.css")
    router.add_get(f"{UI}/static/ui.js", _asset(JS, "text/javascript"), allow_head=False, name="ui.js")
    router.add_get(f"{UI}/static/icon.svg", _asset(ICON, "image/svg+xml"), allow_head=False, name="ui.icon")
    router.add_get(f"{UI}/attachments/{{aid}}/thumb", thumbnail, allow_head=False, name="ui.thumbnail")
    base = f"{UI}/sessions/{{sid}}"
    router.add_get(base, _page(session), allow_head=False, name="ui.session")
    router.add_get(f"{base}/replay", _page(replay), allow_head=False, name="ui.replay")
    router.add_post(f"{base}/attachments/{{aid}}/recover", _action(admin.post_recover), name="ui.recover")
    router.add_post(f"{base}/fork", _action(admin.post_fork), name="ui.fork")
    for n, entry in enumerate(("/", "/admin", "/admin/", f"{UI}/")):  # where a newcomer types its address
        router.add_get(entry, _to_console, allow_head=False, name=f"ui.entry{n}")


async def _to_console(request: web.Request) -> web.StreamResponse:
    """The console's own address for the ones a person types first (the listener's root)."""
    raise web.HTTPSeeOther(UI)
