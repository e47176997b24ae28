"""What an email of a batch costs must not grow with the batch (issue 12): pinned by
what is read and how, not by a timing."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.storage import PostgresStorage
from controlplane.storage import connection as storage_connection
from kernel import Draft, Kernel, ManualClock, Registry, Run, Status, Transition, Worker


def registry() -> Registry:
    reg = Registry()

    @reg.task("batch")
    class Batch:
        initial = "fan_out"

        def fan_out(self, run: Run) -> Transition:
            notices = [run.spawn("notice", {"to": to}) for to in run.input["recipients"]]
            return run.wait_all(notices, then="done")

        def done(self, run: Run) -> Transition:
            return run.succeed(len(run.outcomes()))

    @reg.task("notice", queue="hands")
    class Notice:
        initial = "send"

        def send(self, run: Run) -> Transition:
            run.commit(phase="sent")  # the intent commit
            return run.succeed("sent")

        def sent(self, run: Run) -> Transition:
            return run.succeed("sent")

    return reg


@pytest.mark.django_db(transaction=True)
def test_the_ending_of_a_batch_member_reads_the_batch_row_whole_once_not_each_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The batch's row holds every member's id several times (its input, checkpoint and
    join): decoding it at each member's ending made each email O(n), a batch O(n*n).
    It is read whole once per version of it; each ending reads its version only."""
    kernel = Kernel(PostgresStorage(), registry(), ManualClock())
    handle = kernel.create_session()
    draft = Draft()
    batch = draft.create_task("batch", {"recipients": [f"r{i}@example.com" for i in range(200)]})
    handle.commit(draft)
    worker = Worker(kernel, "w1")
    assert worker.advance(batch)
    notices = kernel.task(batch).wait_deps
    decoded: list[str] = []
    from_sql = storage_connection.TASK.from_sql

    def counting(row: Any) -> Any:
        task = from_sql(row)
        decoded.append(task.id)
        return task

    monkeypatch.setattr(storage_connection.TASK, "from_sql", counting)
    for notice in notices[:-1]:
        assert worker.advance(notice)
    assert decoded.count(batch) == 1, decoded.count(batch)
    assert kernel.task(batch).status is Status.WAITING
    assert worker.advance(notices[-1])
    assert kernel.task(batch).status is Status.PENDING
    assert worker.advance(batch)
    assert kernel.task(batch).outcome == {"kind": "succeeded", "result": 200}
