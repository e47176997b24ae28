"""A worker keeps its database connection from one task message to the next, and
checks it by using it.

Celery's Django fix-up closes every connection before and after each task unless
``CELERY_DB_REUSE_MAX`` says otherwise; each ``advance`` then opened a new connection
(a backend fork: 1.5 ms idle, 6 ms on a busy machine, the largest part of issue 12's
dispatch latency) and lost the commit path's prepared statements."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from celery.fixups.django import DjangoWorkerFixup
from django.db import close_old_connections, connection, connections

from controlplane.celery import app
from controlplane.worker.execution import advance, advance_queue
from controlplane.worker.runtime import forget_runtime, runtime
from kernel import Draft, Status, Task

pytestmark = pytest.mark.django_db(transaction=True)


def test_task_messages_reuse_the_connection() -> None:
    fixup = DjangoWorkerFixup(app)
    connection.ensure_connection()
    raw = connection.connection
    for _ in range(1000):  # what Celery runs around each task message
        fixup.on_task_prerun(sender=advance)
        close_old_connections()  # as our tasks do, first and last
        with connection.cursor() as cur:
            cur.execute("SELECT 1")
        close_old_connections()
        fixup.on_task_postrun(sender=advance)
    assert connection.connection is raw


def drop_this_connection() -> None:
    """Postgres ends this thread's connection from another one, as a restarting server
    would; Django's wrapper does not know yet."""
    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        [pid] = cur.fetchone()
    other = connections["default"].copy()
    try:
        with other.cursor() as cur:
            cur.execute("SELECT pg_terminate_backend(%s)", [pid])
    finally:
        other.close()


def test_a_connection_that_failed_is_still_replaced() -> None:
    raw = connection.connection
    drop_this_connection()
    close_old_connections()  # the next task's start: the health check finds it dead
    with connection.cursor() as cur:
        cur.execute("SELECT 1")
    assert connection.connection is not raw


@pytest.fixture
def worker_runtime(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Task]]:
    """The process's runtime, fresh; what its worker claims (not run), nothing sent."""
    forget_runtime()
    monkeypatch.setattr(runtime().dispatcher, "deliver", lambda task, queue: None)
    claimed: list[Task] = []
    monkeypatch.setattr(runtime().worker, "run_claimed", lambda task: claimed.append(task) or True)
    yield claimed
    runtime().worker.close()
    forget_runtime()


def pending_task() -> str:
    handle = runtime().kernel.create_session()
    draft = Draft(actor="user:test")
    task_id = draft.create_task("send-batch", {"recipients": []})
    handle.commit(draft)
    return task_id


def test_an_advance_message_costs_no_health_check_round_trip(
    worker_runtime: list[Task], monkeypatch: pytest.MonkeyPatch
) -> None:
    checks: list[bool] = []
    wrapper = type(connections["default"])
    usable = wrapper.is_usable
    monkeypatch.setattr(wrapper, "is_usable", lambda db: checks.append(True) or usable(db))
    first, second = pending_task(), pending_task()
    assert advance(first)
    assert advance(second)
    assert [t.id for t in worker_runtime] == [first, second]
    assert checks == []


def test_an_advance_after_postgres_dropped_the_connection_claims_on_a_new_one(
    worker_runtime: list[Task],
) -> None:
    task_id = pending_task()
    raw = connection.connection
    drop_this_connection()  # between two messages
    assert advance(task_id)
    assert [t.id for t in worker_runtime] == [task_id]
    assert connection.connection is not raw


def test_a_queue_message_after_postgres_dropped_the_connection_claims_on_a_new_one(
    worker_runtime: list[Task],
) -> None:
    """A queue message's first statement, the burst claim, meets a connection that died
    since the last message: nothing was claimed, so it claims again on a new connection,
    as an ``advance`` message does, rather than leave the burst to the sweep."""
    handle = runtime().kernel.create_session()
    draft = Draft(actor="user:test")
    task_id = draft.create_task("send-batch", {"recipients": []})
    written = handle.commit(draft)
    runtime().kernel.storage.mark_burst([d.id for d in written.dispatches])
    raw = connection.connection
    drop_this_connection()  # between two messages
    assert advance_queue(written.new_tasks[0].queue) == 1
    assert runtime().kernel.storage.task(task_id).status is not Status.PENDING
    assert connection.connection is not raw
