"""``projectionist serve``: the process around the app, from start-up checks to shutdown (proxy layer).

Refuses to be an open proxy for a server-held key, picks the event loop, tunes malloc and the GC
for a long-lived server, and turns anything that stops the start (a data dir it cannot use, a log
it cannot open, a port it cannot bind) into one ``StartupError`` the CLI prints as one line.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import ipaddress
import os
from functools import partial
from collections.abc import AsyncIterator, Callable, Mapping, Sequence

from aiohttp import web

from ...policy.errors import Code, InvalidRequest, ProjectionistError
from ..config import CONSOLE_PATH, Config, listen_url
from ..edge.app import admin_site, create_app
from ..observe.logger import get_logger, redact_url, setup_logging
from .fake_upstream import MARKER, FakeUpstream, loopback_socket, pointed_at, serving, url_of


def event_loop(choice: str) -> asyncio.AbstractEventLoop:
    """uvloop when asked for, or when installed and the choice is ``auto``; else asyncio's."""
    if choice != "asyncio":
        try:
            import uvloop
        except ImportError:
            if choice == "uvloop":
                raise InvalidRequest("server.event_loop = 'uvloop' but uvloop is not installed",
                                     code=Code.INVALID_CONFIG) from None
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def limit_malloc_arenas(arenas: int = 2) -> None:
    """Cap glibc's malloc arenas (unless ``MALLOC_ARENA_MAX`` says otherwise).

    glibc gives each thread that allocates its own arena and keeps freed memory in it; the store's
    and log's worker threads would otherwise each hold on to buffers of image-sized reads. Measured
    by ``bench --only rss``: RSS after 10,000 mixed requests went from 1.53x to 1.43x idle.
    A no-op off glibc."""
    if os.environ.get("MALLOC_ARENA_MAX"):
        return
    try:
        ctypes.CDLL("libc.so.6").mallopt(-8, arenas)  # -8 is M_ARENA_MAX
    except (OSError, AttributeError):
        pass


#: Allocations below this come from the heap, never from a mmap of their own (glibc
#: ``M_MMAP_THRESHOLD``); and the heap's free top is given back only past ``MALLOC_TRIM_THRESHOLD``
#: (``M_TRIM_THRESHOLD``) between the periodic trims (``_trim_memory``).
MALLOC_MMAP_THRESHOLD = 16 * 1024 * 1024
MALLOC_TRIM_THRESHOLD = 32 * 1024 * 1024


def fix_malloc_thresholds() -> None:
    """Fix glibc's mmap and trim thresholds (unless ``MALLOC_MMAP_THRESHOLD_`` or
    ``MALLOC_TRIM_THRESHOLD_`` say otherwise), so that the periodic trim decides when freed
    pages go back, not each ``free``.

    A cold image request allocates and frees megabytes of short-lived buffers (each image's read,
    its base64 and data URL, the 2.7 MB upstream body). glibc's own thresholds move with what was
    freed last, and runs often settled where each request mapped its buffers afresh or shrank and
    regrew the heap: 240-640 page faults per request against 30-80 with these, and 1.56-1.75x the
    bare proxy's CPU per request against 1.14-1.38x (bench images, projectionist-cold at c=16,
    alternating rounds side by side). Peak RSS was the same within noise (135-151 MB either way,
    the bare proxy 112-125 MB). A no-op off glibc."""
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") or os.environ.get("MALLOC_TRIM_THRESHOLD_"):
        return
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return
    mallopt(-3, MALLOC_MMAP_THRESHOLD)  # -3 is M_MMAP_THRESHOLD
    mallopt(-1, MALLOC_TRIM_THRESHOLD)  # -1 is M_TRIM_THRESHOLD


async def _trim_memory(app: web.Application) -> AsyncIterator[None]:
    """Hand freed heap pages back to the OS every few seconds (glibc ``malloc_trim``), with the
    thresholds fixed so that this is when they go (``fix_malloc_thresholds``).

    Megabyte-sized image bodies come and go; without this the process keeps their pages, and
    RSS after a burst depends on fragmentation luck. A no-op off glibc."""
    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        yield
        return
    fix_malloc_thresholds()

    async def loop() -> None:
        while True:
            await asyncio.sleep(5.0)
            trim(0)

    task = asyncio.get_running_loop().create_task(loop())
    yield
    task.cancel()


#: Young-generation threshold of the cyclic GC while serving (CPython's default is 700).
GC_YOUNG_THRESHOLD = 10_000


