"""The policy semantics table (DESIGN.md §1, ``tests/policy_table.py``) on the real backends: the
embedded filesystem store + SQLite log, and the replicated S3 bucket + PostgreSQL log. (The same
table on the in-memory doubles is in the fast loop: ``tests/policy/test_policy.py``.)"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from projectionist.proxy.config import load_config
from projectionist.proxy.edge.app import open_log, open_store
from projectionist.proxy.sessionlog.base import Log
from tests.conftest import replicated_backend
from tests.fakes import CountingStore
from tests.policy_table import Env
from tests.policy_table import (  # noqa: F401  (the table's tests, collected here on this module's env)
    test_failure_is_quarantined_once_with_the_right_class, test_a_real_missing_object_is_not_found,
    test_second_request_derives_placeholder_from_log_without_reading,
    test_read_failed_then_success_sends_the_image_and_records_nothing,
    test_cancellation_during_first_read_records_nothing, test_cancellation_during_the_retry_records_nothing,
    test_unclassified_error_fails_clearly_and_records_nothing,
    test_several_failures_in_one_request_are_one_atomic_append,
    test_repeated_references_are_all_replaced_and_read_once,
    test_sessionless_fail_raises_the_attachment_error,
    test_sessionless_placeholder_mode_projects_without_recording,
    test_invalid_reference_code_from_store_is_the_clients_error,
    test_fifty_concurrent_requests_make_one_event, test_projection_is_deterministic_for_the_same_log,
    test_recover_requires_a_verified_read_and_appends_once, test_recover_of_a_corrupt_object_is_refused,
    test_recover_of_a_reference_not_quarantined_appends_nothing_and_reads_nothing,
    test_concurrent_recoveries_make_one_event, test_fork_keeps_the_quarantine_state,
)


@pytest.fixture(params=["embedded", "replicated"])
async def env(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Env]:
    async with contextlib.AsyncExitStack() as stack:
        overrides: dict[str, Any] = {"server.data_dir": str(tmp_path)}
        if request.param == "replicated":
            overrides |= await stack.enter_async_context(replicated_backend(request.getfixturevalue("seaweed")))
        config = load_config(None, **overrides)
        store = CountingStore(open_store(config))
        stack.push_async_callback(store.close)

        def reopen() -> Log:
            log = open_log(config)
            stack.push_async_callback(log.close)
            return log

        yield Env(store, reopen(), reopen)
