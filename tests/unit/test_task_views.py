"""What the kernel says about a task for people: its shown status and what it waits on."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from kernel import (
    SHOWN_STATUSES,
    Draft,
    InMemoryStorage,
    JoinPolicy,
    Kernel,
    ManualClock,
    Outcome,
    Registry,
    Run,
    Scheduler,
    Status,
    Task,
    Transition,
    WaitsOn,
)

AT = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)


def task(status: Status = Status.PENDING, **changes: object) -> Task:
    base = Task("task_1", "sess_1", "kind", 1, {}, status, "go", {}, 1, 1)
    return replace(base, **changes)  # type: ignore[arg-type]


def test_shown_statuses_are_the_lifecycle_then_the_outcomes() -> None:
    assert SHOWN_STATUSES == (
        "pending", "running", "waiting", "sleeping", "completing",
        "succeeded", "failed", "cancelled", "faulted",
    )  # fmt: skip


@pytest.mark.parametrize("status", [s for s in Status if s is not Status.TERMINAL])
def test_an_unfinished_task_shows_its_status(status: Status) -> None:
    shown = task(status).shown_status
    assert shown == str(status) and type(shown) is str and shown in SHOWN_STATUSES


@pytest.mark.parametrize("outcome", list(Outcome))
def test_a_terminal_task_shows_its_outcome(outcome: Outcome) -> None:
    shown = task(Status.TERMINAL, outcome={"kind": str(outcome), "result": None}).shown_status
    assert shown == str(outcome) and shown in SHOWN_STATUSES


def test_a_terminal_task_without_an_outcome_shows_terminal() -> None:
    assert task(Status.TERMINAL).shown_status == "terminal"


def test_what_a_task_waits_on_and_how_it_reads() -> None:
    signal = task(Status.WAITING, wait={"signal": "resolution"}).waits_on
    assert signal == WaitsOn("signal", signal="resolution")
    assert signal.describe() == "signal resolution (an operator)"

    join = task(Status.WAITING, wait={"deps": ["a", "b", "c"], "policy": "fail_fast"}).waits_on
    assert join == WaitsOn("tasks", count=3, policy=JoinPolicy.FAIL_FAST, task_ids=("a", "b", "c"))
    assert join.describe() == "3 tasks (fail_fast)"
    legacy = task(Status.WAITING, wait={"deps": ["a"]}).waits_on  # no policy stored: the default
    assert legacy.describe() == "1 tasks (all_settled)"

    cancelled = task(Status.SLEEPING, wake_at=AT, cancel={"reason": "stop"}).waits_on
    assert cancelled == WaitsOn("interrupted_phase", until=AT)
    assert cancelled.describe() == "the interrupted phase to return (at most until 05:06:07)"

    asleep = task(Status.SLEEPING, wake_at=AT).waits_on
    assert asleep == WaitsOn("time", until=AT)
    assert asleep.describe() == "until 05:06:07"

    for idle in (task(), task(Status.RUNNING), task(Status.SLEEPING), task(Status.TERMINAL)):
        assert idle.waits_on == WaitsOn() and idle.waits_on.kind is None
        assert idle.waits_on.describe() == ""


def test_the_views_of_tasks_the_kernel_ran() -> None:
    registry = Registry()

    @registry.task("child")
    class Child:
        initial = "go"

        def go(self, run: Run) -> Transition:
            return run.wait_for("resolution", then="done")

        def done(self, run: Run) -> Transition:
            return run.succeed()

    @registry.task("parent")
    class Parent:
        initial = "go"

        def go(self, run: Run) -> Transition:
            return run.wait_all([run.spawn("child", {}), run.spawn("child", {})], then="nap")

        def nap(self, run: Run) -> Transition:
            return run.sleep(60, then="done")

        def done(self, run: Run) -> Transition:
            return run.succeed()

    clock = ManualClock()
    kernel = Kernel(InMemoryStorage(), registry, clock)
    handle = kernel.create_session()
    draft = Draft()
    parent_id = draft.create_task("parent", {})
    handle.commit(draft)
    scheduler = Scheduler(kernel, "w1", 30.0)
    scheduler.run_until_idle()

    parent = kernel.task(parent_id)
    children = [kernel.task(i) for i in parent.waits_on.task_ids]
    assert (parent.shown_status, parent.waits_on.describe()) == ("waiting", "2 tasks (all_settled)")
    assert [c.shown_status for c in children] == ["waiting", "waiting"]
    assert children[0].waits_on.describe() == "signal resolution (an operator)"

    for child in children:
        draft = Draft(actor="user:olga")
        draft.signal(child.id, "resolution", {})
        handle.commit(draft)
    scheduler.run_until_idle()
    parent = kernel.task(parent_id)
    assert parent.shown_status == "sleeping" and parent.waits_on.kind == "time"
    assert parent.waits_on.until == clock.now() + timedelta(seconds=60)
    assert {kernel.task(c.id).shown_status for c in children} == {"succeeded"}

    clock.advance(61)
    scheduler.run_until_idle()
    parent = kernel.task(parent_id)
    assert (parent.shown_status, parent.waits_on.kind) == ("succeeded", None)
