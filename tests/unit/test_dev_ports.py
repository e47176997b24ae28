"""The free-port and Redis-database helpers that tests and benchmarks share."""

from __future__ import annotations

import socket

from controlplane.dev.ports import (
    RESERVABLE,
    free_port,
    own_tcp_addresses,
    pick_order,
    redis_db_url,
)


def test_redis_db_url_replaces_only_the_database() -> None:
    assert redis_db_url(14, "redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/14"
    assert redis_db_url(3, "redis://:pw@host:6380") == "redis://:pw@host:6380/3"


def test_a_free_port_can_be_bound() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_this_process_knows_its_own_tcp_clients_addresses() -> None:
    with (socket.create_server(("127.0.0.1", 0)) as server,
          socket.create_connection(server.getsockname()) as client):
        peer, _ = server.accept()
        with peer:
            ip, port = client.getsockname()
            assert f"{ip}:{port}" in own_tcp_addresses()
            ip, port = peer.getsockname()  # the listening side's end too
            assert f"{ip}:{port}" in own_tcp_addresses()


def test_a_pick_skips_numbers_others_use_and_tries_our_own_idle_ones_last() -> None:
    own = {"127.0.0.1:5001", "127.0.0.1:5002"}
    clients = [
        {"addr": "127.0.0.1:5001", "db": "3"},  # only us
        {"addr": "127.0.0.1:5002", "db": "4"},  # us and another process
        {"addr": "127.0.0.1:6001", "db": "4"},
        {"addr": "127.0.0.1:6002", "db": "5"},  # another process
        {"addr": "127.0.0.1:6003", "db": "0"},  # the reservations' database
    ]
    order = pick_order(clients, own)
    assert sorted(order[:-1]) == sorted(set(RESERVABLE) - {3, 4, 5}) and order[-1] == 3
    assert sorted(pick_order([], set())) == list(RESERVABLE)
