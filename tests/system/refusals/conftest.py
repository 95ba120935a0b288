"""The refusal fault tests' upstream: the ordinary fake, with a per-test ``script`` in front."""

from __future__ import annotations

from typing import Any

import pytest

from tests.system.refusals.hostile import Hostile, hostile_app


@pytest.fixture
async def upstream(aiohttp_server: Any) -> Hostile:
    fake = Hostile()
    server = await aiohttp_server(hostile_app(fake))
    fake.url = str(server.make_url("")).rstrip("/")
    return fake
