"""Fake upstream routes for the OpenAI Responses API (filled in by the Responses tests' author)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    from tests.fakes import FakeUpstream


def install_responses(app: web.Application, fake: FakeUpstream) -> None:
    """Register ``POST /v1/responses`` on the fake upstream."""
