"""The readiness probe's checks stay bounded when a server takes the connection and then
says nothing (a hung database, a host whose firewall holds connections open)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
from django.db.utils import ConnectionHandler

from controlplane.web import health


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A port that accepts connections and never answers."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


@pytest.mark.django_db
def test_a_database_that_never_answers_is_reported_unreachable_within_the_probe_timeout(
    silent_server: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    silent = ConnectionHandler({"default": {
        "ENGINE": "django.db.backends.postgresql", "NAME": "durable", "USER": "postgres",
        "HOST": "127.0.0.1", "PORT": str(silent_server),
    }})
    monkeypatch.setattr(health, "connections", silent)
    found: list[str | None] = []
    started = time.monotonic()
    probe = threading.Thread(target=lambda: found.append(health.database_problem()),
                             daemon=True)
    probe.start()
    probe.join(timeout=health.PROBE_TIMEOUT_SECONDS + 5)
    assert not probe.is_alive(), "the database probe is still waiting"
    assert found and found[0] is not None and "timeout" in found[0], found
    assert time.monotonic() - started < health.PROBE_TIMEOUT_SECONDS + 5


@pytest.mark.django_db
def test_the_database_the_settings_name_is_reported_reachable() -> None:
    assert health.database_problem() is None
