"""Real processes for chaos tests: Celery workers and beat, the email provider.

Everything here is a real process that a test can SIGKILL. Workers and beat talk
to the test database of pytest-django and to a Redis database number of their
own, so that two test runs on one machine do not steal each other's messages.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import redis
from django.conf import settings
from django.db import connection

from controlplane.dev.ports import reserved_redis_url
from controlplane.dev.processes import (
    CeleryWorker,
    Process,
    RunningProvider,
    celery_beat,
    celery_worker,
    process_env,
    start_provider,
    wait_for,
)
from controlplane.dev.provider_admin import ProviderAdmin
from controlplane.storage import PostgresStorage
from kernel import Draft, Kernel, Status, SubmissionStatus, SystemClock, Task, Worker
from kernel.agent import submit
from kernel.dispatch import Dispatcher, recovery_queue
from kernel.records import Entry, Submission
from tests.databases import url_of_test_database
from tests.model_stand_in import ModelStandIn, models_env

RECIPIENTS = [f"{name}@example.com" for name in ("ana", "ben", "cai", "dee", "eve")]
SWEEP_SENT = "Sending due task sweep"  # beat's log line for each sweep it sends
# Short leases and redelivery, so that a kill is recovered from within a test's time.
STACK_ENV = {
    "EMAIL_PROVIDER_TIMEOUT": "30",
    "KERNEL_LEASE_SECONDS": "3",
    "KERNEL_REDELIVER_SECONDS": "3",
    "DJANGO_CONN_MAX_AGE": "60",
}


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
        from controlplane.reference.registry import build_registry

        self.kernel = Kernel(PostgresStorage(), build_registry(), SystemClock())
        self.kernel.after_commit(Dispatcher(self.kernel, self.deliver).after_commit)

    def deliver(self, task_id: str, queue: str) -> None:
        """``controlplane.worker.execution.deliver``, to this stack's Redis db.

        The test process's Celery app keeps the producer pool of the first broker it
        published to, so a later test's commits would otherwise land in an earlier
        test's Redis db: name the connection each time.
        """
        from controlplane.celery import app
        from controlplane.worker.execution import advance

        with app.connection_for_write(self.redis_url) as conn:
            advance.apply_async(args=[task_id], queue=queue, retry=False, connection=conn)

    @property
    def admin(self) -> ProviderAdmin:
        return ProviderAdmin(self.provider.url)

    def _add(self, process: Process, wait: bool) -> Process:
        self.processes.append(process.spawn())
        if wait:
            self.wait_ready(process)
        return process

    def worker(
        self, name: str = "w1", queues: str = "default,hands,brain", *, wait: bool = True,
        via: Sequence[str] = (), **env: str,
    ) -> CeleryWorker:
        """Start a worker; unless ``wait`` is false, return once it consumes its queues.
        ``via`` runs it elsewhere (``ip netns exec NS``), ``env`` adds to its environment."""
        worker = celery_worker(self.tmp, name, {**self.env, **env}, queues=queues, host="chaos",
                               via=via)
        self._add(worker, wait)
        return worker

    def beat(
        self, name: str = "beat", *, wait: bool = False, via: Sequence[str] = (), **env: str
    ) -> Process:
        """Start beat; with ``wait``, return once it has sent its first sweep. ``via`` and
        ``env`` as for :meth:`worker`."""
        return self._add(celery_beat(self.tmp, {**self.env, **env}, name=name,
                                     ready_line=SWEEP_SENT, via=via), wait)

    def wait_ready(self, *processes: Process) -> None:
        """Wait for processes started with ``wait=False`` (they start side by side)."""
        for process in processes:
            process.wait_ready(timeout=60)

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

    def converse(
        self, text: str, request_id: str = "req-1", model: str = "remote"
    ) -> tuple[str, str, Submission]:
        """Start a conversation and submit ``text`` to it, as the API would; returns
        (session, conversation, submission)."""
        handle = self.kernel.create_session(metadata={"title": "agent chaos"})
        draft = Draft(actor="user:chaos")
        conversation = draft.create_conversation()
        handle.commit(draft)
        submitted = submit(handle, conversation, {"text": text, "model": model}, request_id)
        assert submitted.submission is not None, submitted
        return handle.id, conversation, submitted.submission

    def submission(self, submission_id: str) -> Submission:
        found = self.kernel.storage.submission(submission_id)
        assert found is not None
        return found

    def wait_answered(self, submission_id: str, timeout: float = 60.0) -> Submission:
        return wait_for(
            lambda: (s := self.submission(submission_id)).status is SubmissionStatus.ANSWERED and s,
            f"submission {submission_id} to be answered", timeout=timeout,
        )

    def entries(self, conversation_id: str) -> list[Entry]:
        return self.kernel.entries(conversation_id)

    def tool_runs(self) -> list[str]:
        """The runs of the chaos tools (``tests.chaos.agent_tools``) so far, by name."""
        runs = self.tmp / "runs"
        return [line.split()[0] for line in runs.read_text().splitlines()] if runs.exists() else []

    def release_tools(self) -> None:
        """Let held chaos tools return (those still running, and every later one)."""
        (self.tmp / "release").touch()

    def advance(self, task_id: str) -> bool:
        """Run ``task_id`` in the test process as a worker would (claim, phases, commits,
        dispatches after each commit), for the steps a test does not kill: it saves
        starting a worker just to plan a batch."""
        return Worker(self.kernel, "chaos-test", lease_seconds=30).advance(task_id)

    def wait_inside_send(self, session_id: str, to: str, who: str) -> Task:
        """Wait until ``to``'s notice has committed its intent and the provider holds
        its message (a send stalled after storing it): the notice, as it is then."""
        def inside() -> Task | None:
            notice = self.notices(session_id).get(to)
            held = notice is not None and notice.phase == "confirm" and any(
                m["to"] == to for m in self.admin.messages())
            return notice if held else None

        # The notice the wait saw: read again, a short stall may have ended meanwhile.
        return wait_for(inside, f"{who} to be inside {to}'s (stalled) send")

    def task(self, task_id: str) -> Task:
        found = self.kernel.storage.task(task_id)
        assert found is not None
        return found

    def tasks(self, session_id: str) -> list[Task]:
        return self.kernel.storage.session_tasks(session_id)

    def notices(self, session_id: str) -> dict[str, Task]:
        return {t.input["to"]: t for t in self.tasks(session_id) if t.kind == "send-notice"}

    def history(self, task_id: str) -> list[tuple[str, str]]:
        """(status, phase) of the task after each commit that touched it, from the log."""
        commits = self.kernel.commits_after(self.task(task_id).session_id, 0)
        return [
            (item["status"], item["phase"])
            for commit in commits
            for item in commit.summary
            if item.get("type") == "task" and item["id"] == task_id
        ]

    def queued(self, queue: str) -> list[str]:
        """The task ids of the "advance" messages waiting in ``queue`` and in its recovery
        queue, where the sweep sends (not yet taken by a worker), from this stack's Redis db."""
        ids = []
        broker = redis.Redis.from_url(self.redis_url)
        for raw in [*broker.lrange(queue, 0, -1), *broker.lrange(recovery_queue(queue), 0, -1)]:
            message = json.loads(raw)
            if message["headers"]["task"] == "controlplane.advance":
                args, _kwargs, _embed = json.loads(base64.b64decode(message["body"]))
                ids.append(args[0])
        return ids

    def head_seq(self, session_id: str) -> int:
        session = self.kernel.storage.session(session_id)
        assert session is not None
        return session.head_seq

    def holder(self, task: str | Task) -> Process:
        """The worker process that holds a task's lease (owner ids are host:pid): read now
        by id, or as a copy of the task already read shows it."""
        found = self.task(task) if isinstance(task, str) else task
        owner = found.lease_owner
        assert owner is not None, f"nobody holds {found.id}"
        pid = int(owner.rsplit(":", 1)[1])
        return next(p for p in self.processes if p.pid == pid)

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
        # The test is over: a provider still holding a stalled send would make a
        # graceful stop wait for it.
        self.provider.kill()


