"""The ``projectionist`` command: serve, demo, and the admin verbs events|quarantine|recover|fork (proxy layer).

Admin verbs work directly on the configured store and log (the log's conditional append makes
that safe next to a running server), so they need no token and no running proxy.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import gc
import ipaddress
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import msgspec
from aiohttp import web

from projectionist.policy.errors import InvalidRequest, ProjectionistError
from projectionist.policy.model import check_id, check_session_id
from projectionist.policy.projection import recover, refresh
from projectionist.proxy.http.admin import events_view, quarantine_view
from projectionist.proxy.http.app import create_app, open_log, open_store
from projectionist.proxy.config import Config, Format, load_config, parse_upstream_spec, with_upstreams
from projectionist.proxy.ops.demo import DemoFailed, run_demo, write_snapshot
from projectionist.proxy.upstream.replay import rebuild, send_and_compare
from projectionist.proxy.observe.logger import get_logger, setup_logging
from projectionist.proxy.sessionlog.base import Log
from projectionist.proxy.stores.base import Store
from projectionist.proxy.observe.logger import redact_url

T = TypeVar("T")


def _parse_upstream(value: str) -> tuple[str, Format | None, str]:
    try:
        return parse_upstream_spec(value)
    except ProjectionistError as error:
        raise argparse.ArgumentTypeError(error.message) from None


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="TOML config file (see config/projectionist.toml)")
    parser.add_argument("--data-dir", help="data directory of the embedded store and log")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="projectionist", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the proxy")
    _common(serve)
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument("--admin-token", help="admin bearer token (or PROJECTIONIST_ADMIN_TOKEN)")
    serve.add_argument("--upstream", action="append", type=_parse_upstream, default=[], metavar="NAME=[FORMAT:]URL",
                       help="override an upstream's base URL (openai=http://127.0.0.1:9000) or declare a named "
                            "one (deepseek=openai:https://api.deepseek.com); repeatable")
    serve.add_argument("--insecure-open-proxy", action="store_true",
                       help="serve a non-loopback address with a server-held upstream key and no client tokens "
                            "(anyone who reaches the port spends the key)")
    demo = sub.add_parser("demo", help="play the keyless story of a session surviving bad images")
    demo.add_argument("--json", metavar="FILE", help="write the snapshot as JSON to FILE ('-' for stdout)")
    for verb, helptext in (("events", "print a session's events"), ("quarantine", "print what is quarantined")):
        cmd = sub.add_parser(verb, help=helptext)
        _common(cmd)
        cmd.add_argument("session")
        if verb == "events":
            cmd.add_argument("--after", type=int, default=0, help="only events with seq > AFTER")
    rec = sub.add_parser("recover", help="lift a quarantine after a full verified read")
    _common(rec)
    rec.add_argument("session")
    rec.add_argument("attachment_id")
    replay = sub.add_parser("replay", help="rebuild a recorded call from the log, check its digest, resend it")
    _common(replay)
    replay.add_argument("--session", required=True)
    replay.add_argument("--seq", type=int, help="seq of the request/recorded event (default: the last call)")
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
    fork = sub.add_parser("fork", help="copy a session's log prefix into a new session")
    _common(fork)
    fork.add_argument("session")
    fork.add_argument("new_session")
    fork.add_argument("--at-seq", type=int)
    return parser


def config_from_args(args: argparse.Namespace) -> Config:
    config = load_config(
        args.config,
        **{
            "server.data_dir": args.data_dir,
            "server.host": getattr(args, "host", None),
            "server.port": getattr(args, "port", None),
            "server.admin_token": getattr(args, "admin_token", None),
        },
    )
    return with_upstreams(config, getattr(args, "upstream", []))


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
                             code="EMPTY_DATA_DIR")


def _admin_verb(args: argparse.Namespace, config: Config) -> int:
    session = check_session_id(args.session)
    check_data_dir(config)

    async def events(store: Store, log: Log) -> int:
        _print_json(events_view(session, await log.read(session, args.after)))
        return 0

    async def quarantine(store: Store, log: Log) -> int:
        _print_json(quarantine_view(session, await refresh(log, session)))
        return 0

    async def recover_verb(store: Store, log: Log) -> int:
        result = await recover(check_id(args.attachment_id), store=store, log=log, session_id=session)
        _print_json({"session": session, "attachment_id": args.attachment_id,
                     "recovered": result.event is not None, "event": result.event})
        return 0

    async def fork(store: Store, log: Log) -> int:
        event = await log.fork(session, check_session_id(args.new_session), args.at_seq)
        _print_json({"session": args.new_session, "parent": session, "event": event})
        return 0

    async def replay(store: Store, log: Log) -> int:
        return await replay_verb(args, config, store, log)

    actions = {"events": events, "quarantine": quarantine, "recover": recover_verb, "fork": fork, "replay": replay}
    return asyncio.run(_with_backends(config, actions[args.command]))


async def replay_verb(args: argparse.Namespace, config: Config, store: Store, log: Log) -> int:
    """``projectionist replay``: exit 0 when the rebuilt body matches its record (and, with
    --diff, the new answer matches the recorded one), 3 when it does not."""
    inbound = Path(args.body).read_bytes() if args.body else None
    rebuilt = await rebuild(log, store, args.session, args.seq, inbound)
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


def event_loop(choice: str) -> asyncio.AbstractEventLoop:
    """uvloop when asked for, or when installed and the choice is ``auto``; else asyncio's."""
    if choice != "asyncio":
        try:
            import uvloop
        except ImportError:
            if choice == "uvloop":
                raise InvalidRequest("server.event_loop = 'uvloop' but uvloop is not installed",
                                     code="INVALID_CONFIG") from None
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