def tune_gc() -> None:
    """Freeze the objects made at startup, and collect the young generation less often.

    A request leaves no cyclic garbage behind (its objects die by reference counting), but the
    objects of requests in flight still trip the default threshold of 700 allocations: at c=16
    that was a young collection every ~19 requests, 3.6% of the process's CPU. Measured with the
    1 KB text load pinned to one core: CPU per request 0.197 ms at 700, 0.189 at 7,000 and 0.188
    at 50,000 (the bare proxy: 0.159). Error paths that do make cycles are still collected, just
    in batches of 10,000 objects instead of 700."""
    gc.freeze()  # startup objects never die: keep them out of every later full collection
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name (or "", all interfaces): assume it is reachable from elsewhere


def open_proxy_refusal(config: Config, environ: Mapping[str, str] = os.environ) -> str | None:
    """Why ``serve`` must not start as configured, or None: a non-loopback address and no client
    tokens would let anyone who reaches the port list and read every admitted image and write
    into every session (images and sessions are data), and spend any server-held key."""
    host = config.server.host
    if is_loopback(host) or config.client_tokens(environ):
        return None
    where = f"${config.server.client_tokens_env}" if config.server.client_tokens_env else \
        "server.client_tokens_env is empty"
    keyed = [name for name in config.upstreams if config.upstream_key(name, environ)]
    spend = f", and spend the server-held key of {', '.join(keyed)}" if keyed else ""
    return (f"refusing to serve {host or 'all interfaces'}:{config.server.port} with no client tokens ({where}): "
            f"anyone who reaches it could read every image and session{spend}; "
            "set client tokens, listen on loopback, or pass --insecure-open-proxy")


def unset_keys(config: Config, environ: Mapping[str, str] = os.environ) -> str | None:
    """Why ``serve`` must not start, or None: an upstream's ``api_key_env`` names a variable that
    is not set (and it has no ``api_key``). Started anyway, the proxy would forward each client's
    own key, which its operator did not mean."""
    for name, upstream in config.upstreams.items():
        if upstream.api_key_env and not environ.get(upstream.api_key_env) and not upstream.api_key:
            return (f"upstream {name!r}: api_key_env names ${upstream.api_key_env}, which is not set "
                    "(set it, or remove api_key_env to forward the clients' own keys)")
    return None


class StartupError(ProjectionistError):
    """``serve`` cannot start: one line, exit status 2."""

    default_code = Code.STARTUP_FAILED


def admit_open_proxy(config: Config, insecure_open_proxy: bool) -> bool:
    """Whether ``serve`` runs as an open proxy (only with ``--insecure-open-proxy``): without the
    flag, where ``open_proxy_refusal`` objects, a ``StartupError`` OPEN_PROXY_REFUSED. An
    ``api_key_env`` that names an unset variable is an INVALID_CONFIG first (``unset_keys``)."""
    unset = unset_keys(config)
    if unset:
        raise StartupError(unset, code=Code.INVALID_CONFIG)
    refusal = open_proxy_refusal(config)
    if refusal and not insecure_open_proxy:
        raise StartupError(refusal, code=Code.OPEN_PROXY_REFUSED)
    return bool(refusal)


def listening_fields(config: Config, loop: str, open_proxy: bool) -> dict[str, object]:
    """The fields of the ``listening`` line (also the supervisor's, with ``--workers``)."""
    return {"host": config.server.host, "port": config.server.port, "loop": loop, "data_dir": str(config.data_dir),
            "upstreams": {n: redact_url(u.url) for n, u in config.upstreams.items()},
            "client_tokens": bool(config.client_tokens()), "open_proxy": open_proxy,
            "tenants": len(set(config.tenants().values())),
            "workers": config.server.workers}