def operator_client(username: str) -> Any:
    """A Django test client logged in as a new member of the operator group."""
    from django.contrib.auth.models import Group, User
    from django.test import Client

    client = Client()
    account = User.objects.create_user(username)
    account.groups.add(Group.objects.get_or_create(name="operator")[0])
    client.force_login(account)
    return client


def sweeps_sent(beat: Process) -> int:
    """How many sweeps a beat process has sent so far, by its log."""
    return beat.output().count(SWEEP_SENT)


def succeeded(task: Task) -> bool:
    return task.status is Status.TERMINAL and (task.outcome or {}).get("kind") == "succeeded"


def assert_sent_once_each(stack: Stack, batch: Task, recipients: list[str]) -> None:
    """The end state every HTTP chaos test must reach, whatever was killed on the way:
    the provider holds exactly one message per recipient, under that notice's operation
    id, and the batch succeeded with those receipts."""
    messages = stack.admin.messages()
    assert sorted(m["to"] for m in messages) == sorted(recipients), messages
    notices = stack.notices(batch.session_id)
    assert {m["to"]: m["idempotency_key"] for m in messages} == {
        to: notices[to].input["operation_id"] for to in recipients
    }
    assert all(succeeded(notices[to]) for to in recipients), notices
    assert batch.outcome is not None and batch.outcome["kind"] == "succeeded", batch.outcome
    assert batch.outcome["result"]["sent"] == len(recipients)
    receipts = batch.outcome["result"]["receipts"]
    assert {to: receipts[to]["id"] for to in recipients} == {m["to"]: m["id"] for m in messages}


@contextmanager
def row_lock(sql: str, params: list[Any]) -> Iterator[psycopg.Connection[Any]]:
    """Run ``sql`` (a ``SELECT ... FOR UPDATE``) in a transaction of our own and hold
    its locks until the block ends, so that whoever needs those rows next blocks."""
    db = settings.DATABASES["default"]
    conn = psycopg.connect(
        dbname=connection.settings_dict["NAME"], user=db["USER"] or None,
        host=db["HOST"] or None, port=db["PORT"] or None, autocommit=False,
    )
    try:
        assert conn.execute(sql, params).fetchone() is not None, f"no row to lock: {params}"
        yield conn
    finally:
        conn.rollback()
        conn.close()


