"""Fixtures of the tests that commit here and watch real Daphne processes: a viewer's
API token, and hints from this process's commits sent to the servers' Redis database
(a module that uses it defines ``redis_url`` and marks itself
``usefixtures("hints_here")``)."""

from __future__ import annotations

from typing import Any

import pytest

from .server import hints_from_here, viewer_token


@pytest.fixture
def hints_here(settings: Any, redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    hints_from_here(settings, redis_url, monkeypatch)


@pytest.fixture
def token() -> str:
    return viewer_token()
