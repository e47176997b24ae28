"""Fixtures the integration tests share: the web process's kernel with the test task kinds of
``test_api.py`` (no broker), an operator's client, and no live-page connection left."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.test import Client

from controlplane.sockets.page_threads import end_page_threads
from kernel import Kernel

from .test_api import client_for, with_test_kinds


@pytest.fixture
def api_kernel(monkeypatch: pytest.MonkeyPatch) -> Kernel:
    return with_test_kinds(monkeypatch)


@pytest.fixture
def operator() -> Client:
    return client_for("olga", "operator")


@pytest.fixture(autouse=True)
def no_page_connections_left() -> Iterator[None]:
    """Page sockets served in-process read on threads of their own, each with its own
    database connection: they end with the test (the test database is dropped at the
    end of the run, which an open connection would prevent)."""
    yield
    end_page_threads()
