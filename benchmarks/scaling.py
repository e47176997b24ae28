"""Scaling on this machine (issue 14): commits/s and fan-out throughput with 1, 2 and 4
worker processes; with no dashboard reads, with the dashboard's reads on the primary,
and with them on a streaming replica.

Servers: a Postgres primary of the run's own (``controlplane/dev/postgres.py``, the
server's default settings: ``fsync``, ``synchronous_commit`` and ``full_page_writes``
on) and its streaming replica (``pg_basebackup -R``), each on a port of its own, so that
the replica is a real one and no other database shares the primary; Redis db 12 of the
shared server, reserved. Workers are ``celery worker -P solo`` processes and beat,
started through the launcher as deployed; the tasks are the fan-out benchmark's no-op
kind (``benchmarks._support.noop``: every phase only commits), committed as the API
commits.

Shapes, for each worker count:

- **fan-out**: N one-phase tasks made runnable by one commit in **one session**; tasks/s
  from before that commit until every task is terminal (polled every 10 ms). Each task's
  phase is one commit, and every commit of a session takes that session's row (its
  ``head_seq``): this is one session's commit rate.
- **commits**: T tasks of P phases each (each phase a commit, the next one inline while
  the worker holds the lease, so no claim or message between them); phase commits/s
  from before the first creating commit until every task is terminal. Twice: the T tasks
  in **one session**, whose commits all take its row one at a time, and in **T
  sessions**, which share no row: the difference is what one session's head row costs;
  the second is the primary's (and the workers') commit rate.

Reads: while each shape runs, reader threads of this process fetch the dashboard's pages
(the overview, the fan-out session's page, ``/tasks/``) back to back, as a logged-in
viewer, from one Daphne process reading the primary, or from another whose
``DATABASE_REPLICA_URL`` is the replica. Reported: pages/s and their latency.
Everything shares the machine's cores: the replica takes reads off the primary's
server processes and locks, not off the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from benchmarks._support import (
    BENCH_DATABASE,
    KIND,
    TASK_MODULE,
    Driver,
    Stats,
    cluster,
    code_revision,
    load_average,
    parse_arguments,
    progress,
    publish,
    server_facts,
    setup_django,
)
from controlplane.dev.ports import reserved_redis_url

HEADING = "## Scaling: worker processes and a read replica (issue 14)"
DEFAULT_DATABASE = f"{BENCH_DATABASE}_scaling"
DEFAULT_REDIS_DB = 12
READS = ("none", "primary", "replica")
VIEWER = ("bench-viewer", "bench-viewer-pass")


@dataclass
class Reads:
    """What the reader threads saw during one run."""

    seconds: list[float] = field(default_factory=list)
    errors: int = 0
    elapsed: float = 0.0

    @property
    def per_second(self) -> float:
        return len(self.seconds) / self.elapsed if self.elapsed else 0.0


@dataclass
class Run:
    workers: int
    reads: str
    fanout: float = 0.0  # tasks/s, one session
    one_session: float = 0.0  # phase commits/s, T tasks in one session
    commits: float = 0.0  # phase commits/s, T tasks in T sessions
    pages: Reads | None = None
    replica_rows: int = 0  # rows the replica's server read during the run


@contextlib.contextmanager
def servers(database: str) -> Iterator[tuple[Any, Any]]:
    """A migrated primary (Django set up on it) and its streaming replica."""
    from controlplane.dev.postgres import (
        PrivatePostgres,
        postgres_bin,
        private_folder,
        server_user,
        streaming_replica,
    )

    bin_dir = postgres_bin()
    if bin_dir is None or not (bin_dir / "pg_basebackup").exists():
        raise SystemExit("no Postgres server binaries (initdb, postgres, pg_basebackup)")
    user = server_user()
    with private_folder("bench-scaling-", user) as root:
        folders = []
        for name in ("primary", "replica"):
            (root / name).mkdir()
            if user is not None:
                shutil.chown(root / name, user, user)
            folders.append(root / name)
        # Server defaults, as a deployment's; room for two Daphnes' thread pools.
        primary = PrivatePostgres(folders[0], bin_dir, user, settings=(), max_connections=300)
        replica = PrivatePostgres(folders[1], bin_dir, user, settings=(), max_connections=300)
        try:
            primary.init()
            primary.start()
            with psycopg.connect(primary.url("postgres"), autocommit=True) as conn:
                conn.execute(f"CREATE DATABASE {database}")
            progress(f"primary on port {primary.port}: migrating {database}")
            setup_django(primary.url(database), migrate=True)
            make_viewer()
            progress("cloning the replica (pg_basebackup)")
            streaming_replica(primary, replica)
            yield primary, replica
        finally:
            replica.stop("immediate")
            primary.stop("immediate")


def make_viewer() -> None:
    from django.contrib.auth.models import Group, User

    user = User.objects.create_user(VIEWER[0], password=VIEWER[1])
    user.groups.add(Group.objects.get_or_create(name="viewer")[0])


@contextlib.contextmanager
def readers(server: Any, paths: list[str], threads: int) -> Iterator[Reads]:
    """``threads`` viewers fetching ``paths`` in turn, back to back, until the block ends."""
    seen = Reads()
    stop = threading.Event()
    lock = threading.Lock()
    openers = [server.login(*VIEWER) for _ in range(threads)]

    def read(opener: urllib.request.OpenerDirector) -> None:
        while not stop.is_set():
            for path in paths:
                started = time.perf_counter()
                try:
                    with opener.open(f"{server.http}{path}", timeout=30) as answer:
                        answer.read()
                        ok = answer.status == 200
                except OSError:
                    ok = False
                with lock:
                    if ok:
                        seen.seconds.append(time.perf_counter() - started)
                    else:
                        seen.errors += 1

    workers = [threading.Thread(target=read, args=(o,), daemon=True) for o in openers]
    began = time.perf_counter()
    for worker in workers:
        worker.start()
    try:
        yield seen
    finally:
        stop.set()
        for worker in workers:
            worker.join(timeout=60)
        seen.elapsed = time.perf_counter() - began


def commits_per_second(
    driver: Any, tasks: int, phases: int, timeout: float, *, one_session: bool
) -> float:
    """``tasks`` tasks of ``phases`` phases, in one session or one session each: phase
    commits/s until all are terminal."""
    from kernel import Draft

    started = time.time()
    ids = []
    shared = driver.kernel.create_session() if one_session else None
    for _ in range(tasks):
        handle = shared or driver.kernel.create_session()
        draft = Draft(actor="user:bench")
        ids.append(draft.create_task(KIND, {"phases": phases}))
        handle.commit(draft)
    return tasks * phases / (driver.wait(ids, timeout) - started)


def rows_read(url: str) -> int:
    """Rows this server has returned for the database of ``url``: on a standby, only the
    reads sent to it (pg_stat_database counts each server's own work)."""
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT tup_returned + tup_fetched FROM pg_stat_database "
                           "WHERE datname = current_database()").fetchone()
        return int(row[0]) if row else 0


