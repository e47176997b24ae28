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
from kernel import Draft, Kernel, ManualClock, Registry, Run, Transition

pytestmark = pytest.mark.django_db(transaction=True)


def kernel() -> Kernel:
    registry = Registry()

    @registry.task("held")
    class Held:
        initial = "go"

        def go(self, run: Run) -> Transition:
            return run.succeed({})

    return Kernel(PostgresStorage(), registry, ManualClock())


@pytest.mark.parametrize("lapsed", [False, True])
def test_a_signal_to_a_running_task_leaves_its_lease_where_it_was(lapsed: bool) -> None:
    k = kernel()
    handle = k.create_session()
    draft = Draft(actor="user:t")
    task_id = draft.create_task("held", {})
    handle.commit(draft)
    now = k.clock.now()
    until = now if lapsed else now + timedelta(seconds=30)
    claimed = k.storage.claim(task_id, "w1", now, until)
    assert claimed is not None and claimed.lease_until == until
    signal = Draft(actor="user:op")
    signal.signal(task_id, "nudge", {"by": "op"})
    handle.commit(signal)
    assert k.storage.task(task_id).lease_until == until
