"""What an email of a batch costs must not grow with the batch (issue 12): pinned by
what is read and how, not by a timing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

from controlplane.storage import PostgresStorage
from controlplane.storage import connection as storage_connection
from controlplane.storage import statements as sql
from kernel import Draft, Kernel, ManualClock, Registry, Run, Status, Transition, Worker
from kernel.dispatch import Dispatcher


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


def burst(
    size: int, *, marked_in_commit: bool,
    advance_queue: Callable[[str], None] = lambda queue: None,
) -> Kernel:
    """A kernel whose dispatcher sends queue messages for bursts, and a burst of ``size``
    notices committed: marked by the commit itself (``Dispatcher.attach``, as deployed)
    or after it by the dispatcher's ``mark_burst``."""
    kernel = Kernel(PostgresStorage(), registry(), ManualClock())
    dispatcher = Dispatcher(kernel, lambda task_id, queue: None,
                            advance_queue=advance_queue, messages=1)
    if marked_in_commit:
        dispatcher.attach()
    else:
        kernel.after_commit(dispatcher.after_commit)
    handle = kernel.create_session()
    draft = Draft()
    for i in range(size):
        draft.create_task("notice", {"to": f"r{i}@example.com"})
    handle.commit(draft)
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM kernel_dispatch WHERE woken")
        assert cur.fetchone()[0] == size
    return kernel


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("marked_in_commit", [True, False], ids=["in-commit", "by-dispatcher"])
def test_the_burst_claim_reads_a_fresh_bursts_oldest_rows_in_order_not_all_sorted(
    marked_in_commit: bool,
) -> None:
    """On tables whose statistics say they are empty (a fresh database), the claim's
    plan sorted every due burst row of a burst, and hashed every runnable task, on each
    claim. A burst analyses the dispatch table, whether its commit marked its rows woken
    (as the deployed dispatcher does) or the dispatcher did before its queue messages,
    so the claim reads the oldest rows from its index in order; and, the task table being
    as fresh, that too, so the claim looks their tasks up one by one by id."""
    with connection.cursor() as cur:
        cur.execute("ANALYZE kernel_dispatch")  # empty: what a fresh database's say
        cur.execute("ANALYZE kernel_task")
    kernel = burst(2000, marked_in_commit=marked_in_commit)
    now = kernel.clock.now()
    with connection.cursor() as cur:
        # The tasks too: with statistics that say the table is empty, the runnable index
        # costs the planner as much as the primary key for a lookup by id.
        cur.execute(sql.TASK_ANALYZED_ROWS)
        assert cur.fetchone()[0] >= 2000
        cur.execute(
            "EXPLAIN " + sql.CLAIM_BURST,
            {"queue": "hands", "owner": "w", "now": now, "until": now},
        )
        plan = "\n".join(row[0] for row in cur.fetchall())
    assert "Index Scan using dispatch_woken_due" in plan, plan
    assert "Bitmap Index Scan on dispatch_woken_due" not in plan, plan
    assert "task_runnable" not in plan and "Hash" not in plan, plan  # no scan of runnables
    claimed = kernel.storage.claim_burst("hands", "w", now, now)
    assert claimed is not None and claimed.status is Status.RUNNING


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("marked_in_commit", [True, False], ids=["in-commit", "by-dispatcher"])
def test_a_burst_leaves_the_dispatch_tables_statistics_fresh(marked_in_commit: bool) -> None:
    """The claim's plan follows the statistics: a burst analyses the dispatch table
    before its queue messages go out. A burst its commit marked woken (the deployed
    dispatcher's way) was never analysed: the statistics of the 10,000-email benchmark's
    table were those of a table never analysed, and the claim sorted every remaining
    row (a bitmap scan) from the middle of the batch on."""

    def analysed_rows() -> float:
        with connection.cursor() as cur:
            cur.execute("SELECT reltuples FROM pg_class WHERE oid = 'kernel_dispatch'::regclass")
            return float(cur.fetchone()[0])

    with connection.cursor() as cur:
        cur.execute("ANALYZE kernel_dispatch")
    seen_by_message: list[float] = []
    burst(
        600, marked_in_commit=marked_in_commit,
        advance_queue=lambda q: seen_by_message.append(analysed_rows()),
    )
    assert seen_by_message == [600.0]
