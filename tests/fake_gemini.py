"""Fake upstream routes for Gemini generateContent (filled in by the Gemini tests' author)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    from tests.fakes import FakeUpstream


def install_gemini(app: web.Application, fake: FakeUpstream) -> None:
    """Register the Gemini model routes on the fake upstream."""