@contextmanager
def session_lock(session_id: str) -> Iterator[psycopg.Connection[Any]]:
    """Hold a session's commit order from outside, so the next commit blocks on it."""
    with row_lock("SELECT 1 FROM kernel_session WHERE id = %s FOR UPDATE", [session_id]) as conn:
        yield conn


@contextmanager
def document_lock(session_id: str, kind: str, key: str) -> Iterator[psycopg.Connection[Any]]:
    """Hold a document's row: a commit that writes the document blocks in its write step,
    after it took the session's commit order and wrote its commit row."""
    with row_lock(
        "SELECT 1 FROM kernel_document WHERE session_id = %s AND kind = %s AND key = %s "
        "FOR UPDATE",
        [session_id, kind, key],
    ) as conn:
        yield conn


def waiting_on_lock(session_lock_conn: psycopg.Connection[Any]) -> bool:
    """Whether some other backend is blocked behind our lock (any of ``row_lock``'s) now."""
    return bool(lock_waiters(session_lock_conn))


def session_held(conn: psycopg.Connection[Any], session_id: str) -> bool:
    """Whether another transaction holds the session's commit order right now.

    Asked with ``NOWAIT`` in a savepoint of ``conn``'s open transaction, so that the
    locks ``conn`` holds are kept either way.
    """
    try:
        with conn.transaction():
            conn.execute(
                "SELECT 1 FROM kernel_session WHERE id = %s FOR UPDATE NOWAIT", [session_id]
            )
    except psycopg.errors.LockNotAvailable:
        return True
    return False


def lock_waiters(conn: psycopg.Connection[Any]) -> list[int]:
    """The server pids of the backends of this database that wait on a lock right now.

    Postgres reads pg_stat_activity once per transaction and serves that snapshot until
    the transaction ends; ``conn`` holds its transaction open (it holds the lock), so
    the snapshot is dropped before each look.
    """
    conn.execute("SELECT pg_stat_clear_snapshot()")
    rows = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        "AND datname = current_database()"
    ).fetchall()
    return [row[0] for row in rows]


def backends_gone(pids: list[int]) -> bool:
    """Whether these server backends have ended (a killed client's backend ends, rolling
    back its open transaction, once it next tries to talk to the client)."""
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", [pids])
        return cur.fetchone()[0] == 0


@contextmanager
def chaos_stack(
    tmp: Path, env: dict[str, str] | None = None, **provider_flags: Any
) -> Iterator[Stack]:
    """Start the provider and point workers at the test database and a fresh Redis db;
    ``env`` adds to every process's environment."""
    from controlplane.celery import app

    with reserved_redis_url(settings.REDIS_URL) as redis_url:
        app.conf.broker_url = redis_url
        with _stack(tmp, redis_url, env or {}, provider_flags) as stack:
            yield stack


def lines(stack: Stack, name: str) -> list[str]:
    """The lines the workers' tools wrote to ``name`` in the stack's folder (none yet: [])."""
    path = stack.tmp / name
    return path.read_text().splitlines() if path.exists() else []


def gated_stack(tmp: Path, model: ModelStandIn, **env: str) -> Iterator[Stack]:
    """A chaos stack whose workers ask ``model`` and offer the agent tools and the gated
    ones (``tests.chaos.gated_tools``); ``env`` adds to it. Yield from it in a fixture."""
    with chaos_stack(tmp, env={
        **models_env(model.url),
        "ASSISTANT_TOOL_MODULES": "tests.chaos.agent_tools,tests.chaos.gated_tools",
        "AGENT_TOOL_DIR": str(tmp), **env,
    }) as running:
        yield running


def stack_env(
    database_url: str, redis_url: str, provider: RunningProvider, **extra: str
) -> dict[str, str]:
    """The environment of a chaos stack's workers and beat."""
    return process_env(database_url, redis_url, EMAIL_PROVIDER_URL=provider.url,
                       **STACK_ENV, **extra)


@contextmanager
def _stack(
    tmp: Path, redis_url: str, extra_env: dict[str, str], provider_flags: dict[str, Any]
) -> Iterator[Stack]:
    database_url = url_of_test_database()
    with start_provider(**provider_flags) as provider:
        stack = Stack(tmp, provider, redis_url, stack_env(database_url, redis_url, provider,
                                                          **extra_env))
        try:
            yield stack
        finally:
            stack.close()
            connection.close()


def consume(stack: Stack, worker: Process, *queues: str) -> None:
    """Make a running worker consume more queues (Celery remote control), each with its
    recovery queue, as a worker started on them does (``consume_recovery_queues``)."""
    from controlplane.celery import app

    from .private_services import point_celery_at  # it imports this module

    point_celery_at(stack.redis_url)  # not an earlier test's Redis database
    destination = f"{worker.name}@chaos"
    for queue in [q for name in queues for q in (name, recovery_queue(name))]:
        replies = app.control.add_consumer(queue, destination=[destination], reply=True,
                                           timeout=10)
        assert replies and destination in replies[0], replies
