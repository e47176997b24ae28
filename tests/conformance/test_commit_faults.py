"""What the fast commit paths must survive, on both storages: values a storage cannot
hold, leases that lapse while their holder lives, a thread pool in one worker, an
uncertain commit beside other leases' endings, and knock-on cancels of held endings.

Each test here failed on the engine before its fix: the held-back endings wedged on a
value Postgres refuses, a stale holder dropped the new holder's lease, an uncertain
commit abandoned other leases' endings, a fail_fast sibling ran after its join had
failed, and orphaned dispatch rows starved a queue's burst claims.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from kernel import (
    CommitRejected,
    Draft,
    JoinPolicy,
    Registry,
    Run,
    Status,
    StorageUnavailable,
    Transition,
    Worker,
)
from kernel.dispatch import Dispatcher
from kernel.storage import CLAIM_WINDOW

from .brokers import Waker
from .definitions import Effects, make_registry
from .world import World

NUL = "binary\u0000tail"
NOT_JSON = datetime(2026, 1, 1, tzinfo=UTC)


def registry_with(bad: dict[str, Any]) -> Registry:
    """``bad``: the value a task named ``input["bad"]`` puts where its input says."""
    registry = make_registry(Effects())

    @registry.task("bad")
    class Bad:
        initial = "go"

        def go(self, run: Run) -> Transition:
            where, value = run.input["where"], bad[run.input["value"]]
            if where == "result":
                return run.succeed({"out": value})
            if where == "checkpoint":
                return run.next("later", {"kept": value})
            if where == "document":
                run.set("log", "main", ["x"], value)
                return run.succeed("ok")
            raise AssertionError(where)

        def later(self, run: Run) -> Transition:
            return run.succeed("later")

    @registry.task("good")
    class Good:
        initial = "go"

        def go(self, run: Run) -> Transition:
            if run.input.get("intent"):
                run.commit(phase="done", checkpoint={"intent": True})
                return run.succeed("after intent")
            return run.succeed("fine")

        def done(self, run: Run) -> Transition:
            return run.succeed("fine")

    return registry


BAD = {"nul": NUL, "datetime": NOT_JSON, "nan": float("nan"), "surrogate": "half \ud800"}


def burst_setup(world: World, registry: Registry) -> Any:
    kernel = world.kernel(registry)
    broker = Waker()
    Dispatcher(kernel, broker.deliver, advance_queue=broker.wake, messages=1).attach()
    return kernel


@pytest.mark.parametrize("value", ["nul", "datetime", "nan", "surrogate"])
@pytest.mark.parametrize("where", ["result", "checkpoint", "document"])
def test_a_value_no_storage_can_hold_faults_its_own_task_once_with_the_field_named(
    world: World, where: str, value: str
) -> None:
    registry = registry_with(BAD)
    kernel = world.kernel(registry)
    handle = kernel.create_session()
    draft = Draft()
    task_id = draft.create_task("bad", {"where": where, "value": value})
    handle.commit(draft)
    worker = Worker(kernel, "w")

    assert worker.advance(task_id)
    task = world.storage.task(task_id)
    assert task.status is Status.TERMINAL and task.restarts == 0
    # A result or checkpoint is refused when the phase returns (the task faults); a
    # document write, at the phase's own call (the phase raised: it fails).
    assert task.outcome["kind"] == ("failed" if where == "document" else "faulted")
    error = task.outcome["error"]
    field = {"result": "result", "checkpoint": "checkpoint", "document": "document log/main"}
    assert field[where] in error and "cannot be stored" in error
    assert "\u0000" not in error
    assert worker.held == {}


def test_a_value_refused_in_the_draft_names_the_record_and_field() -> None:
    draft = Draft()
    conversation = draft.create_conversation()
    with pytest.raises(CommitRejected, match=r"entry payload.*\['text'\].*NUL"):
        draft.append(conversation, "user", {"text": NUL})
    with pytest.raises(CommitRejected, match=r"task input.*\['at'\].*datetime"):
        draft.create_task("step", {"at": NOT_JSON})


@pytest.mark.parametrize("carried", [False, True], ids=["joint-endings", "carried-by-intent"])
def test_a_bad_ending_held_back_with_others_wedges_nothing(world: World, carried: bool) -> None:
    """Held endings committed together, or carried by another task's intent commit:
    the bad one faults alone, the others land, nothing stays held or renewed."""
    registry = registry_with(BAD)
    kernel = burst_setup(world, registry)
    handle = kernel.create_session()
    draft = Draft()
    first = draft.create_task("good", {})
    bad = draft.create_task("bad", {"where": "result", "value": "datetime"})
    last = draft.create_task("good", {"intent": carried})
    handle.commit(draft)
    worker = Worker(kernel, "w")

    assert worker.advance_queue("default", batch=10, budget=60) == (3, False)
    tasks = {t.id: t for t in world.storage.session_tasks(handle.id)}
    assert tasks[first].outcome["kind"] == "succeeded"
    assert tasks[last].outcome["kind"] == "succeeded", tasks[last].outcome
    assert tasks[bad].outcome["kind"] == "faulted"
    assert "result" in tasks[bad].outcome["error"]
    assert worker.held == {}


def test_a_stale_holder_leaves_the_new_holders_lease_held(world: World) -> None:
    """Two threads of one worker: the first's lease lapses and the second claims the
    task; the first's refused commit must not drop the second's lease from the
    heartbeat."""
    registry = Registry()
    second_running, release_second = threading.Event(), threading.Event()
    box: dict[str, Any] = {}

    @registry.task("twice")
    class Twice:
        initial = "go"

        def go(self, run: Run) -> Transition:
            if run.task.epoch == 1:
                world.clock.advance(31)  # the lease lapses while this phase runs
                other = threading.Thread(target=box["worker"].advance, args=(run.task_id,))
                box["thread"] = other
                other.start()
                assert second_running.wait(10)
                return run.succeed("stale")
            second_running.set()
            assert release_second.wait(10)
            return run.succeed("second")

    kernel = world.kernel(registry)
    handle = kernel.create_session()
    draft = Draft()
    task_id = draft.create_task("twice", {})
    handle.commit(draft)
    worker = box["worker"] = Worker(kernel, "w")

    worker.advance(task_id)  # the stale run's commit is refused
    held = [lease.task.epoch for lease in worker.held.values()]
    release_second.set()
    box["thread"].join(10)
    assert held == [2]
    task = world.storage.task(task_id)
    assert task.outcome["result"] == "second" and task.epoch == 2
    assert worker.held == {}


def test_an_uncertain_commit_abandons_only_what_it_carried(world: World) -> None:
    """A held ending of one task, then another task of the same session whose inline
    commit's outcome is unknown: the held ending is still committed."""
    registry = Registry()

    @registry.task("quick")
    class Quick:
        initial = "go"

        def go(self, run: Run) -> Transition:
            if run.input.get("uncertain"):
                world.faults.armed["after_commit"] = RuntimeError("connection lost at COMMIT")
                return run.next("more")
            return run.succeed("quick")

        def more(self, run: Run) -> Transition:
            return run.succeed("more")

    kernel = burst_setup(world, registry)
    handle = kernel.create_session()
    draft = Draft()
    first = draft.create_task("quick", {})
    uncertain = draft.create_task("quick", {"uncertain": True})
    handle.commit(draft)
    worker = Worker(kernel, "w")

    worker.advance_queue("default", batch=10, budget=60)
    tasks = {t.id: t for t in world.storage.session_tasks(handle.id)}
    assert tasks[first].outcome is not None and tasks[first].outcome["kind"] == "succeeded"
    assert tasks[uncertain].status is Status.RUNNING  # unknown: left to its lease's expiry
    assert worker.held == {}


