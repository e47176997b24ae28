"""Regression: a live worker whose commit waits on a lock must keep its task's lease.

Fixed by: claims and renewals skip rows locked by a commit in progress (``FOR
UPDATE SKIP LOCKED`` in ``controlplane/storage/statements.py``), and keep-lease
commits extend the lease to the time of writing (``Next.lease_until``). What used to happen:

A worker's heartbeat renews its lease every lease/3 seconds (DESIGN §7), so a worker
that is alive keeps its task, however long its phase runs. But while one of its own
commits waits on a lock (here: on the plan document's row, as a migration or any
long transaction touching the table would make it), the heartbeat cannot renew:

1. the commit has already locked the task's row (``SELECT ... FOR UPDATE`` in the
   builder), so the heartbeat's ``UPDATE kernel_task SET lease_until = ...`` queues
   behind the worker's own transaction;
2. that renewal carries a ``lease_until`` computed before it queued, so when it runs
   at last it writes a time that may already be past;
3. the intent commit keeps the lease without extending it.

The lease lapses, the sweep re-dispatches the task, and another worker's claim
queues on the row as well. The moment the intent commit lands, that claim takes the
task (epoch 2), while the first worker, which knows nothing of it, goes on to call
the provider. Two workers now run the same notice at once; the first one's receipt
commit is rejected as stale ("lease lost"). The provider's idempotency key keeps it
to one email here, but the takeover of a live worker is what the lease must prevent.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from kernel import Status

from .harness import Stack, document_lock, lock_waiters, wait_for

RECIPIENT = "ana@example.com"
pytestmark = [pytest.mark.chaos, pytest.mark.slow]


def waiting(conn: psycopg.Connection[Any], statement: str) -> list[str]:
    """The statements starting with ``statement`` that wait on a lock right now."""
    conn.execute("SELECT pg_stat_clear_snapshot()")
    rows = conn.execute(
        "SELECT query FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock' AND starts_with(query, %s)",
        [statement],
    ).fetchall()
    return [row[0] for row in rows]


def queued_renewal(conn: psycopg.Connection[Any]) -> datetime | None:
    """The lease_until that the heartbeat's waiting renewal will write, once it runs."""
    for query in waiting(conn, "UPDATE kernel_task SET lease_until = "):
        if found := re.search(r"lease_until = '([^']+)'", query):
            return datetime.fromisoformat(found[1])
    return None


def test_a_live_worker_keeps_its_task_while_its_commit_waits_on_a_lock(stack: Stack) -> None:
    stack.beat()
    session_id, batch_id = stack.send_batch([RECIPIENT])
    assert stack.advance(batch_id)
    [notice] = stack.notices(session_id).values()

    with document_lock(session_id, "email-plan", batch_id) as lock:
        first = stack.worker("hands1", queues="hands")
        wait_for(lambda: stack.task(notice.id).status is Status.RUNNING and lock_waiters(lock),
                 "the intent commit to wait on the plan document's row")
        lease_until = stack.task(notice.id).lease_until
        assert lease_until is not None
        # The heartbeat ticks every lease/3 s: 2 s past the lease, its next renewal would
        # have run out as well.
        wait_for(lambda: datetime.now(UTC) > lease_until + timedelta(seconds=2),
                 "the last renewal to run out")
        # Today the heartbeat's next renewal waits on the task's row, carrying a deadline
        # computed before it queued: let that deadline pass too.
        wait_for(lambda: (renewal := queued_renewal(lock)) is None
                 or datetime.now(UTC) > renewal + timedelta(seconds=0.5),
                 "the queued renewal to be stale")
        # A second worker, which also runs the sweeps, is sent to the task; today its
        # claim queues on the task's row too.
        second = stack.worker("w2", queues="default,hands")
        wait_for(lambda: waiting(lock, "WITH claimed AS (UPDATE kernel_task")
                 or second.advances(), "the second worker to try to claim the notice")
    batch = stack.wait_terminal(batch_id)
    assert batch.outcome is not None and batch.outcome["kind"] == "succeeded", batch.outcome
    assert [m["to"] for m in stack.admin.messages()] == [RECIPIENT]

    # The first worker was alive throughout and its intent commit landed: the task is
    # still its own. Today a second claim takes it over (epoch 2) and the first worker
    # finds out only when its receipt commit is rejected.
    assert stack.task(notice.id).epoch == 1
    assert "lease lost" not in first.output()
