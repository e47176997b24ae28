"""Fixtures of the tests that commit here and watch real Daphne processes: a viewer's
API token, a Redis database of the module's own for the servers, and hints from this
process's commits sent to it (a module that uses them marks itself
``usefixtures("hints_here")``; one whose servers last a test, not the module, defines
``redis_url`` itself)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django import conf

from controlplane.dev.ports import reserved_redis_url

from .server import hints_from_here, viewer_token


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    with reserved_redis_url(conf.settings.REDIS_URL) as url:
        yield url


@pytest.fixture
def hints_here(settings: Any, redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    hints_from_here(settings, redis_url, monkeypatch)


@pytest.fixture
def token() -> str:
    return viewer_token()