def test_a_failed_child_cancels_its_fail_fast_siblings_before_they_start(world: World) -> None:
    registry = Registry()
    ran: list[str] = []

    @registry.task("parent")
    class Parent:
        initial = "spawn"

        def spawn(self, run: Run) -> Transition:
            ids = [run.spawn("child", {"n": n}) for n in range(6)]
            return run.wait_all(ids, "done", policy=JoinPolicy.FAIL_FAST)

        def done(self, run: Run) -> Transition:
            return run.succeed("done")

    @registry.task("child")
    class Child:
        initial = "go"

        def go(self, run: Run) -> Transition:
            ran.append(f"child {run.input['n']}")
            if run.input["n"] == 0:
                return run.fail("the first child fails")
            return run.succeed("ok")

    kernel = burst_setup(world, registry)
    handle = kernel.create_session()
    draft = Draft()
    parent = draft.create_task("parent", {})
    handle.commit(draft)
    worker = Worker(kernel, "w")
    assert worker.advance(parent)
    worker.advance_queue("default", batch=10, budget=60)

    assert ran == ["child 0"]
    outcomes = sorted(t.outcome["kind"] for t in world.storage.session_tasks(handle.id)
                      if t.kind == "child")
    assert outcomes == ["cancelled"] * 5 + ["failed"]


def test_a_terminal_task_keeps_no_dispatch_row_when_its_lease_lapsed_first(
    world: World,
) -> None:
    """The sweep gives an expired lease a row; the holder, alive after all, commits its
    ending: the row goes with the commit that ended the task."""
    registry = Registry()

    @registry.task("paused")
    class Paused:
        initial = "go"

        def go(self, run: Run) -> Transition:
            world.clock.advance(31)
            Dispatcher(run_kernel["k"], lambda task, queue: None).sweep()
            return run.succeed("late but alive")

    run_kernel: dict[str, Any] = {}
    kernel = run_kernel["k"] = world.kernel(registry)
    handle = kernel.create_session()
    draft = Draft()
    task_id = draft.create_task("paused", {})
    handle.commit(draft)
    worker = Worker(kernel, "w")

    assert worker.advance(task_id)
    assert world.storage.task(task_id).outcome["result"] == "late but alive"
    assert dispatch_rows(world, task_id) == 0


