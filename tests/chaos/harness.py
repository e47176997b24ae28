"""Real processes for chaos tests: Celery workers and beat, the email provider.

Everything here is a real process that a test can SIGKILL. Workers and beat talk
to the test database of pytest-django and to a Redis database number of their
own, so that two test runs on one machine do not steal each other's messages.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import redis
from django.conf import settings
from django.db import connection

from controlplane.notices.provider import ProviderAdmin
from controlplane.notices.provider_process import RunningProvider, start_provider
from controlplane.storage import PostgresStorage
from kernel import Draft, Kernel, Status, SystemClock, Task
from kernel.dispatch import Dispatcher

ROOT = Path(__file__).resolve().parents[2]
CELERY = [sys.executable, "-m", "celery", "-A", "controlplane.celery"]
T = TypeVar("T")


def wait_for(check: Callable[[], T], what: str, timeout: float = 30.0, every: float = 0.05) -> T:
    """Poll ``check`` until it returns something truthy; fail with ``what`` otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(every)


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def kill(self) -> None:
        """SIGKILL: no cleanup, no acks, no goodbye - a crash."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(timeout=10)

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@dataclass
class Stack:
    """A test's private world: database, Redis db, provider, workers, beat."""

    tmp: Path
    provider: RunningProvider
    redis_url: str
    env: dict[str, str]
    processes: list[Process] = field(default_factory=list)
    kernel: Kernel = field(init=False)

    def __post_init__(self) -> None:
        from controlplane.execution import deliver
        from controlplane.registry import build_registry

        self.kernel = Kernel(PostgresStorage(), build_registry(), SystemClock())
        self.kernel.after_commit(Dispatcher(self.kernel, deliver).after_commit)

    @property
    def admin(self) -> ProviderAdmin:
        return ProviderAdmin(self.provider.url)

    def _spawn(self, name: str, args: list[str], **env: str) -> Process:
        log = self.tmp / f"{name}.log"
        popen = subprocess.Popen(
            args,
            cwd=ROOT,
            env={**self.env, **env},
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        process = Process(name, popen, log)
        self.processes.append(process)
        return process

    def worker(self, name: str = "w1", queues: str = "default,hands,brain", **env: str) -> Process:
        process = self._spawn(
            name,
            [*CELERY, "worker", "-P", "solo", "-Q", queues, "-n", f"{name}@chaos",
             "--without-mingle", "--without-gossip", "--without-heartbeat", "-l", "info"],
            **env,
        )
        wait_for(lambda: "ready." in process.output() or process.popen.poll() is not None,
                 f"worker {name} to start")
        assert process.popen.poll() is None, process.output()
        return process

    def beat(self, name: str = "beat") -> Process:
        return self._spawn(
            name,
            [*CELERY, "beat", "-s", str(self.tmp / f"{name}-schedule"), "-l", "info"],
        )

    def send_batch(self, recipients: list[str], channel: str = "http") -> tuple[str, str]:
        """Commit a send-batch task, as the API or CLI would; returns (session, task)."""
        handle = self.kernel.create_session(metadata={"title": "chaos"})
        draft = Draft(actor="user:chaos")
        task_id = draft.create_task(
            "send-batch",
            {"recipients": recipients, "subject": "Notice", "body": "Approved text.",
             "channel": channel},
        )
        handle.commit(draft)  # its dispatch goes to the broker after the commit
        return handle.id, task_id

    def task(self, task_id: str) -> Task:
        found = self.kernel.storage.task(task_id)
        assert found is not None
        return found

    def tasks(self, session_id: str) -> list[Task]:
        return self.kernel.storage.session_tasks(session_id)

    def notices(self, session_id: str) -> dict[str, Task]:
        return {t.input["to"]: t for t in self.tasks(session_id) if t.kind == "send-notice"}

    def wait_terminal(self, task_id: str, timeout: float = 60.0) -> Task:
        return wait_for(lambda: (t := self.task(task_id)).status is Status.TERMINAL and t,
                        f"task {task_id} to finish", timeout=timeout)

    def posts(self, to: str) -> list[dict[str, Any]]:
        return [r for r in self.admin.requests() if r["method"] == "POST" and r.get("to") == to]

    def lookups(self, key: str) -> list[dict[str, Any]]:
        return [r for r in self.admin.requests()
                if r["method"] == "GET" and r.get("idempotency_key") == key]

    def close(self) -> None:
        for process in self.processes:
            process.kill()


@contextmanager
def session_lock(session_id: str) -> Iterator[psycopg.Connection[Any]]:
    """Hold a session's commit order from outside, so the next commit blocks on it."""
    params = settings.DATABASES["default"]
    conn = psycopg.connect(
        dbname=connection.settings_dict["NAME"], user=params["USER"] or None,
        host=params["HOST"] or None, port=params["PORT"] or None, autocommit=False,
    )
    try:
        conn.execute("SELECT 1 FROM kernel_session WHERE id = %s FOR UPDATE", [session_id])
        yield conn
    finally:
        conn.rollback()
        conn.close()


def waiting_on_lock(session_lock_conn: psycopg.Connection[Any]) -> bool:
    """Whether some other backend is blocked behind our session lock right now."""
    row = session_lock_conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        "AND datname = current_database()"
    ).fetchone()
    return bool(row and row[0])


@contextmanager
def chaos_stack(tmp: Path, **provider_flags: Any) -> Iterator[Stack]:
    """Start the provider and point workers at the test database and a fresh Redis db."""
    from controlplane.celery import app

    db = random.randint(1, 15)
    base = settings.REDIS_URL.rsplit("/", 1)[0]
    redis_url = f"{base}/{db}"
    redis.Redis.from_url(redis_url).flushdb()
    app.conf.broker_url = redis_url
    params = settings.DATABASES["default"]
    database_url = (
        f"postgresql://{params['USER'] or 'postgres'}@{params['HOST'] or '127.0.0.1'}:"
        f"{params['PORT'] or 5432}/{connection.settings_dict['NAME']}"
    )
    with start_provider(**provider_flags) as provider:
        env = {
            **os.environ,
            "DATABASE_URL": database_url,
            "REDIS_URL": redis_url,
            "EMAIL_PROVIDER_URL": provider.url,
            "EMAIL_PROVIDER_TIMEOUT": "30",
            "KERNEL_LEASE_SECONDS": "3",
            "KERNEL_REDELIVER_SECONDS": "3",
            "DJANGO_CONN_MAX_AGE": "60",
            "PYTHONUNBUFFERED": "1",
        }
        stack = Stack(tmp, provider, redis_url, env)
        try:
            yield stack
        finally:
            stack.close()
            connection.close()
