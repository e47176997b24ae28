"""A phase that continues inline (``Next`` keeping the lease, no other write) is
committed in one round trip, built from the worker's copy of its task
(``Prefetch.known``); the task row is written only if nothing changed it since that
copy, and otherwise the commit is built again from what the database holds. These
tests change the task, or the session, behind the worker's back between its commits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from controlplane.storage import PostgresStorage
from kernel import Draft, Kernel, ManualClock, Registry, Run, Transition, Worker
from kernel.records import Status

from .round_trips import counting_pipelines, kernel_with, log_is_whole

pytestmark = pytest.mark.django_db(transaction=True)


def start(kernel: Kernel) -> tuple[str, str]:
    handle = kernel.create_session()
    draft = Draft()
    task_id = draft.create_task("steps", {})
    handle.commit(draft)
    return handle.id, task_id


def test_each_inline_commit_and_the_ending_are_one_round_trip() -> None:
    kernel = kernel_with(phases=4)
    session_id, task_id = start(kernel)
    worker = Worker(kernel, "w1")
    with counting_pipelines() as pipelines, CaptureQueriesContext(connection) as captured:
        assert worker.advance(task_id)
    statements = [q["sql"].split(" AS ")[0] for q in captured]
    # After the claim: 3 inline commits of one statement each (nothing else: no BEGIN,
    # no COMMIT, no read), then the ending, one pipeline: BEGIN, the head, the ending
    # (its task alone: no child, no waiter), COMMIT.
    first = statements.index("WITH head")
    assert statements[first:] == ["WITH head"] * 3 + [
        "BEGIN", "WITH head", "WITH written", "COMMIT"], statements
    assert pipelines[0] == 1
    task = kernel.task(task_id)
    assert task.status is Status.TERMINAL and task.outcome["result"] == {"done": 4}
    log_is_whole(kernel, session_id)
    # Each commit's task summary and the task's updated_seq agree with the log.
    assert task.updated_seq == log_is_whole(kernel, session_id)[-1]


def test_a_copy_guarded_commit_writes_only_the_task_columns_its_phase_changed() -> None:
    """The guard ensures the row still holds the copy, so the one statement sets what
    the phase changed and what a renewal moves, not the task's input (which may be large:
    sent, parsed and stored again at every step) nor its other unchanged columns; the
    ending likewise. What the task then holds is what the phases made of it."""
    kernel = kernel_with(phases=3)
    handle = kernel.create_session()
    draft = Draft()
    task_id = draft.create_task("steps", {"brief": "x" * 5000})
    handle.commit(draft)
    with CaptureQueriesContext(connection) as captured:
        assert Worker(kernel, "w1").advance(task_id)
    updates = [q["sql"].split(", moved AS (UPDATE kernel_task SET ")[1].split(" WHERE ")[0]
               for q in captured if ", moved AS (UPDATE kernel_task SET " in q["sql"]]
    assert len(updates) == 3, updates  # two inline commits and the ending
    for assignments in updates:
        written = {a.split(" = ")[0] for a in assignments.split(", ")}
        assert "input" not in written and "signals" not in written, assignments
        assert {"updated_seq", "lease_until"} <= written, assignments
    assert "checkpoint" in updates[0] and "status" in updates[-1]
    task = kernel.task(task_id)
    assert task.input == {"brief": "x" * 5000} and task.outcome["result"] == {"done": 3}
    log_is_whole(kernel, session_id=handle.id)


def test_inline_commits_take_the_seq_the_database_gives() -> None:
    """Other commits of the session land between the phases: no gap, no reuse."""

    def meddle(kernel: Kernel, task_id: str, done: int) -> None:
        task = kernel.task(task_id)
        kernel.open(task.session_id).commit(Draft(actor="user:other"))

    kernel = kernel_with(meddle, phases=4)
    session_id, task_id = start(kernel)
    assert Worker(kernel, "w1").advance(task_id)
    seqs = log_is_whole(kernel, session_id)
    actors = [c.actor for c in kernel.commits_after(session_id, 0)]
    assert actors.count("user:other") == 4 and actors.count(f"task:{task_id}") == 4
    assert kernel.task(task_id).updated_seq == seqs[-1]


def test_a_task_changed_since_the_copy_is_committed_from_the_database() -> None:
    """A signal lands on the running task during its phase: the worker's copy is stale,
    so its inline commit must not overwrite the row with it (the signal would be lost)."""

    def meddle(kernel: Kernel, task_id: str, done: int) -> None:
        if done == 2:
            draft = Draft(actor="user:ann")
            draft.signal(task_id, "approved", {"by": "ann"})
            kernel.open(kernel.task(task_id).session_id).commit(draft)

    kernel = kernel_with(meddle, phases=4)
    session_id, task_id = start(kernel)
    with counting_pipelines() as pipelines:
        assert Worker(kernel, "w1").advance(task_id)
    task = kernel.task(task_id)
    assert task.signals == {"approved": {"by": "ann"}}
    assert task.outcome["result"] == {"done": 4}
    # The refused one-statement commit is made again the usual way: 2 round trips, as is
    # the signal's own commit; the ending is one.
    assert pipelines[0] == 2 + 2 + 1
    log_is_whole(kernel, session_id)


def test_a_lease_revoked_since_the_copy_refuses_the_commit() -> None:
    """A cancel revokes the lease during phase 2: its Next must not land."""

    def meddle(kernel: Kernel, task_id: str, done: int) -> None:
        if done == 2:
            draft = Draft(actor="user:ann")
            draft.cancel(task_id, "changed my mind")
            kernel.open(kernel.task(task_id).session_id).commit(draft)

    kernel = kernel_with(meddle, phases=4)
    session_id, task_id = start(kernel)
    Worker(kernel, "w1").advance(task_id)
    task = kernel.task(task_id)
    assert task.checkpoint == {"done": 1}  # phase 2's result was refused
    assert task.cancel is not None and task.status is not Status.RUNNING
    log_is_whole(kernel, session_id)


def test_another_owner_at_the_same_epoch_refuses_the_commit() -> None:
    """A server crash lost this worker's unflushed claim, and another worker's claim got
    the same epoch (simulated by rewriting the owner): the inline commit must not land,
    nor write this worker's name back over the other's lease."""

    def meddle(kernel: Kernel, task_id: str, done: int) -> None:
        if done == 2:
            with connection.cursor() as cur:
                cur.execute("UPDATE kernel_task SET lease_owner = 'w2' WHERE id = %s", [task_id])

    kernel = kernel_with(meddle, phases=4)
    session_id, task_id = start(kernel)
    Worker(kernel, "w1").advance(task_id)
    task = kernel.task(task_id)
    assert task.checkpoint == {"done": 1}  # phase 2's result was refused
    assert task.status is Status.RUNNING and task.lease_owner == "w2"
    log_is_whole(kernel, session_id)


def test_a_lost_connection_on_the_one_round_trip_is_unavailable_not_a_fault() -> None:
    """The connection drops before the inline commit is sent: nothing landed, and the
    worker abandons the task for a restart (its lease runs out), never failing it."""

    def meddle(kernel: Kernel, task_id: str, done: int) -> None:
        if done == 2:
            connection.connection.close()

    kernel = kernel_with(meddle, phases=4)
    session_id, task_id = start(kernel)
    Worker(kernel, "w1").advance(task_id)
    connection.close()
    task = kernel.task(task_id)
    assert task.status is Status.RUNNING and task.checkpoint == {"done": 1}
    log_is_whole(kernel, session_id)


def test_a_connection_lost_once_the_statement_was_sent_is_uncertain_and_it_landed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The one statement is its own transaction: once sent, a lost connection leaves its
    outcome unknown. The handle is poisoned (invariant 6) and the worker abandons the
    task; the commit did land, and a later claim resumes after it."""
    from controlplane.storage import statements as sql

    cut = [False]

    def wrapper(execute: Callable[..., Any], query: str, *args: Any) -> Any:
        result = execute(query, *args)
        # statements.inline_commit, whatever task columns the phase changed
        lone_next = query.startswith(sql.HEAD) and ", moved AS (UPDATE" in query \
            and "entered AS" not in query
        if lone_next and not cut[0]:
            cut[0] = True
            connection.connection.close()  # the answer never comes back
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return result

    kernel = kernel_with(phases=4)
    session_id, task_id = start(kernel)
    worker = Worker(kernel, "w1")
    with connection.execute_wrapper(wrapper):
        worker.advance(task_id)
    assert cut[0]
    connection.close()
    task = kernel.task(task_id)
    assert task.status is Status.RUNNING and task.checkpoint == {"done": 1}  # it landed
    assert worker._handles == {}  # the poisoned handle was dropped
    assert "session handle poisoned" in caplog.text  # not "storage unavailable"
    log_is_whole(kernel, session_id)