def banner(config: Config, console: str, fake: FakeUpstream | None = None, fake_url: str = "") -> list[str]:
    """What ``serve`` tells the person who started it, on stdout (stderr is the JSON log): where
    the proxy and the console are, why the console will refuse them if no admin token is set, and,
    with ``--fake-upstream``, that no answer comes from a model."""
    lines = [f"projectionist serve: the proxy on {listen_url(config.server.host, config.server.port)}"
             f" (the base URL for clients; {config.server.workers} process"
             f"{'es' if config.server.workers > 1 else ''})"]
    if config.admin_token():
        lines.append(f"projectionist serve: the console on {console} (sign in with the admin token)")
    else:
        lines.append(f"projectionist serve: the console on {console}, but no admin token is set, so it answers "
                     "401 ADMIN_UNAUTHORIZED: set PROJECTIONIST_ADMIN_TOKEN (or --admin-token-file) and restart")
    if fake is not None:
        refuses = "every inlined image" if fake.refuse_all else \
            f"every image whose bytes contain {MARKER.decode()!r}"
        lines.append(f"projectionist serve: FAKE UPSTREAM on {fake_url}: every upstream "
                     f"({', '.join(config.upstreams)}) is the built-in fake provider, so answers are canned, not "
                     f"a model's, and no key is needed; it refuses {refuses}")
    return lines


def say(lines: list[str]) -> None:
    """Print to stdout at once (a pipe would otherwise hold the lines until the process ends)."""
    print("\n".join(lines), flush=True)


def serve(config: Config, *, insecure_open_proxy: bool = False, fake: FakeUpstream | None = None) -> None:
    """Run the proxy in this process until SIGTERM/SIGINT. Anything that stops it from starting (a
    data dir it cannot use, a log it cannot open, a port it cannot bind) is one ``StartupError``.
    With ``fake``, that fake provider serves on a loopback port of this process and every upstream
    is sent there, with no key."""
    contexts: list[CleanupCtx] = []
    fake_url = ""
    if fake is not None:
        sock = loopback_socket()
        fake_url = url_of(sock)
        config = pointed_at(config, fake_url)
        contexts.append(serving(fake, sock))
    open_proxy = admit_open_proxy(config, insecure_open_proxy)
    limit_malloc_arenas()
    setup_logging(config.logging.level, config.logging.json)

    def listening(loop: str, admin: str) -> None:
        get_logger().info("listening", **listening_fields(config, loop, open_proxy), admin=admin,
                          **({"fake_upstream": fake_url} if fake else {}))
        host, _, port = admin.rpartition(":")
        say(banner(config, listen_url(host.strip("[]"), int(port)) + CONSOLE_PATH, fake, fake_url))

    run_server(config, listening, contexts=contexts)


CleanupCtx = Callable[[web.Application], AsyncIterator[None]]


def run_server(config: Config, on_listening: Callable[[str, str], None], *, reuse_port: bool = False,
               contexts: Sequence[CleanupCtx] = ()) -> None:
    """Build the app and serve it until SIGTERM/SIGINT; ``on_listening(loop module, the console's
    host:port)`` once every
    socket is bound. A worker of ``--workers`` shares its port (``reuse_port``)."""
    loop = event_loop(config.server.event_loop)
    asyncio.set_event_loop(loop)
    phase = "starting"
    admin = "%s:%d" % config.admin_address

    def admin_bound(host: str, port: int) -> None:
        nonlocal admin
        admin = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def listening(_: str) -> None:  # run_app calls this once every socket is bound
        nonlocal phase
        phase = "serving"
        on_listening(type(loop).__module__, admin)

    async def binding(_: web.Application) -> None:  # after the store and log opened, before the bind
        nonlocal phase
        phase = "binding"

    try:
        app = create_app(config)
        app.cleanup_ctx.append(partial(admin_site, reuse_port=reuse_port, on_bound=admin_bound))
        app.cleanup_ctx.append(_trim_memory)
        app.cleanup_ctx.extend(contexts)
        app.on_startup.append(binding)
        tune_gc()
        web.run_app(app, host=config.server.host, port=config.server.port, handler_cancellation=True,
                    # aiohttp waits this long twice (for handlers, then for them once cancelled)
                    shutdown_timeout=config.server.shutdown_grace / 2, access_log=None, print=listening, loop=loop,
                    reuse_port=reuse_port)
    except (ProjectionistError, OSError) as exc:
        if phase == "serving":
            raise
        raise _startup_error(exc, phase, config) from None


def _startup_error(exc: ProjectionistError | OSError, phase: str, config: Config) -> StartupError:
    if isinstance(exc, ProjectionistError):
        return StartupError(exc.message, code=exc.code)
    if phase == "binding":
        return StartupError(f"cannot listen on {config.server.host}:{config.server.port}: {exc.strerror or exc}",
                            code=Code.LISTEN_FAILED)
    where = f": {exc.filename}" if exc.filename else ""
    return StartupError(f"cannot start: {exc.strerror or type(exc).__name__}{where}", code=Code.STARTUP_FAILED)
