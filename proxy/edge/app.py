"""The application factory: ``create_app(config) -> web.Application`` (proxy layer).

Wires routes to handlers behind one middleware (``http.middleware``), opens the store and log,
and keeps one ``Client`` (a connection pool) per upstream for the app's life (``cleanup_ctx``). Run it with ``handler_cancellation=True`` (the CLI and
``run_app`` helper here do) so a client disconnect cancels in-flight reads.
"""

from __future__ import annotations

import asyncio
import html
import importlib.util
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Final

from aiohttp import HttpVersion11, hdrs, web

from ...adapters import openai_chat
from ...adapters.registry import SPEAKS
from ...policy.errors import Code, InvalidRequest, NotFound, ProjectionistError
from ..config import CONSOLE_PATH, Config, TelemetryConfig, listen_url
from ..files import gemini as gemini_files
from ..console.admin import add_admin_routes
from ..inbound.auth import Forbidden, Guard, client_unauthorized
from .middleware import context_middleware, note_started
from ..inbound.context import ERROR_CODE_HEADER, Handler, context, error_response
from .readiness import READINESS, Readiness, readyz
from .routing import HOT_PATHS, dispatch_default, dispatch_named, dispatch_session, format_spoken
from ..call.inflight import Acceptances, InFlight
from ..call.record import Recording
from ..inbound.services import ADMIN_APP, SERVICES, Services
from ..console.ui import add_ui_routes
from ..files.attachments import download, upload
from ..observe.logger import get_logger, request_line
from ..observe.metrics import Metrics, OpCounter
from ..sessionlog.base import Log
from ..sessionlog.cached import CachedLog
from ..sessionlog.retention import keep_pruning
from ..sessionlog.sqlite import SqliteLog
from ..stores.admission import warm_up
from ..stores.base import Store
from ..stores.cache import CachedStore, VerifiedCache
from ..stores.filesystem import FilesystemStore
from ..upstream.target import Upstream

if TYPE_CHECKING:
    from ..observe.tracing import Tracing


#: The drivers each backend's extra installs: ``pip install -e '.[s3]'`` in a checkout, ``[postgres]``.
EXTRAS: Final = {"s3": ("aiobotocore", "botocore"), "postgres": ("asyncpg",)}


def needs_extra(extra: str, setting: str) -> None:
    """A one-line start-up error naming the extra when a configured backend's driver is missing."""
    for module in EXTRAS[extra]:
        if importlib.util.find_spec(module) is None:
            raise ProjectionistError(f"{setting} needs the {extra} extra ({module} is not installed): "
                                     f"pip install -e '.[{extra}]' in projectionist's checkout", code=Code.MISSING_EXTRA)


def open_store(config: Config, environ: Mapping[str, str] = os.environ) -> Store:
    """The configured attachment store: ``filesystem`` (embedded default) or ``s3``."""
    if config.store.kind == "s3":
        needs_extra("s3", "store.kind = 's3'")
        from ..stores.s3 import S3Store  # imported on demand: botocore is heavy

        s3 = config.store.s3
        if not s3.bucket:
            raise InvalidRequest("store.kind = 's3' needs store.s3.bucket", code=Code.INVALID_CONFIG)
        access_key, secret_key = config.s3_credentials(environ)
        return S3Store(endpoint=s3.endpoint, bucket=s3.bucket, region=s3.region, prefix=s3.prefix,
                       access_key=access_key, secret_key=secret_key, limits=config.store.limits,
                       read_timeout=config.store.read_timeout, connect_timeout=s3.connect_timeout,
                       lanes=config.store.lanes)
    return FilesystemStore(config.store_path, config.store.limits, read_timeout=config.store.read_timeout,
                           lanes=config.store.lanes)


def open_log(config: Config, environ: Mapping[str, str] = os.environ) -> Log:
    """The configured session log: ``sqlite`` (embedded default) or ``postgres``."""
    if config.log.kind == "postgres":
        needs_extra("postgres", "log.kind = 'postgres'")
        from ..sessionlog.postgres import PostgresLog

        pg = config.log.postgres
        dsn = config.postgres_dsn(environ)
        if not dsn:
            raise InvalidRequest("log.kind = 'postgres' needs log.postgres.dsn or PROJECTIONIST_PG_DSN",
                                 code=Code.INVALID_CONFIG)
        return PostgresLog(dsn, schema=pg.schema, min_size=pg.min_size, max_size=pg.max_size, timeout=pg.timeout)
    return SqliteLog(config.log_path, busy_timeout=config.log.busy_timeout, watch_interval=config.log.watch_interval)