def dispatch_rows(world: World, task_id: str) -> int:
    storage = world.storage
    if hasattr(storage, "_dispatches"):
        return sum(1 for d in storage._dispatches.values() if d.task_id == task_id)
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM kernel_dispatch WHERE task_id = %s", [task_id])
        return int(cur.fetchone()[0])


def test_a_window_of_dead_burst_rows_does_not_starve_a_fresh_burst(world: World) -> None:
    """More terminal tasks' burst rows than a claim's window lead the queue (left by
    lapsed leases, or by a storage that lost a delete); a fresh burst behind them is
    still claimed. The window's dead rows go when it holds nothing to claim: those that
    filled it at once, the rest once the burst is taken."""
    kernel = burst_setup(world, registry_with(BAD))
    handle = kernel.create_session()
    draft = Draft()
    dead = [draft.create_task("good", {}) for _ in range(CLAIM_WINDOW + 6)]
    handle.commit(draft)
    worker = Worker(kernel, "w")
    for task_id in dead:
        assert worker.advance(task_id)
    resurrect_rows(world, dead)
    world.clock.advance(1)
    fresh = Draft()
    burst = [fresh.create_task("good", {}) for _ in range(3)]
    handle.commit(fresh)
    now = world.clock.now()

    until = now + timedelta(seconds=30)
    claimed = world.storage.claim_burst("default", "w2", now, until)
    assert claimed is not None and claimed.id in burst
    assert sum(dispatch_rows(world, t) for t in dead) == len(dead) - CLAIM_WINDOW
    taken = {claimed.id}
    while (claimed := world.storage.claim_burst("default", "w2", now, until)) is not None:
        taken.add(claimed.id)
    assert taken == set(burst)
    assert sum(dispatch_rows(world, t) for t in dead) == 0


def resurrect_rows(world: World, task_ids: list[str]) -> None:
    """Woken dispatch rows for tasks that have ended: what a lapsed lease's sweep row,
    or a row that raced its task's ending, leaves behind."""
    storage = world.storage
    at = world.clock.now() - timedelta(seconds=5)
    if hasattr(storage, "_dispatches"):
        from kernel.records import Dispatch

        for task_id in task_ids:
            task = storage.task(task_id)
            row_id = next(storage._dispatch_ids)
            storage._dispatches[row_id] = Dispatch(
                task.id, task.session_id, at, task.queue, 0, id=row_id, woken=True,
                delivered_at=at, attempts=1)
        return
    from django.db import connection

    with connection.cursor() as cur:
        for task_id in task_ids:
            cur.execute(
                "INSERT INTO kernel_dispatch (task_id, session_id, not_before, queue, seq, "
                "woken, delivered_at, attempts, blocked) SELECT id, session_id, %s, queue, 0, "
                "true, %s, 1, false FROM kernel_task WHERE id = %s", [at, at, task_id])


def test_a_renewal_never_moves_a_lease_backwards(world: World) -> None:
    registry = registry_with(BAD)
    kernel = world.kernel(registry)
    handle = kernel.create_session()
    draft = Draft()
    task_id = draft.create_task("good", {})
    handle.commit(draft)
    now = world.clock.now()
    later = now + timedelta(seconds=60)
    claimed = world.storage.claim(task_id, "w", now, later)
    assert claimed is not None
    assert world.storage.renew(task_id, "w", claimed.epoch, now + timedelta(seconds=10))
    assert world.storage.task(task_id).lease_until == later


@pytest.mark.parametrize("point", ["before_write", "after_write"])
@pytest.mark.parametrize("ends", ["succeed", "next", "next writing"])
def test_a_fault_before_commit_meets_a_commit_refused_for_its_lost_lease(
    world: World, ends: str, point: str
) -> None:
    """A phase whose lease was released under it commits: a fast path learns that only
    from the statement it sends after both points before COMMIT, so every storage meets a
    fault armed for either at that commit, whatever its check would have said: nothing
    written, the fault used up, the worker holding nothing."""
    registry = Registry()
    registry.document("log")
    released: list[Any] = []

    @registry.task("expiring")
    class Expiring:
        initial = "go"

        def go(self, run: Run) -> Transition:
            task = run.task
            world.storage.release(task.id, task.lease_owner or "", task.epoch,
                                  world.clock.now(), interrupted=True)
            released.append(world.storage.task(task.id))
            world.faults.armed[point] = StorageUnavailable("connection lost")
            if ends == "succeed":
                return run.succeed("late")
            if ends == "next writing":
                run.set("log", "main", ["x"], 1)
            return run.next("later", {"n": 1})

        def later(self, run: Run) -> Transition:
            return run.succeed("later")

    kernel = world.kernel(registry)
    handle = kernel.create_session()
    draft = Draft()
    task_id = draft.create_task("expiring", {})
    handle.commit(draft)
    head = world.storage.session(handle.id).head_seq
    worker = Worker(kernel, "w")

    worker.advance(task_id)
    assert point not in world.faults.armed
    assert world.storage.session(handle.id).head_seq == head
    assert [world.storage.task(task_id)] == released
    assert worker.held == {}
