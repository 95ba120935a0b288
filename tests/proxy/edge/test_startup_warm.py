"""Start-up pays for what a process's first request would otherwise pay: the store's read and
stamp threads (or its S3 client), the log's read connections, Pillow's plugins with a header
read of each format; none of it sends a request upstream or reads an object."""

from __future__ import annotations

import pytest

from projectionist.proxy.inbound.services import SERVICES
from projectionist.proxy.sessionlog.sqlite import SqliteLog
from projectionist.proxy.stores.filesystem import FilesystemStore
from projectionist.proxy.stores.s3 import S3Store
from tests.backends import BACKENDS
from tests.conftest import Harness

pytestmark = pytest.mark.parametrize("backend", BACKENDS, indirect=True)


async def test_the_backends_are_ready_before_the_first_request(harness: Harness) -> None:
    services = harness.app[SERVICES]
    store, log = getattr(services.store, "inner"), services.log.inner  # the harness wraps the real store
    if isinstance(store, FilesystemStore):
        for lane in (store.reads, store.stamp_lane):
            assert len(lane._threads) == lane.size and all(t.is_alive() for t in lane._threads)
        assert len(store.writes._threads) == 0  # admissions are not on a request's path: started on use
    else:
        assert isinstance(store, S3Store) and store._client is not None
    if isinstance(log, SqliteLog):
        assert len(log._reads._threads) == log._reads.size
        assert log.ops.snapshot()["open"] == 1 + log._reads.size  # opened, and a state read on the read lane per thread
    assert harness.upstream.received == []  # nothing went upstream
    assert services.metrics.store_reads == {} or sum(services.metrics.store_reads.values()) == 0
