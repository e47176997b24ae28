"""While Postgres cannot be reached, the HTTP edges answer 503 with ``Retry-After``.

A 500 tells a client the server is broken; a restarting database is a wait, and every
command carries an id that makes a retry safe. The fault is real: the request's own
Postgres backend is terminated just before the request, so its first query meets a
dead connection, as after a database restart.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db import close_old_connections, connection
from django.test import Client

from controlplane.web import request_connections
from tests.databases import url_of_test_database

from .clients import post

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def next_request_reconnects() -> Iterator[None]:
    """What Django does between requests (``request_started``/``request_finished``),
    which its test client turns off so as to keep the test's connection."""
    yield
    close_old_connections()


def next_request() -> None:
    close_old_connections()


def terminate_own_backend() -> None:
    connection.ensure_connection()
    pid = connection.connection.info.backend_pid
    with psycopg.connect(url_of_test_database(), autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])


def assert_retry_later(response: Any) -> None:
    assert response.status_code == 503, (response.status_code, response.content)
    assert response["Retry-After"] == "2"


@pytest.mark.parametrize("debug", [False, True], ids=["deployed", "DEBUG"])
@pytest.mark.parametrize("path", ["/api/tasks?limit=5", "/api/sessions?limit=5"])
def test_an_api_read_answers_503_then_serves_again(
    operator: Client, path: str, debug: bool, settings: Any
) -> None:
    settings.DEBUG = debug  # with DEBUG, ninja answers errors itself instead of raising
    assert operator.get(path).status_code == 200
    terminate_own_backend()
    down = operator.get(path)
    assert_retry_later(down)
    assert "unavailable" in down.json()["detail"]
    next_request()
    assert operator.get(path).status_code == 200


def test_a_command_answers_503_and_its_retry_applies_it_once(operator: Client) -> None:
    terminate_own_backend()
    assert_retry_later(post(operator, "/api/sessions", {"metadata": {"title": "t"}}))
    next_request()
    created = post(operator, "/api/sessions", {"metadata": {"title": "t"}})
    assert created.status_code == 201, created.content


def test_a_page_answers_503_as_text(operator: Client) -> None:
    assert operator.get("/tasks/").status_code == 200
    terminate_own_backend()
    down = operator.get("/tasks/")
    assert_retry_later(down)
    assert down["Content-Type"].startswith("text/plain")


def test_a_web_process_answers_503_then_bounds_its_new_connection(
    operator: Client, settings: Any
) -> None:
    """As deployed (controlplane.asgi): every connection the process opens gets its
    statement bound on opening. A browser's request is answered 503 while its connection
    is dead (its first read, the session's user, is made before any view, for the request
    rates), and the next request's new connection is bounded again."""
    settings.WEB_STATEMENT_TIMEOUT_SECONDS = 7
    connection.close()
    request_connections.bound()
    try:
        assert operator.get("/tasks/").status_code == 200
        terminate_own_backend()
        assert_retry_later(operator.get("/tasks/"))
        assert_retry_later(operator.get("/api/sessions?limit=5"))
        next_request()
        assert operator.get("/tasks/").status_code == 200
        with connection.cursor() as cur:
            cur.execute("SHOW statement_timeout")
            assert cur.fetchone()[0] == "7s"
    finally:
        request_connections.unbound()
        connection.close()
