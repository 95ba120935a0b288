"""Configuration: one frozen msgspec Struct loaded from TOML, unknown keys rejected (proxy layer).

``config/projectionist.toml`` documents every key with its default. Secrets may sit in the file,
but the environment wins: ``PROJECTIONIST_ADMIN_TOKEN``, the client tokens named by
``server.client_tokens_env`` and each upstream's ``api_key_env``. Every mistake (a TOML syntax
error, a missing file, an unknown key, a wrong type, a value out of range) is one
``INVALID_CONFIG`` error whose message names it.
"""

from __future__ import annotations

import hashlib
import os
import re
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Final, Literal

import msgspec
from yarl import URL

from ..adapters.registry import FORMATS
from ..policy.errors import Code, InvalidRequest
from ..policy.model import is_tenant
from .config_explain import explain

#: An upstream format: one the adapters' registry holds (``adapters.registry.FORMATS``), checked
#: when the config is loaded (``check_formats``), so a format added there is one here.
Format = str

MiB = 1024 * 1024
#: Value constraints: a size of at least one byte, a count that may be zero, a positive duration.
Size = Annotated[int, msgspec.Meta(ge=1)]
Count = Annotated[int, msgspec.Meta(ge=0)]
Seconds = Annotated[float, msgspec.Meta(gt=0)]
#: Upstream names: what may follow ``/u/``, literally (never percent-encoded).
NAME_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def split_tokens(value: str) -> frozenset[str]:
    """Tokens from an environment value: separated by commas or whitespace."""
    return frozenset(t for t in value.replace(",", " ").split() if t)


def base_url(configured: str) -> URL:
    """A configured upstream URL, parsed: ``http(s)://host[:port][/path]``, no query or fragment.
    The only source of the scheme, host and port of requests to that upstream."""
    try:
        url = URL(configured)
        valid = url.scheme in ("http", "https") and bool(url.raw_host) and url.explicit_port != 0
    except ValueError:
        valid = False
    if not valid:
        raise InvalidRequest("upstream url must be http(s)://host[:port][/path]", code=Code.INVALID_CONFIG)
    if url.raw_query_string or url.raw_fragment:
        raise InvalidRequest("upstream url must not have a query or fragment", code=Code.INVALID_CONFIG)
    return url


#: Listen addresses that mean every interface: a browser reaches them on this machine as localhost.
WILDCARDS: Final = frozenset({"", "0.0.0.0", "::"})


