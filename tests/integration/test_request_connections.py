"""A web process's statements are bounded in time (controlplane.web.request_connections): a
read past ``WEB_STATEMENT_TIMEOUT_SECONDS`` is cancelled by Postgres and the request
answered 503 saying so; a web statement runs without parallel workers, so that one wide
search cannot take every core; a process that is not a web process is not bounded."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from controlplane.reads import sessions as reads
from controlplane.web import request_connections

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def web_process(settings: Any) -> Iterator[None]:
    settings.WEB_STATEMENT_TIMEOUT_SECONDS = 0.3
    connection.close()
    request_connections.bound()
    try:
        yield
    finally:
        request_connections.unbound()
        connection.close()


def shown(setting: str) -> str:
    with connection.cursor() as cur:
        cur.execute(f"SHOW {setting}")
        return str(cur.fetchone()[0])


def statement_timeout() -> str:
    return shown("statement_timeout")


def test_a_read_past_the_bound_is_cancelled_and_answered_503(
    web_process: None, operator: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert statement_timeout() == "300ms"

    def slow(after: Any, limit: int) -> Any:
        with connection.cursor() as cur:
            cur.execute("SELECT pg_sleep(5)")
        return []

    monkeypatch.setattr(reads, "sessions", slow)
    answer = operator.get("/api/sessions")
    assert answer.status_code == 503, answer.content
    assert "longer than WEB_STATEMENT_TIMEOUT_SECONDS (0.3 s)" in answer.json()["detail"]
    assert answer["Retry-After"] == "2"
    monkeypatch.undo()
    assert operator.get("/api/sessions").status_code == 200  # the connection is usable


def test_a_web_statement_gets_no_parallel_workers_even_without_a_timeout(
    web_process: None, settings: Any,
) -> None:
    assert shown("max_parallel_workers_per_gather") == "0"
    settings.WEB_STATEMENT_TIMEOUT_SECONDS = 0
    connection.close()
    assert statement_timeout() == "0"
    assert shown("max_parallel_workers_per_gather") == "0"


def test_a_process_that_does_not_serve_requests_is_not_bounded() -> None:
    connection.close()
    assert statement_timeout() == "0"
    assert shown("max_parallel_workers_per_gather") != "0"
