"""Shared fixtures: a recording fake upstream, a config on a temp data dir or on the replicated
backends, a proxy harness.

Modules opt into both backends with
``pytestmark = pytest.mark.parametrize("backend", BACKENDS, indirect=True)`` (every test), or by
importing ``tests.backends.backend_on_both`` (every test that runs the proxy; pure tests once):
``embedded`` is the filesystem store + SQLite log, ``replicated`` a real SeaweedFS S3 bucket +
PostgreSQL schema (on ``PROJECTIONIST_TEST_PG_DSN``, or on a throwaway server that
``tests.backends.pg_dsn()`` starts on first use and ``pytest_unconfigure`` stops).

The fast loop: ``pytest tests/policy tests/adapters`` (or ``-m pure``; ``-m "not pure"`` is the
rest) runs the pure tests only. It stays pure by rule: an item there that uses a fixture starting a
backend or a server (``IMPURE_FIXTURES``, also through other fixtures or ``getfixturevalue``) fails
before that fixture runs, and while it runs no socket may connect or listen and no process may start.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import asyncpg
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from projectionist.proxy.edge.app import create_app, open_log, open_store
from projectionist.proxy.config import Config, load_config, with_upstream_urls
from projectionist.proxy.inbound.services import ADMIN_APP, SERVICES
from projectionist.proxy.stores.filesystem import FilesystemStore
from projectionist.proxy.stores.s3 import S3Store
from tests.backends import BACKENDS, BUCKET, Seaweed, pg_dsn, stop_postgres
from tests.fakes import CountingStore, FakeUpstream
from tests.imaging import make_image

ADMIN = {"Authorization": "Bearer admintok"}

TESTS = Path(__file__).resolve().parent
#: The folders of the fast loop: pure tests, no store, log or server of any kind.
PURE_FOLDERS = ("policy", "adapters")
#: Fixtures that start a backend (SeaweedFS, PostgreSQL) or a server, directly or through others.
IMPURE_FIXTURES = frozenset({
    "seaweed", "backend", "backend_overrides", "upstream", "make_config", "make_harness", "harness",
    "aiohttp_server", "aiohttp_raw_server", "aiohttp_client", "unused_tcp_port", "unused_tcp_port_factory",
})


class ImpureTest(Exception):
    """A test of the fast loop reached for a backend, a server, a socket or a process."""


def is_pure(path: Path) -> bool:
    """Whether a test module belongs to the fast loop (``tests/policy``, ``tests/adapters``)."""
    try:
        parts = Path(path).resolve().relative_to(TESTS).parts
    except ValueError:
        return False
    return len(parts) > 1 and parts[0] in PURE_FOLDERS


def refuse_impure_fixtures(nodeid: str, path: Path, fixturenames: Any) -> None:
    """Fail a pure test whose fixtures (their whole closure) include one that starts a backend or a server."""
    impure = sorted(IMPURE_FIXTURES.intersection(fixturenames)) if is_pure(path) else []
    if impure:
        pytest.fail(f"{nodeid} is in the fast loop ({'/'.join(PURE_FOLDERS)}) but uses {', '.join(impure)}; "
                    "move it to tests/proxy or tests/system", pytrace=False)


@contextlib.contextmanager
def nothing_impure() -> Iterator[None]:
    """No socket connects or listens and no process starts inside the block."""

    def refuse(what: str) -> Callable[..., NoReturn]:
        def refused(*args: object, **kwargs: object) -> NoReturn:
            raise ImpureTest(f"a test of the fast loop tried to {what}")
        return refused

    with pytest.MonkeyPatch.context() as m:
        m.setattr(socket.socket, "connect", refuse("connect a socket"))
        m.setattr(socket.socket, "connect_ex", refuse("connect a socket"))
        m.setattr(socket.socket, "listen", refuse("listen on a socket"))
        m.setattr(subprocess.Popen, "__init__", refuse("start a process"))
        yield


_running: list[pytest.Item] = []  # the test being set up, run or torn down


def refuse_on_the_fly(argname: str) -> None:
    """Refuse a fixture that the running pure test requests late (``request.getfixturevalue``)."""
    if _running and argname in IMPURE_FIXTURES:
        item = _running[0]
        refuse_impure_fixtures(item.nodeid, item.path, [argname])


class _OnTheFlyGuard:
    """``pytest_fixture_setup`` as a plugin of its own: a conftest's hooks only see nodes under its
    folder, and a session-scoped fixture (``seaweed``) is set up for the session node."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_fixture_setup(self, fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest) -> None:
        refuse_on_the_fly(fixturedef.argname)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "pure: in the fast loop (tests/policy, tests/adapters): no backend, no server")
    if not config.pluginmanager.has_plugin("tests-pure-loop-guard"):
        config.pluginmanager.register(_OnTheFlyGuard(), "tests-pure-loop-guard")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if is_pure(item.path):
            item.add_marker(pytest.mark.pure)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _running[:] = [item]
    refuse_impure_fixtures(item.nodeid, item.path, getattr(item, "fixturenames", ()))


