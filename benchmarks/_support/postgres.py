"""The Postgres side of a run: the benchmark's own database on the configured server,
the server's settings, and where its backends wait.

Benchmarks run against a dedicated database (``durable_bench`` on the server that
``DATABASE_URL`` names), recreated for every run, so that a run never disturbs the
dev or test databases and the tables it measures hold only what this run put there.
"""

from __future__ import annotations

import os
import threading
import time
from collections import defaultdict
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg

DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/durable"
BENCH_DATABASE = "durable_bench"


def database_url(dbname: str, base: str | None = None) -> str:
    """``base`` (default: ``DATABASE_URL``) with its database replaced by ``dbname``.

    Host, port, user, password and query options (``?host=/socket/dir``) are kept, so
    the benchmark runs on exactly the server the project is configured for.
    """
    url = base or os.environ.get("DATABASE_URL") or DEFAULT_DATABASE_URL
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{dbname}"))


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


def server_facts(conn: Any) -> dict[str, str]:
    """Settings that decide what a commit costs, read from the server itself."""
    facts = {"version": conn.execute("SHOW server_version").fetchone()[0]}
    for name in ("fsync", "synchronous_commit", "wal_sync_method", "shared_buffers"):
        facts[name] = conn.execute(f"SHOW {name}").fetchone()[0]
    return facts


class WaitSampler:
    """Samples ``pg_stat_activity`` every few milliseconds while it is entered: where the
    benchmark database's backends are (state, wait event, and the statement of an active
    one) and what the server's own processes wait on, as average numbers of backends.
    Whatever serializes commits across sessions shows here as a wait many backends share
    (a lock, the WAL write lock, the WAL flush), or as backends waiting on their clients."""

    QUERY = (
        "SELECT backend_type, state, coalesce(wait_event_type, '-'), "
        "coalesce(wait_event, '-'), split_part(left(query, 40), ' (', 1) "
        "FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
        "AND (datname = %s OR backend_type <> 'client backend')"
    )

    def __init__(self, url: str, every: float = 0.005) -> None:
        self.url = url
        self.database = str(psycopg.conninfo.conninfo_to_dict(url).get("dbname") or "")
        self.every = every
        self.samples: list[tuple[float, list[str]]] = []  # (time.monotonic(), where)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> WaitSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        try:
            while not self._stop.wait(self.every):
                try:
                    if conn is None:
                        conn = psycopg.connect(self.url, autocommit=True)
                    rows = conn.execute(self.QUERY, [self.database]).fetchall()
                except psycopg.Error:  # a terminated sampler misses samples, no more
                    conn = None
                    continue
                seen = []
                for kind, state, wait_type, wait, query in rows:
                    if kind != "client backend":
                        if wait_type not in ("Activity", "-"):
                            seen.append(f"[{kind}] {wait_type}: {wait}")
                        continue
                    where = f"{state}, {wait_type}: {wait}"
                    if state == "active":
                        where += f" ({query.strip()})"
                    seen.append(where)
                self.samples.append((time.monotonic(), seen))
        finally:
            if conn is not None:
                conn.close()

    def averages(self, start: float | None = None, end: float | None = None) -> dict[str, float]:
        """Average backends in each state over the samples taken between ``start`` and
        ``end`` (``time.monotonic()``; default: all), most first."""
        taken = [seen for at, seen in self.samples
                 if (start is None or at >= start) and (end is None or at <= end)]
        if not taken:
            return {}
        counts: defaultdict[str, int] = defaultdict(int)
        for seen in taken:
            for where in seen:
                counts[where] += 1
        return {k: v / len(taken) for k, v in sorted(counts.items(), key=lambda kv: -kv[1])}