def open_tracing(telemetry: TelemetryConfig) -> Tracing | None:
    """The configured tracer, or None (and no opentelemetry import) when tracing is off."""
    if not telemetry.otlp_endpoint:
        return None
    if not telemetry.otlp_endpoint.startswith(("http://", "https://")):
        raise InvalidRequest("telemetry.otlp_endpoint must be an http(s):// URL", code=Code.INVALID_CONFIG)
    try:
        from ..observe.tracing import Tracing
    except ImportError:
        raise InvalidRequest("telemetry.otlp_endpoint needs the OpenTelemetry packages: "
                             "pip install -e '.[otel]' in projectionist's checkout", code=Code.INVALID_CONFIG) from None
    return Tracing(telemetry.otlp_endpoint, telemetry.service_name)


async def healthz(request: web.Request) -> web.Response:
    """Liveness, open to all: it says nothing but "ok"."""
    return web.json_response({"status": "ok"})


async def metrics(request: web.Request) -> web.StreamResponse:
    """Prometheus text. With client tokens configured it needs the admin token: its labels (the
    models called, the upstreams) are every tenant's. A quiet route: a scrape is not a request
    the gauges and counters should see."""
    services = request.app[SERVICES]
    guard = services.guard
    if guard.clients_required and not guard.is_admin(request.headers):
        if not guard.is_client(request.headers, request.query):
            return error_response(openai_chat, client_unauthorized())
        return error_response(openai_chat, Forbidden("/metrics counts every tenant's calls: it needs the admin token"))
    body, content_type = services.metrics.exposition()
    response = web.Response(body=body)
    response.headers["Content-Type"] = content_type
    return response


async def owned(request: web.Request) -> web.StreamResponse:
    """Any other method or path under a prefix the proxy itself owns: answered here, never
    forwarded (so the admin token can never travel upstream with a typo). On the proxy's
    listener that is ``/admin`` too: the console listens on its own (``[admin] listen``)."""
    context(request).route = "owned"
    request.app[SERVICES].guard.require_client(request.headers, request.query)
    if request.match_info.get("tail") is None:
        raise ProjectionistError(f"{request.method} is not allowed on {request.path}",
                                 code=Code.METHOD_NOT_ALLOWED, status=405)
    raise NotFound("no such route", code=Code.ROUTE_NOT_FOUND)


async def console_elsewhere(request: web.Request) -> web.StreamResponse:
    """``/admin`` and anything under it on the proxy's own listener: the console and the admin API
    listen on theirs (``[admin] listen``), and the answer says where, a 404 ``CONSOLE_NOT_HERE``
    in the client's error format, or for a browser (``Accept: text/html``) a page linking there.
    Never forwarded, and behind the client token like every route of this listener. A path
    that reached this route in another spelling (``/%61dmin``) is no one's typo of the console's
    address: ``owned`` answers it."""
    raw = request.raw_path
    if not (raw == CONSOLE_PREFIX or raw.startswith((CONSOLE_PREFIX + "/", CONSOLE_PREFIX + "?"))):
        return await owned(request)
    ctx = context(request)
    ctx.route, ctx.fmt = "owned", SPEAKS[format_spoken(request.path, request.headers, request.query)]
    services = request.app[SERVICES]
    services.guard.require_client(request.headers, request.query)
    where = services.console_url
    error = NotFound(f"the console and the admin API are not on the proxy's port: they listen on "
                     f"{where.removesuffix(CONSOLE_PATH)} ([admin] listen); the console is {where}",
                     code=Code.CONSOLE_NOT_HERE)
    if "text/html" not in request.headers.get("Accept", ""):
        raise error
    context(request).fields["error_code"] = error.code
    link = html.escape(where, quote=True)
    page = (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>Not here · projectionist</title>'
            f'</head><body><h1>The console is not on this port</h1><p>The console and the admin API listen on '
            f'their own address (<code>[admin] listen</code>): <a href="{link}">{link}</a></p></body></html>\n')
    return web.Response(text=page, status=404, content_type="text/html", headers={
        ERROR_CODE_HEADER: error.code, "Content-Security-Policy": "default-src 'none'",
        "X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"})


#: Any rest of a path, line breaks included (``.*`` would let ``%0a`` fall through to aiohttp's 404).
ANY = r"[\s\S]*"
#: Paths the proxy answers itself; everything under them that no route takes is ``owned``.
#: The console's and the admin API's prefix: on the proxy's listener, ``console_elsewhere`` answers it.
CONSOLE_PREFIX = "/admin"
OWNED_PREFIXES = (CONSOLE_PREFIX, "/v1/attachments")
OWNED_PATHS = ("/healthz", "/readyz", "/metrics", *OWNED_PREFIXES)
#: Routes the middleware leaves alone: no request context, no count, no log line.
QUIET = frozenset({"healthz", "readyz", "metrics"})


