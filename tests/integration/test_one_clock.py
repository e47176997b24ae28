"""One clock (issue 11 point 10): claims, due times and lease expiry use the database's.

A worker whose own clock is off by seconds must neither take a lease that has not
expired (its clock runs ahead) nor leave a due sleeper waiting (its clock runs behind).
The skew is simulated under the process's clock (``kernel.clock``'s ``datetime``); the
runtime is rebuilt so that its worker reads time as a freshly started one would.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

import kernel.clock
from controlplane.worker.runtime import forget_runtime, runtime
from kernel import Draft
from kernel.records import Task

pytestmark = pytest.mark.django_db(transaction=True)


def skewed(by: timedelta) -> type[datetime]:
    class Skewed(datetime):
        @classmethod
        def now(cls, tz=None):  # type: ignore[no-untyped-def, override]
            return datetime.now(tz) + by

    return Skewed


@pytest.fixture
def fresh_runtime() -> Iterator[None]:
    forget_runtime()
    yield
    runtime().worker.close()
    forget_runtime()


def database_now() -> datetime:
    with connection.cursor() as cur:
        cur.execute("SELECT clock_timestamp()")
        return cur.fetchone()[0]


def pending_task() -> str:
    kernel_ = runtime().kernel
    handle = kernel_.create_session()
    draft = Draft(actor="user:test")
    task_id = draft.create_task("send-batch", {"recipients": []})
    handle.commit(draft)
    return task_id


def worker_with(clock_skew: timedelta, monkeypatch: pytest.MonkeyPatch) -> list[Task]:
    """Skew this process's clock, then build the runtime; what its worker claims."""
    monkeypatch.setattr(kernel.clock, "datetime", skewed(clock_skew))
    forget_runtime()
    monkeypatch.setattr(runtime().dispatcher, "deliver", lambda task, queue: None)
    claimed: list[Task] = []
    monkeypatch.setattr(runtime().worker, "run_claimed", lambda task: claimed.append(task) or True)
    return claimed


def test_a_worker_whose_clock_runs_ahead_does_not_take_a_live_lease(
    fresh_runtime: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runtime().dispatcher, "deliver", lambda task, queue: None)
    task_id = pending_task()
    now = database_now()
    assert runtime().kernel.storage.claim(task_id, "alive", now, now + timedelta(seconds=5))
    claimed = worker_with(timedelta(seconds=10), monkeypatch)
    assert not runtime().worker.advance(task_id)  # the lease has seconds left
    assert claimed == []
    assert runtime().kernel.storage.task(task_id).lease_owner == "alive"


def test_a_worker_whose_clock_runs_behind_runs_a_due_sleeper(
    fresh_runtime: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runtime().dispatcher, "deliver", lambda task, queue: None)
    task_id = pending_task()
    with connection.cursor() as cur:  # a sleeper whose time came a second ago
        cur.execute(
            "UPDATE kernel_task SET status = 'sleeping', wake_at = clock_timestamp() - "
            "interval '1 second' WHERE id = %s",
            [task_id],
        )
    claimed = worker_with(-timedelta(seconds=10), monkeypatch)
    assert runtime().worker.advance(task_id)
    [task] = claimed
    # the lease it took runs from the database's now, not from ten seconds ago
    assert task.lease_until is not None
    assert task.lease_until > database_now() + runtime().worker.lease - timedelta(seconds=2)


def test_the_database_clock_follows_the_server_not_the_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(kernel.clock, "datetime", skewed(timedelta(seconds=-30)))
    clock = runtime().kernel.clock.__class__()
    assert abs(clock.now() - database_now()) < timedelta(seconds=1)
    assert abs(datetime.now(UTC) - database_now()) < timedelta(seconds=1)  # test sanity
