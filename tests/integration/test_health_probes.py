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


def _startup_done(conn: socket.socket) -> bool:
    """Answer a client's startup as a trusting server would (refusing SSL and GSS
    encryption), and say whether it got that far."""
    import struct

    while True:
        header = conn.recv(8, socket.MSG_WAITALL)
        if len(header) < 8:
            return False
        length, code = struct.unpack("!ii", header)
        if code in (80877103, 80877104):  # SSLRequest, GSSENCRequest: not here
            conn.sendall(b"N")
            continue
        conn.recv(length - 8, socket.MSG_WAITALL)  # the startup parameters
        break
    conn.sendall(
        b"R" + struct.pack("!ii", 8, 0)  # AuthenticationOk
        + b"K" + struct.pack("!iii", 12, 1, 1)  # BackendKeyData
        + b"Z" + struct.pack("!i", 5) + b"I"  # ReadyForQuery, idle
    )
    return True


@pytest.fixture
def server_that_never_answers_a_query() -> Iterator[int]:
    """A port that lets a client in (the startup handshake completes) and then never
    answers what it asks."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn = server.accept()[0]
            except TimeoutError:
                continue
            held.append(conn)
            conn.settimeout(5)
            try:
                _startup_done(conn)
            except OSError:
                continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


@pytest.mark.django_db
def test_a_database_that_lets_the_probe_in_and_never_answers_its_query_is_unreachable(
    server_that_never_answers_a_query: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    stalled = ConnectionHandler({"default": {
        "ENGINE": "django.db.backends.postgresql", "NAME": "durable", "USER": "postgres",
        "HOST": "127.0.0.1", "PORT": str(server_that_never_answers_a_query),
    }})
    monkeypatch.setattr(health, "connections", stalled)
    found: list[str | None] = []
    started = time.monotonic()
    probe = threading.Thread(target=lambda: found.append(health.database_problem()),
                             daemon=True)
    probe.start()
    probe.join(timeout=health.PROBE_TIMEOUT_SECONDS + 5)
    assert not probe.is_alive(), "the database probe is still waiting for its query"
    assert found and found[0] is not None and found[0].startswith("TimeoutError"), found
    assert "query" in found[0], found  # it got past connecting
    assert time.monotonic() - started < health.PROBE_TIMEOUT_SECONDS + 5
