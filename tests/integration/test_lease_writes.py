"""A lease's end is the holder's to move: a commit by anyone else that writes the task
(a signal queued for it, a cancel asked of it) leaves ``lease_until`` as it was. The
Postgres storage adds to a lease its commit keeps the time the transaction spent (so a
commit stuck behind a lock does not land with a lease already run out); it added that to
every task it wrote, so a client's signal moved a lapsed lease a moment into the future,
where the in-memory reference leaves it (the differential property test found it)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from controlplane.storage import PostgresStorage
from kernel import Draft, Kernel, ManualClock, Registry, Run, SessionHandle, Transition

pytestmark = pytest.mark.django_db(transaction=True)


def kernel() -> Kernel:
    registry = Registry()

    @registry.task("held")
    class Held:
        initial = "go"

        def go(self, run: Run) -> Transition:
            return run.succeed({})

    return Kernel(PostgresStorage(), registry, ManualClock())


def held(k: Kernel) -> tuple[SessionHandle, str]:
    """A session with a "held" task committed, not claimed yet."""
    handle = k.create_session()
    draft = Draft(actor="user:t")
    task_id = draft.create_task("held", {})
    handle.commit(draft)
    return handle, task_id


@pytest.mark.parametrize("lapsed", [False, True])
def test_a_signal_to_a_running_task_leaves_its_lease_where_it_was(lapsed: bool) -> None:
    k = kernel()
    handle, task_id = held(k)
    now = k.clock.now()
    until = now if lapsed else now + timedelta(seconds=30)
    claimed = k.storage.claim(task_id, "w1", now, until)
    assert claimed is not None and claimed.lease_until == until
    signal = Draft(actor="user:op")
    signal.signal(task_id, "nudge", {"by": "op"})
    handle.commit(signal)
    assert k.storage.task(task_id).lease_until == until


def test_a_renewal_waits_for_a_commit_holding_the_tasks_row() -> None:
    """A commit that holds the task's row (a client's signal to the running task, say)
    does not make the holder's renewal say its lease was lost: it waits for the commit,
    as the in-memory reference, which has no row locks, renews at once."""
    import threading
    import time

    import psycopg
    from django.db import connection

    k = kernel()
    _, task_id = held(k)
    now = k.clock.now()
    claimed = k.storage.claim(task_id, "w1", now, now + timedelta(seconds=30))
    assert claimed is not None
    params = connection.get_connection_params()
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        with psycopg.connect(**params) as other, other.transaction():
            other.execute("SELECT 1 FROM kernel_task WHERE id = %s FOR UPDATE", [task_id])
            locked.set()
            release.wait(5)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert locked.wait(5)
        threading.Timer(0.3, release.set).start()
        started = time.monotonic()
        assert k.storage.renew(task_id, "w1", claimed.epoch, now + timedelta(seconds=60))
        assert time.monotonic() - started >= 0.2
    finally:
        release.set()
        holder.join()
    assert k.storage.task(task_id).lease_until == now + timedelta(seconds=60)
    assert not k.storage.renew(task_id, "w2", claimed.epoch, now + timedelta(seconds=90))

    # Held past the renewal's lock timeout: not renewed this beat, and nothing broken.
    locked.clear()
    release.clear()
    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert locked.wait(5)
        assert not k.storage.renew(task_id, "w1", claimed.epoch, now + timedelta(seconds=90))
    finally:
        release.set()
        holder.join()
    assert k.storage.renew(task_id, "w1", claimed.epoch, now + timedelta(seconds=90))
    assert k.storage.task(task_id).lease_until == now + timedelta(seconds=90)
