"""Fixtures the integration tests share: the web process's kernel with the test task kinds of
``api_kinds.py`` (no broker), an operator's client, no live-page connection left, the
LangGraph hosts on the web process's runtime, a redis-server of a test's own, and the
HTTP email provider stand-in (one per module)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from django.test import Client

from controlplane.dev.postgres import private_folder
from controlplane.dev.processes import RunningProvider, start_provider
from controlplane.dev.redis_server import PrivateRedis, redis_server
from controlplane.sockets.page_threads import end_page_threads
from controlplane.sockets.pages import settled_commits
from controlplane.worker.runtime import runtime
from kernel import Kernel
from tests.langgraph_graphs import on_runtime, release

from .api_kinds import with_test_kinds
from .clients import client_for


@pytest.fixture
def api_kernel(monkeypatch: pytest.MonkeyPatch) -> Kernel:
    return with_test_kinds(monkeypatch)


@pytest.fixture
def kernel(api_kernel: Kernel) -> Kernel:
    """``api_kernel`` under the name the API tests give it; the files whose every test needs
    it say ``pytest.mark.usefixtures("kernel")``."""
    return api_kernel


@pytest.fixture
def operator() -> Client:
    return client_for("olga", "operator")


@pytest.fixture(autouse=True)
def no_page_connections_left() -> Iterator[None]:
    """Page sockets served in-process read on threads of their own, each with its own
    database connection: they end with the test (the test database is dropped at the
    end of the run, which an open connection would prevent); and no settled commit
    is known from another test."""
    yield
    end_page_threads()
    settled_commits.forget()


@pytest.fixture
def graphs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """The LangGraph hosts on the web process's runtime, their runs in a folder of the
    test's own, and no broker."""
    monkeypatch.setattr(runtime().dispatcher, "deliver", lambda task, queue: None)
    monkeypatch.setenv("LANGGRAPH_RUNS", str(tmp_path / "runs"))
    hosts = on_runtime()
    yield tmp_path / "runs"
    release(hosts)


@pytest.fixture
def private_redis_url() -> Iterator[tuple[str, int]]:
    """A redis-server of the test's own: (its URL, its port)."""
    binary = redis_server()
    if binary is None:
        pytest.skip("no redis-server binary found")
    with private_folder("bench-smoke-redis-", None) as folder:
        server = PrivateRedis(folder, binary)
        server.start()
        try:
            yield server.url, server.port
        finally:
            server.stop()


@pytest.fixture(scope="module")
def provider() -> Iterator[RunningProvider]:
    with start_provider() as running:
        yield running
