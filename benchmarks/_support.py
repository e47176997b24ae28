"""What every benchmark module shares: its own database, Django set-up, statistics,
server facts and the report file.

Benchmarks run against a dedicated database (``durable_bench`` on the server that
``DATABASE_URL`` names), recreated for every run, so that a run never disturbs the
dev or test databases and the tables it measures hold only what this run put there.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg

DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/durable"
BENCH_DATABASE = "durable_bench"
ROOT = Path(__file__).resolve().parent.parent
REPORT = ROOT / "docs" / "benchmarks.md"

_started = time.monotonic()


def machine_state(load: str | float, cpus: int | None = None) -> str:
    """How busy the machine was, from a 1-minute load average read around the run: a
    report says it was loaded only when it was (more runnable work than cores), so an
    idle run's figures are not marked as noisy, nor a busy run's passed off as quiet."""
    cores = cpus or os.cpu_count() or 1
    try:
        busy = float(str(load).split()[0]) > cores
    except (ValueError, IndexError):
        return "The machine's load was not read"
    if busy:
        return "**The machine was loaded by other work during this run**"
    return "The machine was otherwise idle during this run"


def progress(message: str) -> None:
    """One line per stage on stderr, so a long run shows where it is."""
    print(f"[bench {time.monotonic() - _started:6.1f}s] {message}", file=sys.stderr, flush=True)


def database_url(dbname: str, base: str | None = None) -> str:
    """``base`` (default: ``DATABASE_URL``) with its database replaced by ``dbname``.

    Host, port, user, password and query options (``?host=/socket/dir``) are kept, so
    the benchmark runs on exactly the server the project is configured for.
    """
    url = base or os.environ.get("DATABASE_URL") or DEFAULT_DATABASE_URL
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{dbname}"))


def parse_arguments(
    parser: argparse.ArgumentParser, argv: list[str] | None, database: str
) -> tuple[argparse.Namespace, str]:
    """Add the options every benchmark has, parse, and return the arguments with the URL
    of the benchmark's database: ``--database`` (refused unless its name says it is a
    benchmark's, since it is dropped and recreated) and ``--no-write``."""
    parser.add_argument("--database", default=database, help="dropped and recreated")
    parser.add_argument("--no-write", action="store_true", help=f"do not update {REPORT.name}")
    args = parser.parse_args(argv)
    if not args.database.startswith(BENCH_DATABASE):
        parser.error(f"--database must start with {BENCH_DATABASE!r}: it is dropped and recreated")
    return args, database_url(args.database)


def recreate_database(url: str) -> None:
    """Drop and create the benchmark database named in ``url``, via the ``postgres`` one.

    Starting from an empty database makes runs comparable (no tables grown by earlier
    runs) and survives migrations being rewritten during development. Only a database
    whose name starts with ``durable_bench`` is ever dropped.
    """
    from psycopg import sql
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    dbname = str(conninfo_to_dict(url).get("dbname") or "")
    if not dbname.startswith(BENCH_DATABASE):
        raise ValueError(f"refusing to drop {dbname!r}: not a benchmark database")
    admin = make_conninfo(url, dbname="postgres", connect_timeout=5)
    with psycopg.connect(admin, autocommit=True) as conn:
        name = sql.Identifier(dbname)
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(name))


def setup_django(url: str, *, migrate: bool) -> None:
    """Point Django at ``url`` and set it up; optionally bring the schema up to date.

    DEBUG is off unless ``DJANGO_DEBUG`` says otherwise: with DEBUG on, Django formats
    and keeps every query, which no deployment pays for. Without DEBUG the settings
    want a real secret key: a random one for this run (the servers it starts inherit it).
    Request rates are not counted (below).
    """
    import secrets

    import django

    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    os.environ.setdefault("DJANGO_DEBUG", "0")
    os.environ.setdefault("DJANGO_SECRET_KEY", secrets.token_urlsafe(50))
    # The benchmarks ask from one address (and mostly one account) faster than any person
    # should: the request rates would measure the limiter. Off here and in the servers
    # they start, unless asked (controlplane.web.rates).
    os.environ.setdefault("USER_REQUESTS_PER_SECOND", "0")
    os.environ.setdefault("ADDRESS_REQUESTS_PER_SECOND", "0")
    os.environ.setdefault("USER_SERVER_SECONDS_PER_SECOND", "0")
    django.setup()
    if migrate:
        from django.core.management import call_command

        call_command("migrate", verbosity=0, interactive=False)


