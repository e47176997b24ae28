"""The free-port and Redis-database helpers that tests and benchmarks share."""

from __future__ import annotations

import socket

from controlplane.dev.ports import free_port, redis_db_url


def test_redis_db_url_replaces_only_the_database() -> None:
    assert redis_db_url(14, "redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/14"
    assert redis_db_url(3, "redis://:pw@host:6380") == "redis://:pw@host:6380/3"


def test_a_free_port_can_be_bound() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