def pytest_runtest_logfinish() -> None:
    _running.clear()


@pytest.fixture(autouse=True)
def _pure_tests_stay_pure(request: pytest.FixtureRequest) -> Iterator[None]:
    if not is_pure(request.node.path):
        yield
        return
    with nothing_impure():
        yield


def pytest_unconfigure(config: pytest.Config) -> None:
    """Stop the throwaway PostgreSQL if this session started one (not a configured server)."""
    stop_postgres()


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seaweed]:
    server = Seaweed(tmp_path_factory.mktemp("seaweed"))
    server.start()
    try:
        server.create_bucket(BUCKET)
        yield server
    finally:
        # Its data is thrown away: no need to wait out the ~25 s weed takes to exit on SIGTERM
        # (the default 5 s grace, then SIGKILL, at the end of every pytest-xdist worker).
        server.stop(grace=0.5)


async def drop_schema(schema: str) -> None:
    conn = await asyncpg.connect(pg_dsn())
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    return str(getattr(request, "param", "embedded"))


@contextlib.asynccontextmanager
async def replicated_backend(server: Seaweed) -> AsyncIterator[dict[str, Any]]:
    """Config overrides for the replicated backends: a PostgreSQL schema and an S3 key prefix of
    this test's own, dropped afterwards."""
    schema = f"t_{uuid.uuid4().hex[:16]}"
    try:
        yield {
            "store.kind": "s3",
            "store.s3": {"endpoint": server.endpoint, "bucket": BUCKET, "prefix": f"{schema}/",
                         "access_key_id": "test", "secret_access_key": "test"},
            "log.kind": "postgres",
            "log.postgres": {"dsn": pg_dsn(), "schema": schema},
        }
    finally:
        await drop_schema(schema)


@pytest.fixture
async def backend_overrides(backend: str, request: pytest.FixtureRequest) -> AsyncIterator[dict[str, Any]]:
    """Config overrides selecting the backend (nothing for embedded)."""
    if backend == "embedded":
        yield {}
        return
    async with replicated_backend(request.getfixturevalue("seaweed")) as overrides:
        yield overrides


@pytest.fixture
async def upstream(aiohttp_server: Any) -> FakeUpstream:
    fake = FakeUpstream()
    server = await aiohttp_server(fake.app())
    fake.url = str(server.make_url("")).rstrip("/")
    return fake


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def make_config(data_dir: Path, upstream: FakeUpstream, backend_overrides: dict[str, Any]) -> Callable[..., Config]:
    def make(**overrides: Any) -> Config:
        # stamp_ttl 0: tests damage objects behind the proxy's back and expect the very next request
        # to notice; the staleness window has its own tests (tests/proxy/stores/test_cache.py)
        base = {"server.data_dir": str(data_dir), "server.admin_token": "admintok", "record.mode": "off",
                "store.stamp_ttl": 0, **backend_overrides}
        config = load_config(None, **{**base, **overrides})
        fake = {name: upstream.url for name in ("openai", "anthropic") if f"upstreams.{name}" not in overrides}
        return with_upstream_urls(config, fake)
    return make


class Routed:
    """A proxy's two test clients as one: a path under ``/admin`` goes to the console's own
    listener (``[admin] listen``, a second test server), anything else to the proxy's. ``proxy``
    and ``admin`` are the clients themselves."""

    _VERBS = ("get", "post", "put", "patch", "delete", "head", "options", "request", "ws_connect")

    def __init__(self, proxy: TestClient[Any, Any], admin: TestClient[Any, Any]) -> None:
        self.proxy = proxy
        self.admin = admin

    def _for(self, path: Any) -> TestClient[Any, Any]:
        return self.admin if str(path).startswith("/admin") else self.proxy

    def __getattr__(self, name: str) -> Any:
        if name in Routed._VERBS:
            if name == "request":
                return lambda method, path, *a, **k: self._for(path).request(method, path, *a, **k)
            return lambda path, *a, **k: getattr(self._for(path), name)(path, *a, **k)
        return getattr(self.proxy, name)