def ending_kernel() -> Kernel:
    """``lone`` ends in one phase; ``joiner`` waits for the task named in its input;
    ``owner`` spawns an owned ``sleeper`` (which sleeps) and ends in its next phase."""
    registry = Registry()

    @registry.task("lone")
    class Lone:
        initial = "go"

        def go(self, run: Run) -> Transition:
            return run.succeed({"lone": True})

    @registry.task("joiner")
    class Joiner:
        initial = "wait"

        def wait(self, run: Run) -> Transition:
            return run.wait_all([run.input["on"]], then="done")

        def done(self, run: Run) -> Transition:
            return run.succeed(run.outcomes())

    @registry.task("owner")
    class Owner:
        initial = "spawn"

        def spawn(self, run: Run) -> Transition:
            run.spawn("sleeper", {})
            return run.next("end")

        def end(self, run: Run) -> Transition:
            return run.succeed({})

    @registry.task("sleeper")
    class Sleeper:
        initial = "nap"

        def nap(self, run: Run) -> Transition:
            return run.sleep(3600)

    return Kernel(PostgresStorage(), registry, ManualClock())


def test_an_ending_whose_task_has_a_waiter_wakes_it_the_usual_way() -> None:
    """An ending is built assuming its task has no waiter; a task waiting for it makes
    the one-round-trip write refuse (nothing lands), and the usual path wakes it."""
    kernel = ending_kernel()
    handle = kernel.create_session()
    draft = Draft()
    lone = draft.create_task("lone", {})
    joiner = draft.create_task("joiner", {"on": lone})
    handle.commit(draft)
    worker = Worker(kernel, "w1")
    assert worker.advance(joiner)
    assert kernel.task(joiner).status is Status.WAITING
    with counting_pipelines() as pipelines:
        assert worker.advance(lone)
    assert pipelines[0] == 1 + 2  # refused in one, then the usual two
    assert kernel.task(lone).status is Status.TERMINAL
    assert kernel.task(joiner).status is Status.PENDING  # woken by the ending
    assert worker.advance(joiner)
    assert kernel.task(joiner).outcome["result"] == {lone: {"kind": "succeeded",
                                                            "result": {"lone": True}}}
    log_is_whole(kernel, handle.id)


def test_an_ending_whose_task_owns_a_running_child_completes_the_usual_way() -> None:
    kernel = ending_kernel()
    handle = kernel.create_session()
    draft = Draft()
    owner = draft.create_task("owner", {})
    handle.commit(draft)
    worker = Worker(kernel, "w1")
    assert worker.advance(owner)  # spawns the sleeper, then ends: refused, then usual
    [child] = [t for t in kernel.storage.session_tasks(handle.id) if t.kind == "sleeper"]
    assert kernel.task(owner).status is Status.COMPLETING
    assert kernel.task(child.id).cancel is not None  # the owner's end cancels it
    log_is_whole(kernel, handle.id)
