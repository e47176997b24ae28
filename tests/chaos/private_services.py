"""Private Postgres and Redis servers that a chaos test may stop and start at will.

The shared services (Postgres on 5432, Redis on 6379) serve every other test and
every other session on the machine: nothing here ever touches them. Each test that
needs to restart a service starts its own, on a free port, with its data in a
temporary folder that is removed afterwards, and points its workers, its beat and
its own reads at them.

- :class:`PrivatePostgres` (``controlplane.dev.postgres``): a throwaway cluster, no
  fsync. :func:`postgres_template` initialises and migrates one cluster (seconds);
  :func:`private_postgres` starts a copy of it for one test (well under a second).
- :class:`PrivateRedis` (``controlplane.dev.redis_server``): without persistence, a
  restart loses every queued message, as a crashed broker would.
- :class:`PrivateStack`: a :class:`~tests.chaos.harness.Stack` whose workers and
  beat use those two, and whose test-side reads go through plain psycopg to the
  private database (never through pytest-django's test database).
- :func:`point_celery_at`: re-point this process's Celery app at another Redis
  (its pools otherwise stay on the first broker URL it published to).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from controlplane.dev.postgres import (
    DATABASE,
    NoServerUser,
    PrivatePostgres,
    create_and_migrate,
    postgres_bin,
    private_folder,
    server_user,
)
from controlplane.dev.processes import ROOT, start_provider, wait_for
from controlplane.dev.redis_server import PrivateRedis, redis_server

from .harness import Stack, stack_env

__all__ = ["DATABASE", "PrivatePostgres", "create_and_migrate", "private_folder"]


def _server_user() -> str | None:
    """The user to run Postgres as; skips the test where there is none."""
    try:
        return server_user()
    except NoServerUser as exc:
        pytest.skip(str(exc))


@contextmanager
def postgres_template() -> Iterator[PrivatePostgres]:
    """A stopped, migrated cluster whose data folder :func:`private_postgres` copies.

    initdb and ``manage.py migrate`` take several seconds on a busy machine; copying
    the result takes well under one. The cluster is stopped cleanly, so a copy starts
    without crash recovery.
    """
    bin_dir = postgres_bin()
    if bin_dir is None:
        pytest.skip("no Postgres server binaries (initdb, postgres) found")
    user = _server_user()
    with private_folder("chaos-pg-template-", user) as folder:
        server = PrivatePostgres(folder, bin_dir, user)
        try:
            server.init()
            server.start()
            create_and_migrate(server)
            server.stop("fast")
            yield server
        finally:
            server.stop("immediate")


@contextmanager
def private_postgres(template: PrivatePostgres, **options: Any) -> Iterator[PrivatePostgres]:
    """A running copy of ``template`` in a folder of its own; stopped and deleted afterwards.
    ``options``: :class:`PrivatePostgres` fields (``listen``, ``settings``)."""
    with private_folder("chaos-pg-", template.user) as folder:
        server = PrivatePostgres(folder, template.bin_dir, template.user, **options)
        try:
            # cp -a keeps the owner (the server user) and the 0700 mode Postgres insists on.
            subprocess.run(["cp", "-a", str(template.data), str(server.data)], check=True)
            server.start()
            yield server
        finally:
            server.stop("immediate")


@contextmanager
def private_redis(listen: tuple[str, ...] = ()) -> Iterator[PrivateRedis]:
    binary = redis_server()
    if binary is None:
        pytest.skip("no redis-server binary found")
    with private_folder("chaos-redis-", None) as folder:
        server = PrivateRedis(folder, binary, listen=listen)
        try:
            server.start()
            yield server
        finally:
            server.stop()


class PrivateStack(Stack):
    """A chaos stack on private services; reads go through psycopg, writes through the CLI.

    The test process holds no Django connection and no Celery producer for these
    services: a batch is started with ``manage.py send_notices`` (what an operator
    would run), and state is read with plain SQL on a fresh connection each time,
    so a read during or after a restart needs no reconnection logic.
    """

    postgres: PrivatePostgres
    broker: PrivateRedis

    def __post_init__(self) -> None:  # no in-process kernel: nothing on the shared DB
        pass

    def manage(self, *args: str, timeout: float = 60) -> str:
        done = subprocess.run(
            [sys.executable, "manage.py", *args], cwd=ROOT, env=self.env,
            capture_output=True, text=True, timeout=timeout,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    def send_batch(self, recipients: list[str], channel: str = "http") -> tuple[str, str]:
        out = self.manage("send_notices", *recipients, "--subject", "Notice",
                          "--body", "Approved text.", "--channel", channel,
                          "--actor", "user:chaos")
        fields = dict(line.split(" ", 1) for line in out.split("\n") if " " in line)
        return fields["session"], fields["task"]

    def query(self, sql: str, params: Any = None) -> list[dict[str, Any]]:
        with self.postgres.connect() as conn:
            return conn.execute(sql, params).fetchall()

    def row(self, task_id: str) -> dict[str, Any]:
        rows = self.query("SELECT * FROM kernel_task WHERE id = %s", [task_id])
        assert rows, f"no task {task_id}"
        return rows[0]

    def rows(self, session_id: str) -> list[dict[str, Any]]:
        return self.query(
            "SELECT * FROM kernel_task WHERE session_id = %s ORDER BY created_seq, id",
            [session_id],
        )

    def notice_rows(self, session_id: str) -> dict[str, dict[str, Any]]:
        return {r["input"]["to"]: r for r in self.rows(session_id) if r["kind"] == "send-notice"}

    def history(self, session_id: str, task_id: str) -> list[dict[str, Any]]:
        """The task's summary items, in commit order, each with its commit's ``seq``.

        The operator CLI's query (``manage.py tasks TASK_ID``): JSON containment,
        ``summary @> [{"id": task_id}]``.
        """
        rows = self.query(
            "SELECT seq, summary FROM kernel_commit WHERE session_id = %s "
            "AND summary @> %s ORDER BY seq",
            [session_id, Jsonb([{"id": task_id}])],
        )
        return [{"seq": row["seq"], **item} for row in rows for item in row["summary"]
                if item.get("id") == task_id]

    def wait_done(self, task_id: str, timeout: float = 60.0) -> dict[str, Any]:
        """Poll until the task is terminal; a read that fails (server restarting) is a no."""

        def check() -> dict[str, Any] | None:
            try:
                found = self.row(task_id)
            except psycopg.OperationalError:
                return None
            return found if found["status"] == "terminal" else None

        found: dict[str, Any] = wait_for(check, f"task {task_id} to finish", timeout=timeout,
                                         every=0.2)
        return found


@contextmanager
def private_stack(
    tmp: Path, template: PrivatePostgres, *, listen: tuple[str, ...] = (), **provider_flags: Any
) -> Iterator[PrivateStack]:
    """Private Postgres (a copy of ``template``) + Redis + provider; the test starts
    workers and beat. ``listen``: addresses besides loopback where all three answer."""
    with ExitStack() as stack:
        postgres = stack.enter_context(private_postgres(template, listen=listen))
        broker = stack.enter_context(private_redis(listen))
        host = "0.0.0.0" if listen else "127.0.0.1"
        provider = stack.enter_context(start_provider(host=host, **provider_flags))
        env = stack_env(postgres.url(), broker.url, provider)
        running = PrivateStack(tmp, provider, broker.url, env)
        running.postgres = postgres
        running.broker = broker
        stack.callback(running.close)  # workers and beat go first, then the servers
        yield running


def point_celery_at(redis_url: str) -> None:
    """Make this process's Celery app publish to ``redis_url`` from now on.

    Setting ``broker_url`` alone is not enough once the app has published: its
    connection pool and producer pool stay bound to the first URL (in a pytest
    process: the Redis database of the first chaos test). Dropping them, as Celery
    itself does after a fork, makes the next publish (a dispatch after a commit, a
    remote-control broadcast) open connections to the new URL.

    kombu also keeps every pool in a registry by connection parameters, and hands a
    pool it closed back out for the same URL ("Acquire on closed pool"), so the
    registry is cleared too, as Celery does after a fork.
    """
    from kombu import pools

    from controlplane.celery import app

    app.conf.broker_url = redis_url
    pools.reset()  # closes every pool and forgets it
    app._pool = None
    app.amqp._producer_pool = None
