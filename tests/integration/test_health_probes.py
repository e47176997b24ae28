"""The readiness probe's checks stay bounded when a server takes the connection and then
says nothing (a hung database, a host whose firewall holds connections open)."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from django.db.utils import ConnectionHandler

from controlplane.web import health


@contextmanager
def fake_server(on_connect: Callable[[socket.socket], object]) -> Iterator[int]:
    """A port whose connections are each handed to ``on_connect`` and then held open,
    unanswered, until the end."""
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
                on_connect(conn)
            except OSError:
                continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        server.close()


def _startup_done(conn: socket.socket) -> bool:
    """Answer a client's startup as a trusting server would (refusing SSL and GSS
    encryption), and say whether it got that far."""
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


def probe_at(port: int, monkeypatch: pytest.MonkeyPatch) -> str | None:
    """``health.database_problem()`` against a server on ``port``, asserting that it
    answers within its timeout (and a margin)."""
    monkeypatch.setattr(health, "connections", ConnectionHandler({"default": {
        "ENGINE": "django.db.backends.postgresql", "NAME": "durable", "USER": "postgres",
        "HOST": "127.0.0.1", "PORT": str(port),
    }}))
    found: list[str | None] = []
    started = time.monotonic()
    probe = threading.Thread(target=lambda: found.append(health.database_problem()),
                             daemon=True)
    probe.start()
    probe.join(timeout=health.PROBE_TIMEOUT_SECONDS + 5)
    assert not probe.is_alive(), "the database probe is still waiting"
    assert time.monotonic() - started < health.PROBE_TIMEOUT_SECONDS + 5
    assert found and found[0] is not None, found
    return found[0]


@pytest.mark.django_db
def test_a_database_that_never_answers_is_reported_unreachable_within_the_probe_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with fake_server(lambda conn: None) as port:  # accepts, never says a word
        assert "timeout" in (probe_at(port, monkeypatch) or "")


@pytest.mark.django_db
def test_the_database_the_settings_name_is_reported_reachable() -> None:
    assert health.database_problem() is None


@pytest.mark.django_db
def test_a_database_that_lets_the_probe_in_and_never_answers_its_query_is_unreachable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with fake_server(_startup_done) as port:
        found = probe_at(port, monkeypatch) or ""
    assert found.startswith("TimeoutError"), found
    assert "query" in found, found  # it got past connecting