def measure(args: argparse.Namespace, url: str, replica_url: str, redis_url: str,
            logs: Path) -> list[Run]:
    from controlplane.dev.processes import Daphne, process_env, running

    env = process_env(url, redis_url, DJANGO_DEBUG="0")
    daphnes = {
        "primary": Daphne(logs / "daphne-primary.log", env, name="daphne-primary"),
        "replica": Daphne(logs / "daphne-replica.log", {**env, "DATABASE_REPLICA_URL":
                                                          replica_url}, name="daphne-replica"),
    }
    runs = []
    with running(*daphnes.values()):
        driver = Driver(redis_url)
        paths = ["/", f"/sessions/{driver.handle.id}/", "/tasks/"]
        try:
            for workers in args.workers:
                with cluster(url, redis_url, workers, str(logs / f"workers-{workers}")):
                    progress(f"{workers} worker(s): warm-up")
                    driver.burst(20, 2, args.timeout)
                    for reads in [r for _ in range(args.rounds) for r in args.reads]:
                        run = Run(workers, reads)
                        before = rows_read(replica_url)
                        with contextlib.ExitStack() as stack:
                            if reads != "none":
                                run.pages = stack.enter_context(
                                    readers(daphnes[reads], paths, args.readers))
                            run.fanout = driver.burst(args.tasks, 1, args.timeout)
                            shape = (driver, args.sessions, args.phases, args.timeout)
                            run.one_session = commits_per_second(*shape, one_session=True)
                            run.commits = commits_per_second(*shape, one_session=False)
                        run.replica_rows = rows_read(replica_url) - before
                        pages = (f"; {run.pages.per_second:.1f} pages/s"
                                 if run.pages else "")
                        progress(f"{workers} worker(s), reads {reads}: fan-out "
                                 f"{run.fanout:.1f} tasks/s, commits {run.one_session:.1f} "
                                 f"(one session) / {run.commits:.1f} commits/s" + pages)
                        runs.append(run)
        finally:
            driver.close()
    return runs


# -- the report -----------------------------------------------------------------------