def create_app(
    config: Config,
    *,
    store: Store | None = None,
    log: Log | None = None,
    environ: Mapping[str, str] = os.environ,
) -> web.Application:
    """Build the proxy. ``store``/``log`` default to the configured backends; the app closes
    whatever it holds when it shuts down."""
    upstreams = {
        name: Upstream(name, up.format, up.url.rstrip("/"), config.upstream_key(name, environ),
                       up.connect_timeout, up.read_timeout, up.transport, up.max_connections)
        for name, up in config.upstreams.items()
    }
    store = store if store is not None else open_store(config, environ)
    log = log if log is not None else open_log(config, environ)
    counters = Metrics()
    counters.store_ops, counters.log_round_trips = _ops_of(store), _ops_of(log)
    counters.watch = getattr(log, "watch", None)
    server, record = config.server, config.record
    cached_log = CachedLog(log, config.cache.sessions)
    services = Services(
        config=config,
        store=store,
        reader=CachedStore(store, VerifiedCache(config.cache.max_bytes), counters,  # type: ignore[arg-type]
                           stamp_ttl=config.store.stamp_ttl),
        log=cached_log,
        upstreams=upstreams,
        guard=Guard(config.tenants(environ), config.admin_token(environ),
                    (server.session_header, *server.session_header_aliases)),
        metrics=counters,
        recording=Recording(cached_log, store, record.mode, record.max_response_bytes, counters, record.queue_size,
                            batch_wait=record.batch_wait, image_wait=record.image_batch_wait, hold=record.hold),
        acceptances=Acceptances(),
        inflight=InFlight(),
        tracing=open_tracing(config.telemetry),
    )
    middleware = context_middleware(counters, QUIET)
    app = web.Application(client_max_size=server.client_max_size, middlewares=[middleware],
                          handler_args={"auto_decompress": False})  # pass-through keeps the client's bytes
    app[SERVICES] = services
    app[READINESS] = Readiness({"log": lambda: log.ping(), "store": lambda: store.ping()}, server.ready_timeout)
    app.on_response_prepare.append(note_started)
    app.cleanup_ctx.append(_lifecycle)
    router = app.router
    router.add_post("/v1/attachments", upload, name="attachments.create")
    router.add_post(gemini_files.UPLOAD_ROUTE, gemini_files.upload, name="gemini.upload")  # no client token: see there
    router.add_get("/v1/attachments/{id}", download, name="attachments.get")  # and HEAD
    router.add_get("/healthz", healthz, allow_head=False, name="healthz")
    router.add_get("/readyz", readyz, allow_head=False, name="readyz")
    router.add_get("/metrics", metrics, allow_head=False, name="metrics")
    for path in OWNED_PATHS:
        router.add_route("*", path, console_elsewhere if path == CONSOLE_PREFIX else owned)
    for prefix in OWNED_PREFIXES:
        router.add_route("*", prefix + "/{tail:" + ANY + "}", console_elsewhere if prefix == CONSOLE_PREFIX else owned)
    # plain routes: the same dispatch as the catch-all, found without aiohttp's resolution (``_hot``)
    hot = {path: router.add_route("*", path, dispatch_default) for path in HOT_PATHS}
    router.add_route("*", "/u/{tail:" + ANY + "}", dispatch_named)
    router.add_route("*", "/s/{tail:" + ANY + "}", dispatch_session)
    router.add_route("*", "/{tail:" + ANY + "}", dispatch_default)
    _expecting(router)
    app._handle = _hot(app, hot, middleware)  # type: ignore[method-assign,assignment]  # noqa: SLF001 (see ``_hot``)
    app[ADMIN_APP] = _admin_app(services, counters)
    return app


def _hot(app: web.Application, routes: Mapping[str, web.AbstractRoute],
         middleware: Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]) -> Handler:
    """``app``'s request handler (what aiohttp's server calls with each request): a request whose
    raw path is one of ``routes``' own goes to that route's handler through ``middleware``, as
    aiohttp's ``Application._handle`` sends it (the same match, frozen once, the same
    ``on_response_prepare``), without resolving it again; any other request, and one that
    expects a ``100 Continue`` (answered before the middleware), is aiohttp's.

    On a small aiohttp app (one plain route, one middleware, one ``on_response_prepare``
    receiver) the resolution cost 12 us a request of 60."""
    general = app._handle  # noqa: SLF001
    matches: dict[str, web.UrlMappingMatchInfo] = {}
    for path, route in routes.items():
        match = web.UrlMappingMatchInfo({}, route)
        match.add_app(app)
        match.freeze()
        matches[path] = match

    async def handle(request: web.Request) -> web.StreamResponse:
        match = matches.get(request.rel_url.raw_path)
        if match is None or hdrs.EXPECT in request.headers:
            return await general(request)
        request._match_info = match  # noqa: SLF001 (what ``Application._handle`` sets)
        return await middleware(request, match.handler)

    return handle


