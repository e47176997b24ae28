"""Free loopback ports and reserved Redis databases, for tests, benchmarks and services.

Runs on one machine share one Redis server (and, between them, the loopback ports):
every process that starts servers of its own takes its port from :func:`free_port`,
and every run that needs a Redis database of its own (a broker to flush, queues to
read) reserves its number with :func:`reserve_redis_db` or :func:`reserved_redis_url`,
so that nobody ever flushes or consumes another run's queues.

Standard library at import time; ``redis`` is imported when a database is reserved.
"""

from __future__ import annotations

import os
import random
import socket
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit, urlunsplit

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
RESERVABLE = range(1, 16)  # database 0 holds the reservations (and the dev stack's queues)
RESERVATION_KEY = "chaos:redis-db:{db}"  # the name older runs used: they still see ours
RESERVATION_SECONDS = 1800  # a run that dies without releasing frees its number by then


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def redis_db_url(db: int, url: str | None = None) -> str:
    """``url`` (default: ``REDIS_URL``, else the local server) with its database number
    replaced by ``db``; a URL without a database number works too."""
    url = url or os.environ.get("REDIS_URL") or DEFAULT_REDIS_URL
    return urlunsplit(urlsplit(url)._replace(path=f"/{db}"))


def own_tcp_addresses() -> set[str]:
    """The local ``ip:port`` of this process's IPv4 TCP sockets, as a server sees its
    clients (Redis's CLIENT LIST ``addr``); empty where ``/proc`` cannot tell (not Linux)."""
    try:
        inodes = set()
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:  # closed since it was listed
                continue
            if target.startswith("socket:["):
                inodes.add(target[len("socket:["):-1])
        with open("/proc/self/net/tcp") as table:
            rows = table.read().splitlines()[1:]
    except OSError:
        return set()
    own = set()
    for row in rows:
        fields = row.split()  # sl local_address rem_address st ... uid timeout inode
        if len(fields) > 9 and fields[9] in inodes:
            address, port = fields[1].split(":")
            ip = socket.inet_ntoa(bytes.fromhex(address)[::-1])  # little-endian hex
            own.add(f"{ip}:{int(port, 16)}")
    return own


def pick_order(clients: list[dict[str, str]], own: set[str]) -> list[int]:
    """The reservable numbers to try, given Redis's CLIENT LIST: those nobody is
    connected to, in random order, then those only this process (``own`` addresses)
    is connected to; never one another process is connected to."""
    busy = {int(client["db"]) for client in clients}
    others = {int(client["db"]) for client in clients if client["addr"] not in own}
    free = sorted(set(RESERVABLE) - busy)
    ours = sorted((set(RESERVABLE) & busy) - others)
    return random.sample(free, len(free)) + random.sample(ours, len(ours))


@contextmanager
def reserve_redis_db(url: str | None = None, db: int | None = None) -> Iterator[int]:
    """Reserve a database number (1-15) of the Redis server at ``url`` (default:
    ``REDIS_URL``) that nobody else is using, until the block ends; ``db`` asks for
    that number and no other.

    Each run reserves its number with a key in database 0 (set only if absent, expiring
    on its own if the run dies), and an automatic pick skips the numbers that some
    client is connected to (a demo's workers, say), so that we never flush or consume
    someone else's queues, nor they ours. Numbers that only this process is connected
    to come last rather than never: a long test run keeps idle connections to the
    numbers it reserved and released (pools of clients it made), and without them it
    could run out of numbers by itself.
    """
    import redis

    registry = redis.Redis.from_url(redis_db_url(0, url))
    token = f"{os.uname().nodename}:{os.getpid()}:{uuid.uuid4().hex}"
    candidates = [db] if db is not None else pick_order(registry.client_list(),
                                                        own_tcp_addresses())
    for number in candidates:
        key = RESERVATION_KEY.format(db=number)
        if registry.set(key, token, nx=True, ex=RESERVATION_SECONDS):
            try:
                yield number
            finally:
                if registry.get(key) == token.encode():
                    registry.delete(key)
            return
    if db is not None:
        raise RuntimeError(f"Redis database {db} is reserved by another run")
    raise RuntimeError("Redis databases 1-15 are all in use or reserved by other runs")


@contextmanager
def reserved_redis_url(url: str | None = None, db: int | None = None) -> Iterator[str]:
    """:func:`reserve_redis_db`, flushed, as a URL: an empty broker for one run."""
    import redis

    with reserve_redis_db(url, db) as number:
        reserved = redis_db_url(number, url)
        redis.Redis.from_url(reserved).flushdb()
        yield reserved