def _f(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"


def _spread(values: list[float]) -> str:
    """The mean, and the range when there was more than one run."""
    mean = _f(sum(values) / len(values))
    return mean if len(values) == 1 else f"{mean} ({_f(min(values))}-{_f(max(values))})"


def render(when: datetime, facts: dict[str, str], runs: list[Run],
           args: argparse.Namespace) -> str:
    lines = [
        HEADING,
        "",
        f"Run {when:%Y-%m-%d %H:%M} UTC by `make bench BENCH_ARGS=scaling` on revision "
        f"{facts['revision']}. Machine: {facts['machine']}; load average {facts['load_before']}"
        f" before the run and {facts['load_after']} after it (other engineers' test suites "
        "share the cores: compare the rows of one run, not runs). PostgreSQL "
        f"{facts['version']}, a primary of the run's own (`fsync={facts['fsync']}`, "
        f"`synchronous_commit={facts['synchronous_commit']}`, "
        f"`shared_buffers={facts['shared_buffers']}`) and its streaming replica, both on "
        "this host; Redis on this host; workers `celery worker -P solo` and one beat, "
        "`DJANGO_DEBUG=0`, default lease settings.",
        "",
        f"| workers | dashboard reads | fan-out: {args.tasks:,} one-phase tasks in one "
        f"session (tasks/s) | commits: {args.sessions} tasks x {args.phases} phases in one "
        f"session (commits/s) | the same in {args.sessions} sessions (commits/s) | pages/s "
        "| page p50 / p90 (ms) | page errors | rows read on the replica |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    groups: dict[tuple[int, str], list[Run]] = {}
    for run in runs:
        groups.setdefault((run.workers, run.reads), []).append(run)
    for (workers, reads), group in groups.items():
        seen = [run.pages for run in group if run.pages is not None]
        latencies = [second for pages in seen for second in pages.seconds]
        if latencies:
            stats = Stats.of(latencies)
            rate = len(latencies) / sum(pages.elapsed for pages in seen)
            errors = sum(pages.errors for pages in seen)
            pages = f"{rate:.1f} | {stats.p50:,.0f} / {stats.p90:,.0f} | {errors}"
        else:
            pages = "- | - | -"
        where = {"none": "none", "primary": "on the primary",
                 "replica": "on the replica"}[reads]
        rows = sum(run.replica_rows for run in group)
        lines.append(f"| {workers} | {where} | {_spread([r.fanout for r in group])} "
                     f"| {_spread([r.one_session for r in group])} "
                     f"| {_spread([r.commits for r in group])} | {pages} | {rows:,} |")
    lines += [
        "",
        f"Each figure is the mean of {args.rounds} run(s) (their range in brackets), the "
        "read conditions interleaved so that a drift in the machine's load touches each. "
        "Method: see `benchmarks/scaling.py`. Fan-out: one commit makes the tasks "
        "runnable; the clock runs from before it until every task is terminal (polled every "
        "10 ms). Commits: one creating commit per task, then every phase of every task "
        "is a commit; phase commits over the same span. Rows read on the replica: from its "
        "`pg_stat_database`, which a server's backends update up to 10 s late, so the tail "
        "of a run with replica reads also shows in the next row's count. Reads: "
        f"{args.readers} viewer thread(s) of the benchmark process fetch `/`, the fan-out "
        "session's page and `/tasks/` in turn, back to back, from one Daphne process while "
        "both shapes run; `on the replica` is a Daphne whose `DATABASE_REPLICA_URL` names "
        "the replica (pages read there; commits, claims and the socket's read-your-writes "
        "fallback stay on the primary). Every process (workers, beat, Daphne, both "
        "Postgres servers, Redis, this driver) shares the machine's cores.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.scaling",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--reads", nargs="+", choices=READS, default=list(READS))
    parser.add_argument("--tasks", type=int, default=200, help="one-phase fan-out")
    parser.add_argument("--sessions", type=int, default=8,
                        help="tasks of the commits shape (and its sessions, in its second run)")
    parser.add_argument("--phases", type=int, default=40, help="phases of each such task")
    parser.add_argument("--readers", type=int, default=2, help="viewer threads")
    parser.add_argument("--rounds", type=int, default=2,
                        help="runs of each read condition, interleaved (machine load drifts)")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--logs", help="keep the processes' logs in this directory")
    parser.add_argument("--redis-db", type=int, default=DEFAULT_REDIS_DB)
    args, _ = parse_arguments(parser, argv, DEFAULT_DATABASE)
    os.environ["KERNEL_TASK_MODULES"] = TASK_MODULE  # this process commits the kind too
    # Stopped with SIGTERM, it still stops its servers and workers (the finally blocks).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    facts = {
        "revision": code_revision()[0],
        "machine": f"{os.cpu_count()} CPUs",
        "load_before": load_average(),
    }
    when = datetime.now(UTC)
    with contextlib.ExitStack() as stack:
        logs = Path(args.logs) if args.logs else Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-scaling-")))
        logs.mkdir(parents=True, exist_ok=True)
        redis_url = stack.enter_context(reserved_redis_url(db=args.redis_db))
        primary, replica = stack.enter_context(servers(args.database))
        with psycopg.connect(primary.url("postgres")) as conn:
            facts.update(server_facts(conn))
        runs = measure(args, primary.url(args.database), replica.url(args.database),
                       redis_url, logs)
    facts["load_after"] = load_average()
    return publish(HEADING, render(when, facts, runs, args), write=not args.no_write)


if __name__ == "__main__":
    raise SystemExit(main())
