"""The application factory: ``create_app(config) -> web.Application`` (proxy layer).

Wires routes to adapters, opens the store and log, and keeps one ``ClientSession`` per upstream
for the app's life (``cleanup_ctx``). Run it with ``handler_cancellation=True`` (the CLI and
``run_app`` helper here do) so a client disconnect cancels in-flight reads.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Mapping

from aiohttp import web

from projectionist.adapters import openai_chat
from projectionist.policy.errors import InvalidRequest, NotFound, ProjectionistError
from projectionist.proxy.http.admin import add_admin_routes
from projectionist.proxy.http.auth import Guard, client_unauthorized
from projectionist.proxy.stores.cache import CachedStore, VerifiedCache
from projectionist.proxy.observe.metrics import Metrics
from projectionist.proxy.config import Config
from projectionist.proxy.stores.filesystem import FilesystemStore
from projectionist.proxy.upstream.relay import new_session
from projectionist.proxy.http.routing import HOT_PATHS, dispatch_default, dispatch_named
from projectionist.proxy.sessionlog.sqlite import SqliteLog
from projectionist.proxy.http.sessions import StateCache
from projectionist.proxy.http.services import APP, AppState, Log, Store, Upstream
from projectionist.proxy.http.uploads import upload
from projectionist.proxy.http.middleware import endpoint, error_response


def open_store(config: Config, environ: Mapping[str, str] = os.environ) -> Store:
    """The configured attachment store: ``filesystem`` (embedded default) or ``s3``."""
    if config.store.kind == "s3":
        from projectionist.proxy.stores.s3 import S3Store  # imported on demand: botocore is heavy

        s3 = config.store.s3
        if not s3.bucket:
            raise InvalidRequest("store.kind = 's3' needs store.s3.bucket", code="INVALID_CONFIG")
        access_key, secret_key = config.s3_credentials(environ)
        return S3Store(endpoint=s3.endpoint, bucket=s3.bucket, region=s3.region, prefix=s3.prefix,
                       access_key=access_key, secret_key=secret_key, limits=config.store.limits,
                       read_timeout=config.store.read_timeout, connect_timeout=s3.connect_timeout)
    return FilesystemStore(config.store_path, config.store.limits, read_timeout=config.store.read_timeout)


def open_log(config: Config, environ: Mapping[str, str] = os.environ) -> Log:
    """The configured session log: ``sqlite`` (embedded default) or ``postgres``."""
    if config.log.kind == "postgres":
        from projectionist.proxy.sessionlog.postgres import PostgresLog

        pg = config.log.postgres
        dsn = config.postgres_dsn(environ)
        if not dsn:
            raise InvalidRequest("log.kind = 'postgres' needs log.postgres.dsn or PROJECTIONIST_PG_DSN",
                                 code="INVALID_CONFIG")
        return PostgresLog(dsn, schema=pg.schema, min_size=pg.min_size, max_size=pg.max_size, timeout=pg.timeout)
    return SqliteLog(config.log_path, busy_timeout=config.log.busy_timeout)


async def healthz(request: web.Request) -> web.Response:
    """Liveness, open to all: it says nothing but "ok"."""
    return web.json_response({"status": "ok"})


async def metrics(request: web.Request) -> web.StreamResponse:
    """Prometheus text; a client token (or the admin token) when client tokens are configured.
    Not an ``endpoint``: a scrape is not a request the gauges and counters should see."""
    app = request.app[APP]
    if not app.guard.is_client(request.headers, request.query):
        return error_response(openai_chat, client_unauthorized())
    return app.metrics.render()


@endpoint(openai_chat, "owned")
async def owned(request: web.Request) -> web.StreamResponse:
    """Any other method or path under a prefix the proxy itself owns: answered here, never
    forwarded (so the admin token can never travel upstream with a typo)."""
    request.app[APP].guard.require_client(request.headers, request.query)
    if request.match_info.get("tail") is None:
        raise ProjectionistError(f"{request.method} is not allowed on {request.path}",
                                 code="METHOD_NOT_ALLOWED", status=405)
    raise NotFound("no such route", code="ROUTE_NOT_FOUND")


#: Any rest of a path, line breaks included (``.*`` would let ``%0a`` fall through to aiohttp's 404).
ANY = r"[\s\S]*"
#: Paths the proxy answers itself; everything under them that no route takes is ``owned``.
OWNED_PREFIXES = ("/admin", "/v1/attachments")
OWNED_PATHS = ("/healthz", "/metrics", *OWNED_PREFIXES)


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
                       up.connect_timeout, up.read_timeout)
        for name, up in config.upstreams.items()
    }
    store = store if store is not None else open_store(config, environ)
    counters = Metrics()
    state = AppState(
        config=config,
        store=store,
        reader=CachedStore(store, VerifiedCache(config.cache.max_bytes), counters),  # type: ignore[arg-type]
        log=log if log is not None else open_log(config, environ),
        upstreams=upstreams,
        guard=Guard(config.client_tokens(environ), config.admin_token(environ)),
        states=StateCache(config.cache.sessions),
        metrics=counters,
    )
    app = web.Application(client_max_size=config.server.client_max_size)
    app[APP] = state
    app.cleanup_ctx.append(_lifecycle)
    router = app.router
    router.add_post("/v1/attachments", upload)
    add_admin_routes(router)
    router.add_get("/healthz", healthz, allow_head=False)
    router.add_get("/metrics", metrics, allow_head=False)
    for path in OWNED_PATHS:
        router.add_route("*", path, owned)
    for prefix in OWNED_PREFIXES:
        router.add_route("*", prefix + "/{tail:" + ANY + "}", owned)
    for path in HOT_PATHS:  # plain routes resolve by one dict lookup; same dispatch as the catch-all
        router.add_route("*", path, dispatch_default)
    router.add_route("*", "/u/{tail:" + ANY + "}", dispatch_named)
    router.add_route("*", "/{tail:" + ANY + "}", dispatch_default)
    return app


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    state = app[APP]
    await state.log.start()  # PostgreSQL: pool and schema now, or on first use if the database is down
    for upstream in state.upstreams.values():
        upstream.client = new_session(upstream.connect_timeout, upstream.read_timeout)
    try:
        yield
    finally:
        if state.tasks:
            await asyncio.gather(*state.tasks, return_exceptions=True)
        for upstream in state.upstreams.values():
            if upstream.client is not None:
                await upstream.client.close()
                upstream.client = None
        await state.store.close()
        await state.log.close()