async def routed_client(aiohttp_client: Any, app: web.Application, **kwargs: Any) -> Any:
    """The test clients of a proxy app and of its console (``Routed``)."""
    proxy = await aiohttp_client(app, **kwargs)
    admin = await aiohttp_client(app[ADMIN_APP])
    return Routed(proxy, admin)


class Harness:
    """A proxy app on a test server, its counting store and the fake upstream behind it."""

    def __init__(self, client: TestClient[Any, Any], store: CountingStore, upstream: FakeUpstream) -> None:
        self.client = client
        self.store = store
        self.upstream = upstream

    @property
    def app(self) -> web.Application:
        app: web.Application = self.client.server.app  # type: ignore[assignment]
        return app

    async def admit(self, data: bytes | None = None, *, color: int = 0, name: str | None = None) -> str:
        data = data if data is not None else make_image(color=color)
        params = {"name": name} if name else {}
        resp = await self.client.post("/v1/attachments", data=data, params=params,
                                      headers={"Content-Type": "image/png"})
        assert resp.status == 200, await resp.text()
        body = await resp.json()
        return str(body["id"])

    async def chat(self, session: str | None, *refs: str, stream: bool = False, **extra: Any) -> Any:
        parts: list[dict[str, Any]] = [{"type": "text", "text": "look"}]
        parts += [{"type": "image_url", "image_url": {"url": f"attachment:{r}"}} for r in refs]
        body = {"model": "m", "messages": [{"role": "user", "content": parts}], "stream": stream, **extra}
        headers = {"X-Session-Id": session} if session else {}
        return await self.client.post("/v1/chat/completions", json=body, headers=headers)

    async def events(self, session: str) -> list[dict[str, Any]]:
        """The session's events through the admin API; ``[]`` for a session whose log holds none
        (which the API answers 404 ``SESSION_NOT_FOUND``)."""
        resp = await self.client.get(f"/admin/sessions/{session}/events", headers=ADMIN)
        if resp.status == 404 and (await resp.json())["error"]["code"] == "SESSION_NOT_FOUND":
            return []
        assert resp.status == 200, await resp.text()
        events: list[dict[str, Any]] = (await resp.json())["events"]
        return events

    def path_of(self, attachment_id: str) -> Path:
        hexdigest = attachment_id.removeprefix("sha256:")
        return Path(self.app[SERVICES].config.store_path) / "objects" / hexdigest[:2] / hexdigest

    async def corrupt(self, attachment_id: str, data: bytes) -> None:
        """Overwrite an object's bytes behind the store's back, keeping its admission record."""
        inner = self.store.inner
        if isinstance(inner, FilesystemStore):
            self.path_of(attachment_id).write_bytes(data)
            return
        assert isinstance(inner, S3Store)
        client, key = await inner.client(), inner.key(attachment_id.removeprefix("sha256:"))
        head = await client.head_object(Bucket=inner.bucket, Key=key)
        await client.put_object(Bucket=inner.bucket, Key=key, Body=data, Metadata=head["Metadata"])

    async def remove(self, attachment_id: str) -> None:
        """Delete an object behind the store's back."""
        inner = self.store.inner
        if isinstance(inner, FilesystemStore):
            self.path_of(attachment_id).unlink()
            return
        assert isinstance(inner, S3Store)
        await (await inner.client()).delete_object(Bucket=inner.bucket, Key=inner.key(attachment_id.removeprefix("sha256:")))


@pytest.fixture
def make_harness(
    aiohttp_client: Any, make_config: Callable[..., Config], upstream: FakeUpstream
) -> Callable[..., Awaitable[Harness]]:
    async def make(config: Config | None = None, **overrides: Any) -> Harness:
        config = config or make_config(**overrides)
        store = CountingStore(open_store(config))
        client = await routed_client(aiohttp_client, create_app(config, store=store, log=open_log(config)))
        return Harness(client, store, upstream)
    return make


@pytest.fixture
async def harness(make_harness: Callable[..., Awaitable[Harness]]) -> Harness:
    return await make_harness()