def _admin_app(services: Services, counters: Metrics) -> web.Application:
    """The console and the admin API, on their own listener (``[admin] listen``): nothing an
    upstream returns is ever served from their origin. They share the proxy's services."""
    admin = web.Application(client_max_size=services.config.server.client_max_size,
                            middlewares=[context_middleware(counters, QUIET)],
                            handler_args={"auto_decompress": False})  # a body that does not inflate is a 400
    admin[SERVICES] = services
    admin.on_response_prepare.append(note_started)
    router = admin.router
    add_admin_routes(router)
    add_ui_routes(router)
    router.add_get("/healthz", healthz, allow_head=False, name="healthz")
    router.add_get("/metrics", metrics, allow_head=False, name="metrics")
    router.add_route("*", "/{tail:" + ANY + "}", owned)
    _expecting(router)
    return admin


def _expecting(router: web.UrlDispatcher) -> None:
    for route in router.routes():  # aiohttp answers Expect before any middleware: one safe handler for all
        route._expect_handler = expect  # noqa: SLF001 (aiohttp sets it only per add_route call)


async def admin_site(app: web.Application, *, reuse_port: bool = False,
                     on_bound: Callable[[str, int], None] | None = None) -> AsyncIterator[None]:
    """A ``cleanup_ctx`` that serves ``app``'s console and admin API on ``[admin] listen`` for
    the proxy's life; ``on_bound(host, port)`` once it listens."""
    services = app[SERVICES]
    host, port = services.config.admin_address
    runner = web.AppRunner(app[ADMIN_APP], handle_signals=False, access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_port=reuse_port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise AdminListenError(f"cannot listen on {host}:{port} for the console ([admin] listen): "
                               f"{exc.strerror or exc}", code=Code.LISTEN_FAILED) from None
    server = site._server  # noqa: SLF001 (aiohttp keeps the bound sockets there)
    sockets = getattr(server, "sockets", None) or ()
    bound = sockets[0].getsockname()[1] if sockets else port
    services.console_url = listen_url(host, bound) + CONSOLE_PATH
    if on_bound is not None:
        on_bound(host, bound)
    try:
        yield
    finally:
        await runner.cleanup()


class AdminListenError(ProjectionistError):
    """The console's listener cannot be bound."""

    default_code = Code.LISTEN_FAILED


async def expect(request: web.Request) -> web.StreamResponse | None:
    """``Expect: 100-continue`` as aiohttp answers it; any other value a plain 417. aiohttp's own
    handler echoed the value into its answer and crashed (a 500) on one that is not UTF-8."""
    if request.headers.get("Expect", "").strip().lower() == "100-continue":
        if request.version == HttpVersion11:
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            request.writer.output_size = 0
        return None
    spoken = SPEAKS[format_spoken(request.path, request.headers, request.query)]
    # answered before the middleware: its request line is written here
    request_line({"method": request.method, "path": request.rel_url.raw_path, "route": "expect", "status": 417,
                  "error_code": Code.EXPECTATION_FAILED})
    return error_response(spoken, ProjectionistError("only Expect: 100-continue is understood",
                                                     code=Code.EXPECTATION_FAILED))


def _ops_of(backend: object) -> OpCounter:
    """The operations counter a backend keeps of what it sends to its service (a fresh, idle
    one for a backend that keeps none, such as a test double)."""
    found = getattr(backend, "ops", None)
    return found if isinstance(found, OpCounter) else OpCounter()


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    services = app[SERVICES]
    await services.log.start()  # PostgreSQL: pool and schema now, or on first use if the database is down
    start = getattr(services.store, "start", None)  # the store's threads or client (a test double has none)
    if start is not None:
        try:
            await start()
        except Exception as exc:  # a saving, not a check: readiness names a store that cannot work
            get_logger().warning("store_warm_up_failed", error=type(exc).__name__)
    warm_up()  # Pillow's plugins: start-up pays for them, not the first request
    record = services.config.record  # retention: a task of the app's life, not one a request left behind
    pruning = asyncio.create_task(keep_pruning(services.log, record.keep_days, record.prune_every)) \
        if record.keep_days > 0 else None
    for upstream in services.upstreams.values():
        upstream.client = upstream.open_transport()
    try:
        yield
    finally:
        if pruning is not None:
            pruning.cancel()
            await asyncio.gather(pruning, return_exceptions=True)
        for upstream in services.upstreams.values():
            if upstream.client is not None:
                await upstream.client.aclose()
                upstream.client = None
        await app[READINESS].close()
        await services.close_background()
        await services.recording.close()  # what is queued is written before the log closes
        await services.variants.close()
        await services.reader.close()
        await services.store.close()
        await services.log.close()
        if services.tracing is not None:  # the last spans go out (blocking I/O: off the loop)
            await asyncio.to_thread(services.tracing.close)