def fresh_database(args: argparse.Namespace, url: str, redis_url: str | None = None) -> None:
    """Recreate the benchmark's database (``--database``), migrate it and set Django up
    on it, saying so (and which Redis database the run uses, if it uses one)."""
    redis = f"; Redis {redis_url}" if redis_url else ""
    progress(f"database {args.database}: recreating and migrating{redis}")
    recreate_database(url)
    setup_django(url, migrate=True)


@dataclass(frozen=True)
class Stats:
    """Latency summary in milliseconds."""

    count: int
    p50: float
    p90: float
    p99: float
    mean: float
    max: float

    @classmethod
    def of(cls, seconds: Sequence[float]) -> Stats:
        if not seconds:
            raise ValueError("no samples")
        ordered = sorted(s * 1000.0 for s in seconds)
        return cls(
            count=len(ordered),
            p50=percentile(ordered, 50),
            p90=percentile(ordered, 90),
            p99=percentile(ordered, 99),
            mean=sum(ordered) / len(ordered),
            max=ordered[-1],
        )


def percentile(ordered: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of sorted samples: a value that was actually observed."""
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


def server_facts(conn: Any) -> dict[str, str]:
    """Settings that decide what a commit costs, read from the server itself."""
    facts = {"version": conn.execute("SHOW server_version").fetchone()[0]}
    for name in ("fsync", "synchronous_commit", "wal_sync_method", "shared_buffers"):
        facts[name] = conn.execute(f"SHOW {name}").fetchone()[0]
    return facts


def replace_section(text: str, heading: str, section: str) -> str:
    """``text`` with the section under ``heading`` replaced by ``section`` (or appended).

    A section runs from its ``## `` heading to the next ``## `` heading, so other
    benchmarks' sections in the same file are left as they are.
    """
    body = section.rstrip("\n") + "\n"
    pattern = re.compile(rf"^{re.escape(heading)}[ \t]*\n.*?(?=^## |\Z)", re.M | re.S)
    match = pattern.search(text)
    if match is None:
        base = text.rstrip("\n")
        return (base + "\n\n" if base else "") + body
    tail = text[match.end() :]
    return text[: match.start()] + body + ("\n" if tail else "") + tail


def publish(heading: str, section: str, *, write: bool) -> int:
    """Print a benchmark's section and, unless told not to, put it in the report."""
    if write:
        write_section(heading, section)
        progress(f"wrote {REPORT.relative_to(REPORT.parent.parent)}")
    print(section)
    return 0


def write_section(heading: str, section: str, path: Path = REPORT) -> None:
    """Write ``section`` into the report file, replacing only its own previous version."""
    text = path.read_text() if path.exists() else "# Benchmarks\n\nWritten by `make bench`.\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(replace_section(text, heading, section))


class ThreadProducers:
    """A broker connection and producer per thread that sends, on the Redis at ``url``.

    kombu's connections and channels are not thread-safe: client threads that commit
    side by side, and the dispatcher's thread for held messages, each send on their
    own. ``release`` closes them all."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._local = threading.local()
        self._connections: list[Any] = []
        self._lock = threading.Lock()

    def producer(self) -> Any:
        from kombu import Connection, Producer

        producer = getattr(self._local, "producer", None)
        if producer is None:
            connection = Connection(self.url)
            producer = self._local.producer = Producer(connection)
            with self._lock:
                self._connections.append(connection)
        return producer

    def release(self) -> None:
        with self._lock:
            connections, self._connections = self._connections, []
        for connection in connections:
            connection.release()


def delivering_kernel(redis_url: str) -> tuple[Any, ThreadProducers]:
    """A kernel on the project's storage, registry and clock whose commits hand their
    dispatches to the broker at ``redis_url`` (producers of its own, one per sending
    thread, not the Celery app's configured broker), as the API's commits do; and those
    producers, for the caller to release."""
    from django.conf import settings

    from controlplane.reference.registry import build_registry
    from controlplane.storage import PostgresStorage
    from controlplane.storage.clock import DatabaseClock
    from controlplane.worker.execution import advance, advance_queue
    from controlplane.worker.runtime import announce_grace
    from kernel import Kernel
    from kernel.dispatch import Dispatcher

    broker = ThreadProducers(redis_url)

    def deliver(task_id: str, queue: str) -> None:
        advance.apply_async(args=[task_id], queue=queue, retry=False, producer=broker.producer())

    def send_advance_queue(queue: str) -> None:
        advance_queue.apply_async(args=[queue], queue=queue, retry=False,
                                  producer=broker.producer())

    kernel = Kernel(PostgresStorage(), build_registry(), DatabaseClock())
    dispatcher = Dispatcher(
        kernel, deliver, advance_queue=send_advance_queue,
        messages=settings.KERNEL_DISPATCH_MESSAGES, announce_grace=announce_grace(),
    )
    dispatcher.attach()
    return kernel, broker
