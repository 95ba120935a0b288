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

from policy.errors import InvalidRequest
from proxy.admin import add_admin_routes
from proxy.cache import CachedStore, VerifiedCache
from proxy.metrics import Metrics
from proxy.config import Config
from proxy.fsstore import FilesystemStore
from proxy.relay import new_session
from proxy.routing import HOT_PATHS, dispatch_default, dispatch_named
from proxy.sqlitelog import SqliteLog
from proxy.sessions import StateCache
from proxy.state import APP, AppState, Log, Store, Upstream
from proxy.uploads import upload


def open_store(config: Config, environ: Mapping[str, str] = os.environ) -> Store:
    """The configured attachment store: ``filesystem`` (embedded default) or ``s3``."""
    if config.store.kind == "s3":
        from proxy.s3store import S3Store  # imported on demand: botocore is heavy

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
        from proxy.pglog import PostgresLog

        pg = config.log.postgres
        dsn = config.postgres_dsn(environ)
        if not dsn:
            raise InvalidRequest("log.kind = 'postgres' needs log.postgres.dsn or PROJECTIONIST_PG_DSN",
                                 code="INVALID_CONFIG")
        return PostgresLog(dsn, schema=pg.schema, min_size=pg.min_size, max_size=pg.max_size, timeout=pg.timeout)
    return SqliteLog(config.log_path, busy_timeout=config.log.busy_timeout)


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def metrics(request: web.Request) -> web.Response:
    return request.app[APP].metrics.render()


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
        admin_token=config.admin_token(environ),
        states=StateCache(config.cache.sessions),
        metrics=counters,
    )
    app = web.Application(client_max_size=config.server.client_max_size)
    app[APP] = state
    app.cleanup_ctx.append(_lifecycle)
    router = app.router
    router.add_post("/v1/attachments", upload)
    add_admin_routes(router)
    router.add_get("/healthz", healthz)
    router.add_get("/metrics", metrics)
    for path in HOT_PATHS:  # plain routes resolve by one dict lookup; same dispatch as the catch-all
        router.add_route("*", path, dispatch_default)
    router.add_route("*", "/u/{name}/{tail:.*}", dispatch_named)
    router.add_route("*", "/{tail:.*}", dispatch_default)
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