async def _trim_memory(app: web.Application) -> AsyncIterator[None]:
    """Hand freed heap pages back to the OS every few seconds (glibc ``malloc_trim``).

    Megabyte-sized image bodies come and go; without this the process keeps their pages, and
    RSS after a burst depends on fragmentation luck. A no-op off glibc."""
    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        yield
        return

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
    """Why ``serve`` must not start as configured, or None: a non-loopback address, an upstream
    with a server-held key, and no client tokens would let anyone spend that key."""
    host = config.server.host
    if is_loopback(host) or config.client_tokens(environ):
        return None
    keyed = [name for name in config.upstreams if config.upstream_key(name, environ)]
    if not keyed:
        return None
    where = f"${config.server.client_tokens_env}" if config.server.client_tokens_env else \
        "server.client_tokens_env is empty"
    return (f"refusing to serve {host or 'all interfaces'}:{config.server.port}: upstream(s) {', '.join(keyed)} "
            f"use a server-held key and no client tokens are set ({where}); "
            "set them, listen on loopback, or pass --insecure-open-proxy")


class StartupError(ProjectionistError):
    """``serve`` cannot start: one line, exit status 2."""

    default_code = "STARTUP_FAILED"


def serve(config: Config, *, insecure_open_proxy: bool = False) -> None:
    """Run the proxy until SIGTERM/SIGINT. Anything that stops it from starting (a data dir it
    cannot use, a log it cannot open, a port it cannot bind) is one ``StartupError``."""
    refusal = open_proxy_refusal(config)
    if refusal and not insecure_open_proxy:
        raise StartupError(refusal, code="OPEN_PROXY_REFUSED")
    limit_malloc_arenas()
    setup_logging(config.logging.level, config.logging.json)
    loop = event_loop(config.server.event_loop)
    asyncio.set_event_loop(loop)
    phase = "starting"

    def listening(_: str) -> None:  # run_app calls this once every socket is bound
        nonlocal phase
        phase = "serving"
        get_logger().info("listening", host=config.server.host, port=config.server.port,
                          loop=type(loop).__module__, data_dir=str(config.data_dir),
                          upstreams={n: redact_url(u.url) for n, u in config.upstreams.items()},
                          client_tokens=bool(config.client_tokens()), open_proxy=bool(refusal))

    async def binding(_: web.Application) -> None:  # after the store and log opened, before the bind
        nonlocal phase
        phase = "binding"

    try:
        app = create_app(config)
        app.cleanup_ctx.append(_trim_memory)
        app.on_startup.append(binding)
        tune_gc()
        web.run_app(app, host=config.server.host, port=config.server.port, handler_cancellation=True,
                    access_log=None, print=listening, loop=loop)
    except (ProjectionistError, OSError) as exc:
        if phase == "serving":
            raise
        raise _startup_error(exc, phase, config) from None


def _startup_error(exc: ProjectionistError | OSError, phase: str, config: Config) -> StartupError:
    if isinstance(exc, ProjectionistError):
        return StartupError(exc.message, code=exc.code)
    if phase == "binding":
        return StartupError(f"cannot listen on {config.server.host}:{config.server.port}: {exc.strerror or exc}",
                            code="LISTEN_FAILED")
    where = f": {exc.filename}" if exc.filename else ""
    return StartupError(f"cannot start: {exc.strerror or type(exc).__name__}{where}", code="STARTUP_FAILED")


#: Codes of mistakes in how projectionist was started (exit status 2, like a usage error).
SETUP_ERRORS = frozenset({"INVALID_CONFIG", "EMPTY_DATA_DIR"})


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "demo":
            setup_logging("warning", json=True)
            snapshot = asyncio.run(run_demo(print if args.json != "-" else _stderr))
            if args.json:
                write_snapshot(snapshot, args.json)
            return 0
        config = config_from_args(args)
        if args.command == "serve":
            serve(config, insecure_open_proxy=args.insecure_open_proxy)
            return 0
        return _admin_verb(args, config)
    except ProjectionistError as error:
        print(f"projectionist: {error.code}: {error.message}", file=sys.stderr)
        return 2 if error.code in SETUP_ERRORS or isinstance(error, StartupError) else 1
    except DemoFailed as failed:
        print(f"projectionist demo: FAILED: {failed}", file=sys.stderr)
        return 1


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