def listen_url(host: str, port: int) -> str:
    """The ``http://`` URL a browser on this machine opens for a listen address (an IPv6 host in
    brackets, every interface as localhost)."""
    host = "localhost" if host in WILDCARDS else host
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class ImageLimits(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    max_bytes: Size = 20 * MiB
    max_pixels: Size = 32 * MiB
    max_side: Size = 8192


class ServerConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    host: str = "127.0.0.1"
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 8787
    data_dir: str = ".projectionist"
    client_max_size: Size = 64 * MiB
    session_header: str = "X-Session-Id"
    session_header_aliases: tuple[str, ...] = ()
    #: A request that names no session gets the one its client already sends (Claude Code's,
    #: Codex's, a gateway's session header or body field), or, when it carries images, one derived
    #: from its conversation's opening (``proxy/http/sessions.py``). Off: such a request is sessionless.
    client_sessions: bool = True
    sessionless: Literal["fail", "placeholder"] = "fail"
    admin_token: str = ""
    client_tokens_env: str = "PROJECTIONIST_CLIENT_TOKENS"
    #: Client tokens grouped into named tenants: ``tenant:token`` entries (commas or whitespace
    #: between them). A token of ``client_tokens_env`` is a tenant of its own (``key-`` + digest).
    tenant_tokens_env: str = "PROJECTIONIST_TENANT_TOKENS"
    event_loop: Literal["auto", "asyncio", "uvloop"] = "auto"
    shutdown_grace: Seconds = 10.0
    workers: Annotated[int, msgspec.Meta(ge=1, le=64)] = 1
    ready_timeout: Seconds = 2.0
    #: Seconds a client may leave one chunk of a streamed answer unread; past it its connection
    #: is closed (a cut stream), so a client that stops reading never holds an upstream connection.
    write_timeout: Seconds = 60.0
    #: The largest WebSocket message relayed, either way, in bytes (images travel inlined as
    #: base64): a bigger one closes the socket (1009).
    websocket_max_message: Size = 64 * MiB
    #: Seconds a relayed WebSocket may pass no message either way while no response is in flight
    #: (one in flight has its upstream's read_timeout), and seconds it may stay open at all.
    websocket_idle_timeout: Seconds = 600.0
    websocket_timeout: Seconds = 3600.0
    #: Seconds between pings on both legs of a relayed WebSocket; a leg whose pong does not come
    #: within half of it is closed.
    websocket_heartbeat: Seconds = 30.0
    #: Where clients reach this proxy (``http(s)://host[:port][/path]``); '' is the listen address.
    public_url: str = ""
    #: Bytes the requests under way may hold at once, per process: bodies (and what they decode
    #: to), the bodies built from them, WebSocket messages (``proxy/inbound/budget.py``). Past it
    #: a request is 503 ``MEMORY_BUSY``. At least twice the larger of ``client_max_size`` and
    #: ``websocket_max_message`` (one request's body and what it decodes to).
    memory_budget: Size = 1024 * MiB
    #: Seconds a client may send no byte of a body the proxy reads (a projected call's, an
    #: upload's); past it the request is 408 ``BODY_TIMEOUT`` and its bytes are given back.
    body_timeout: Seconds = 60.0


class S3Config(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    endpoint: str = ""
    bucket: str = ""
    region: str = "us-east-1"
    prefix: str = ""
    access_key_id: str = ""
    secret_access_key: str = ""
    connect_timeout: Seconds = 5.0


class LanesConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Separate, bounded capacity for each kind of store work (see ``stores.lanes``)."""

    reads: Size = 8
    stamps: Size = 4
    writes: Size = 4
    queue_timeout: Seconds = 2.0
    stamp_timeout: Seconds = 5.0
    write_timeout: Seconds = 30.0
    #: A filesystem read or stamp check still running after this many seconds gives its place back
    #: (the lane starts a thread for it, within 4x its size): what hangs costs only itself.
    slow_after: Seconds = 1.0


class StoreConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    kind: Literal["filesystem", "s3"] = "filesystem"
    path: str = ""
    read_timeout: Seconds = 30.0
    #: Seconds a confirmed stamp of a cached object stays trusted (0: check on every hit).
    stamp_ttl: Annotated[float, msgspec.Meta(ge=0)] = 10.0
    limits: ImageLimits = ImageLimits()
    lanes: LanesConfig = LanesConfig()
    s3: S3Config = S3Config()


class PostgresConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    dsn: str = ""
    schema: str = "public"
    min_size: Count = 1
    max_size: Size = 10
    timeout: Seconds = 10.0


class LogConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    kind: Literal["sqlite", "postgres"] = "sqlite"
    path: str = ""
    busy_timeout: Seconds = 30.0
    #: SQLite only: seconds between polls of the state changes (0: none; each request reads its state).
    watch_interval: Annotated[float, msgspec.Meta(ge=0, le=10)] = 0.025
    postgres: PostgresConfig = PostgresConfig()


class UpstreamConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    format: Format
    url: str
    api_key: str = ""
    api_key_env: str = ""
    connect_timeout: Seconds = 10.0
    read_timeout: Seconds = 600.0
    #: The upstream leg's transport: the proxy's own HTTP/1.1 client, or the aiohttp reference.
    transport: Literal["builtin", "aiohttp"] = "builtin"
    #: Connections to the upstream's origin at most (in use or idle); a call finding all in use
    #: waits for one within connect_timeout.
    max_connections: Annotated[int, msgspec.Meta(ge=1, le=10_000)] = 100


class CacheConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    max_bytes: Count = 128 * MiB
    sessions: Count = 10_000


class RecordConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    mode: Literal["off", "metadata", "full"] = "metadata"
    max_response_bytes: Count = 16 * MiB
    queue_size: Size = 10_000
    #: Seconds the record writer lets records gather before it writes a batch (0: write at once).
    #: Fewer, larger batches cost the event loop less: each one hands the GIL to the log's thread
    #: and back several times.
    batch_wait: Annotated[float, msgspec.Meta(ge=0, le=10)] = 0.5
    #: Seconds at most that a record of a call that carried images waits for its batch: what such
    #: calls proved an upstream accepts is what a refusal's attribution counts, on every replica,
    #: and it waits twice this (or twice ``batch_wait``, when that is shorter) for the other
    #: replicas' records (``call.resend``).
    image_batch_wait: Annotated[float, msgspec.Meta(ge=0, le=10)] = 0.05
    #: Seconds a call's request record waits for the call's outcome, so a call that ends by then
    #: is one row; a longer call's request is written then, its outcome later (0: at once).
    hold: Annotated[float, msgspec.Meta(ge=0, le=3600)] = 30.0
    #: Days a call's records are kept; older ones are pruned to a stand-in of their seq, time and
    #: type (``proxy/sessionlog/retention.py``). State events are kept for good. 0 keeps everything.
    keep_days: Annotated[float, msgspec.Meta(ge=0, le=36500)] = 30.0
    #: Seconds between the server's prunes (the first one a minute after start-up).
    prune_every: Annotated[float, msgspec.Meta(gt=0, le=86400 * 366)] = 3600.0


class PolicyConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Bounds on what one request may ask of the policy."""

    max_references: Size = 1000
    parallel_reads: Size = 8
    retryable_probe_after: Annotated[float, msgspec.Meta(ge=0)] = 300.0
    #: Seconds a refusal shared across a tenant's sessions holds for a session that has not met
    #: it yet (``call.refusals``); past it that session tries the image once more. 0: for ever.
    refusal_reprobe_after: Annotated[float, msgspec.Meta(ge=0)] = 7 * 86400.0
    probe_wait: Seconds = 2.0
    max_projected_bytes: Size = 64 * MiB
    #: Variants rendered at once (CPU; a render at the pixel limits can hold hundreds of MB).
    variant_threads: Size = 2
    #: Seconds one render may take; a render that takes longer sends the original this time.
    variant_timeout: Seconds = 60.0
    #: Give the images clients inline themselves (base64) their identity, so a refusal of one is
    #: recorded and later requests get its placeholder instead of it.
    inline_images: bool = True
    #: The base64 of client-inlined images kept to find their identity again without hashing.
    inline_cache_bytes: Size = 64 * MiB
    #: Fit every image a client inlined to the upstream's limits before the call, as references
    #: are: one that breaks them goes as a pinned variant, one labelled with another type than it
    #: is goes under its true type, and bytes that are no image get their placeholder at once.
    fit_images: bool = True
    #: Give the images the provider fetches by URL (``https://``) the identity of their URL, so an
    #: answer that could not fetch one is recorded and later requests get its placeholder instead.
    url_images: bool = True


class LoggingConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    level: Literal["debug", "info", "warning", "error"] = "info"
    json: bool = True


class TelemetryConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """OpenTelemetry traces: off ("") or an OTLP/HTTP collector's URL (needs ``projectionist[otel]``)."""

    otlp_endpoint: str = ""
    service_name: str = "projectionist"


def _default_upstreams() -> dict[str, UpstreamConfig]:
    """One upstream per format that has a default base URL, named after its format."""
    return {name: UpstreamConfig(name, facts.url) for name, facts in FORMATS.items() if facts.url}


class AdminConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The console and the admin API: a listener of their own, never the proxy's origin."""

    #: ``host:port`` (``[::1]:8788`` for IPv6), or ``auto``: loopback, on the proxy's port + 1
    #: (any free port when the proxy's port is 0).
    listen: str = "auto"


#: Where the console's pages start on its listener.
CONSOLE_PATH: Final = "/admin/ui"
_LISTEN: Final = re.compile(r"(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):(?P<port>[0-9]{1,5})")


class Config(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    server: ServerConfig = ServerConfig()
    admin: AdminConfig = AdminConfig()
    store: StoreConfig = StoreConfig()
    log: LogConfig = LogConfig()
    upstreams: dict[str, UpstreamConfig] = msgspec.field(default_factory=_default_upstreams)
    logging: LoggingConfig = LoggingConfig()
    cache: CacheConfig = CacheConfig()
    record: RecordConfig = RecordConfig()
    policy: PolicyConfig = PolicyConfig()
    telemetry: TelemetryConfig = TelemetryConfig()

    @property
    def data_dir(self) -> Path:
        return Path(self.server.data_dir)

    @property
    def admin_address(self) -> tuple[str, int]:
        """Where the console and the admin API listen (``[admin] listen``)."""
        listen = self.admin.listen
        if listen == "auto":
            port = self.server.port
            return "127.0.0.1", port + 1 if 0 < port < 65535 else 0
        match = _LISTEN.fullmatch(listen)
        if match is None or int(match["port"]) > 65535:
            raise InvalidRequest(f"admin.listen must be host:port or auto, not {listen[:80]!r}", code=Code.INVALID_CONFIG)
        return match["host"].strip("[]"), int(match["port"])

    @property
    def console_url(self) -> str:
        """The console's page as configured (``[admin] listen``; before the bind, an ``auto`` of
        port 0 says port 0)."""
        return listen_url(*self.admin_address) + CONSOLE_PATH

    @property
    def store_path(self) -> Path:
        return Path(self.store.path) if self.store.path else self.data_dir / "attachments"

    @property
    def log_path(self) -> Path:
        return Path(self.log.path) if self.log.path else self.data_dir / "sessions.sqlite3"

    @property
    def public_url(self) -> str:
        """The base of the HTTP form of references (``{public_url}/v1/attachments/<id>``), without
        a trailing slash: ``server.public_url`` as ``check_public_url`` normalised it, else the
        listen address (an IPv6 host in brackets; no host is all interfaces, reached as localhost)."""
        if self.server.public_url:
            return self.server.public_url
        host = self.server.host or "localhost"
        return f"http://[{host}]:{self.server.port}" if ":" in host else f"http://{host}:{self.server.port}"

    def upstream_key(self, name: str, environ: Mapping[str, str] = os.environ) -> str:
        """The configured key for upstream ``name`` ('' means: forward the client's own)."""
        upstream = self.upstreams[name]
        if upstream.api_key_env and environ.get(upstream.api_key_env):
            return environ[upstream.api_key_env]
        return upstream.api_key

    def postgres_dsn(self, environ: Mapping[str, str] = os.environ) -> str:
        return environ.get("PROJECTIONIST_PG_DSN") or self.log.postgres.dsn

    def s3_credentials(self, environ: Mapping[str, str] = os.environ) -> tuple[str, str]:
        s3 = self.store.s3
        return (environ.get("AWS_ACCESS_KEY_ID") or s3.access_key_id,
                environ.get("AWS_SECRET_ACCESS_KEY") or s3.secret_access_key)

    def admin_token(self, environ: Mapping[str, str] = os.environ) -> str:
        return environ.get("PROJECTIONIST_ADMIN_TOKEN") or self.server.admin_token

    def client_tokens(self, environ: Mapping[str, str] = os.environ) -> frozenset[str]:
        """Client tokens from ``server.client_tokens_env`` and ``server.tenant_tokens_env``;
        empty means every client is let in."""
        return frozenset(self.tenants(environ))

    def tenants(self, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
        """Each client token's tenant: its name in ``server.tenant_tokens_env`` (``tenant:token``),
        or, for a token of ``server.client_tokens_env``, ``key-`` and 12 hex of its digest (so a
        token is a tenant of its own, and its name says nothing of it). A malformed entry, or a
        token given to two tenants, is an ``INVALID_CONFIG``."""
        found: dict[str, str] = {}
        server = self.server
        for token in split_tokens(environ.get(server.client_tokens_env, "")) if server.client_tokens_env else ():
            found[token] = "key-" + hashlib.sha256(token.encode()).hexdigest()[:12]
        entries = environ.get(server.tenant_tokens_env, "") if server.tenant_tokens_env else ""
        for number, entry in enumerate(entries.replace(",", " ").split(), 1):
            tenant, _, token = entry.partition(":")
            where = f"${server.tenant_tokens_env}"
            if not is_tenant(tenant) or not token:
                raise InvalidRequest(f"{where}: each entry is tenant:token, the tenant 1-64 of a-z, 0-9, _ and - "
                                     f"(entry {number} is not)", code=Code.INVALID_CONFIG)
            if found.get(token, tenant) != tenant:
                raise InvalidRequest(f"{where}: one token is given to two tenants", code=Code.INVALID_CONFIG)
            found[token] = tenant
        return found


#: The command-line flag behind each dotted override the CLI passes (an error names the flag).
FLAGS: Final = {"server.port": "--port", "server.host": "--host", "server.data_dir": "--data-dir",
                "admin.listen": "--admin-listen",
                "server.admin_token": "--admin-token", "server.workers": "--workers"}


def load_config(path: str | Path | None = None, **overrides: object) -> Config:
    """Load ``path`` (or the defaults), then apply dotted overrides like ``server.port=8080``."""
    raw: dict[str, object] = {}
    if path is not None:
        try:
            with open(path, "rb") as f:
                raw = tomllib.load(f)
        except OSError as exc:
            raise InvalidRequest(f"cannot read config file {str(path)!r}: {exc.strerror}", code=Code.INVALID_CONFIG) from None
        except tomllib.TOMLDecodeError as exc:
            raise InvalidRequest(f"{path}: TOML syntax error: {exc}", code=Code.INVALID_CONFIG) from None
        except UnicodeDecodeError:
            raise InvalidRequest(f"{path}: not UTF-8 text", code=Code.INVALID_CONFIG) from None
    for dotted, value in overrides.items():
        if value is None:
            continue
        node = raw
        *parents, leaf = dotted.split(".")
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise InvalidRequest(f"invalid configuration: {part!r} must be a table", code=Code.INVALID_CONFIG)
            node = child
        node[leaf] = value
    try:
        config = msgspec.convert(raw, Config)
    except msgspec.ValidationError as exc:
        flags = {k: v for k, v in FLAGS.items() if overrides.get(k) is not None}
        raise InvalidRequest(explain(exc, Config, path=path, flags=flags), code=Code.INVALID_CONFIG) from None
    check_formats(config, path)
    config = msgspec.structs.replace(config, upstreams={**_default_upstreams(), **config.upstreams})
    check_upstreams(config)
    check_budget(config.server)
    config.admin_address  # noqa: B018 (a malformed admin.listen is an error now, not at the bind)
    if config.server.public_url:
        server = msgspec.structs.replace(config.server, public_url=check_public_url(config.server.public_url))
        config = msgspec.structs.replace(config, server=server)
    return config


def check_public_url(configured: str) -> str:
    """``server.public_url`` as clients will spell it back: ``http(s)://host[:port][/path]``, no
    credentials, query or fragment; scheme and host in lowercase, a default port dropped (as URL
    libraries that validate image URLs write it), no trailing slash."""
    try:
        url = base_url(configured)
    except InvalidRequest:
        raise InvalidRequest("server.public_url must be http(s)://host[:port][/path]", code=Code.INVALID_CONFIG) from None
    if url.raw_user is not None or url.raw_password is not None:
        raise InvalidRequest("server.public_url must not hold credentials", code=Code.INVALID_CONFIG)
    return str(url).rstrip("/")


def check_budget(server: ServerConfig) -> None:
    """The memory budget holds the largest request there may be: its body and what it decodes to."""
    largest = max(server.client_max_size, server.websocket_max_message)
    if server.memory_budget < 2 * largest:
        raise InvalidRequest(f"server.memory_budget ({server.memory_budget} bytes) must be at least twice the larger "
                             f"of client_max_size and websocket_max_message ({2 * largest} bytes)",
                             code=Code.INVALID_CONFIG)


def check_formats(config: Config, path: str | Path | None = None) -> None:
    """Every upstream names a format of the registry: said as msgspec says a value outside a
    fixed set (``explain``: where, which key, the valid values)."""
    for upstream in config.upstreams.values():
        if upstream.format not in FORMATS:
            said = msgspec.ValidationError(f"Invalid enum value {upstream.format!r}; valid values: "
                                           f"{', '.join(map(repr, FORMATS))} - at `$.upstreams[...].format`")
            raise InvalidRequest(explain(said, Config, path=path), code=Code.INVALID_CONFIG)


def check_upstreams(config: Config) -> None:
    """Every upstream has a name that can follow ``/u/`` and a base URL that parses."""
    for name, upstream in config.upstreams.items():
        if NAME_RE.fullmatch(name) is None:
            raise InvalidRequest(f"upstream name {name!r}: use 1-64 of [A-Za-z0-9_.-]", code=Code.INVALID_CONFIG)
        try:
            base_url(upstream.url)
        except InvalidRequest as error:
            raise InvalidRequest(f"upstream {name!r}: {error.message}", code=Code.INVALID_CONFIG) from None


def parse_upstream_spec(spec: str) -> tuple[str, Format | None, str]:
    """``NAME=URL`` (override a base URL) or ``NAME=FORMAT:URL`` (declare a named upstream)."""
    name, sep, rest = spec.partition("=")
    fmt: str | None = None
    if not rest.startswith(("http://", "https://")):
        fmt, _, rest = rest.partition(":")
    if not sep or not name or not rest.startswith(("http://", "https://")) or (fmt is not None and fmt not in FORMATS):
        shown = spec.partition("=")[0] + "=..." if "@" in spec else spec  # never echo a URL's password
        raise InvalidRequest(
            f"--upstream {shown!r}: expected NAME=URL or NAME=FORMAT:URL with FORMAT one of {', '.join(FORMATS)}",
            code=Code.INVALID_CONFIG,
        )
    return name, fmt, rest


def with_upstreams(config: Config, specs: Iterable[tuple[str, Format | None, str]]) -> Config:
    """Apply ``--upstream`` declarations: a known name keeps its format unless one is given; a new
    name needs a format (the default upstreams are named after their formats)."""
    upstreams = dict(config.upstreams)
    for name, fmt, url in specs:
        current = upstreams.get(name)
        if current is None and fmt is None:
            if name not in FORMATS:
                raise InvalidRequest(f"upstream {name!r} needs a format: {name}=FORMAT:URL", code=Code.INVALID_CONFIG)
            fmt = name
        if current is None:
            upstreams[name] = UpstreamConfig(fmt, url.rstrip("/"))  # type: ignore[arg-type]
        else:
            upstreams[name] = msgspec.structs.replace(current, url=url.rstrip("/"), format=fmt or current.format)
    config = msgspec.structs.replace(config, upstreams=upstreams)
    check_upstreams(config)
    return config


def with_upstream_urls(config: Config, urls: Mapping[str, str]) -> Config:
    """Override base URLs of upstreams by name (``--upstream openai=http://...``)."""
    return with_upstreams(config, [(name, None, url) for name, url in urls.items()])
