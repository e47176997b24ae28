"""Task semantics: the recovery table of DESIGN §6, joins, cancellation, blocked
definitions, fencing (invariant 5), no-progress faults (invariant 7), effects
outside transactions (invariant 3) and recovery from storage alone (invariant 8).
Run against both storages."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta
from typing import Any

import pytest

from kernel import (
    Draft,
    IllegalTransition,
    JoinPolicy,
    Outcome,
    Registry,
    Run,
    StaleLease,
    StaleStep,
    Status,
    Transition,
    WaitCycle,
    Worker,
)
from tests.unit.crashes import Crash

from .definitions import Effects, make_registry, start
from .world import World


def outcome(world: World, task_id: str) -> str | None:
    task = world.storage.task(task_id)
    return task.outcome["kind"] if task.terminal else None


def log_of(world: World, kernel, session_id: str) -> dict:
    return world.kernel(kernel.registry).document(session_id, "log", "main")


# -- recovery table --------------------------------------------------------------------


def test_pending_runs_its_saved_phase_after_a_restart(world: World) -> None:
    effects = Effects()
    kernel, handle, task_id = start(world, "step", {"name": "s"}, make_registry(effects))
    world.reopen()
    world.scheduler(make_registry(effects)).run_until_idle()
    assert outcome(world, task_id) == "succeeded"
    assert effects.calls == ["s:act"]


def test_running_with_an_expired_lease_reenters_the_phase_and_counts_a_restart(
    world: World,
) -> None:
    effects = Effects()
    effects.hooks["act"] = lambda run: (_ for _ in ()).throw(Crash())
    kernel, handle, task_id = start(world, "step", {"name": "s"}, make_registry(effects))
    with pytest.raises(Crash):
        world.scheduler(make_registry(effects)).run_until_idle()
    crashed = world.storage.task(task_id)
    assert (crashed.status, crashed.phase) == (Status.RUNNING, "act")

    effects.hooks.clear()
    world.reopen()
    scheduler = world.scheduler(make_registry(effects), worker_id="w2")
    assert scheduler.run_until_idle() == 0  # the lease has not expired yet
    world.clock.advance(31)
    scheduler.run_until_idle()
    task = world.storage.task(task_id)
    assert task.outcome["kind"] == "succeeded"
    assert effects.calls == ["s:act", "s:act"]
    assert log_of(world, kernel, handle.id) == {"s": ["act"]}


def test_past_the_restart_limit_the_task_fails_with_the_reason(world: World) -> None:
    effects = Effects()
    effects.hooks["act"] = lambda run: (_ for _ in ()).throw(Crash())
    kernel, handle, task_id = start(world, "step", {"name": "s"}, make_registry(effects))
    for attempt in range(4):
        with pytest.raises(Crash):
            world.reopen()
            world.scheduler(make_registry(effects), worker_id=f"w{attempt}").run_until_idle(
                advance_clock=True
            )
    world.reopen()
    world.scheduler(make_registry(effects), worker_id="last").run_until_idle(advance_clock=True)
    task = world.storage.task(task_id)
    assert task.outcome["kind"] == "failed"
    assert "interrupted 4 times" in task.outcome["error"]
    assert "restart limit is 3" in task.outcome["error"]
    assert len(effects.calls) == 4


def test_waiting_rechecks_its_dependencies_after_a_restart(world: World) -> None:
    effects = Effects()
    children = [{"kind": "step", "input": {"name": n}} for n in ("a", "b")]
    kernel, handle, task_id = start(
        world, "parent", {"name": "p", "children": children}, make_registry(effects)
    )
    kernel2 = world.kernel(make_registry(effects))
    Worker(kernel2, "w1").advance(task_id)
    assert world.storage.task(task_id).status is Status.WAITING
    world.reopen()
    world.scheduler(make_registry(effects)).run_until_idle()
    parent = world.storage.task(task_id)
    assert parent.outcome == {"kind": "succeeded", "result": ["succeeded", "succeeded"]}
    assert sorted(effects.calls) == ["a:act", "b:act"]


def test_waiting_on_a_signal_continues_once_it_arrives(world: World) -> None:
    kernel, handle, task_id = start(world, "asker", {"name": "q"})
    world.scheduler(kernel.registry).run_until_idle()
    assert world.storage.task(task_id).status is Status.WAITING
    world.reopen()
    world.scheduler(kernel.registry).run_until_idle()
    assert world.storage.task(task_id).status is Status.WAITING
    draft = Draft(actor="user:olga")
    draft.signal(task_id, "resolution", {"decision": "sent"})
    kernel2 = world.kernel(kernel.registry)
    written = kernel2.open(handle.id).commit(draft)
    assert [d.task_id for d in written.dispatches] == [task_id]
    world.scheduler(kernel.registry).run_until_idle()
    assert outcome(world, task_id) == "succeeded"
    assert log_of(world, kernel, handle.id) == {"q": ["ask", "answer:sent"]}


def test_a_signal_for_a_step_lands_only_while_the_task_waits_on_that_step(
    world: World,
) -> None:
    """An operator's answer names the step it answers (signal and epoch): one for a step
    answered already, or replaced, is refused and writes nothing."""
    kernel, handle, task_id = start(world, "asker", {"name": "q"})
    world.scheduler(kernel.registry).run_until_idle()
    waiting = world.storage.task(task_id)
    head = world.storage.session(handle.id).head_seq

    def answer(name: str, epoch: int, decision: str = "sent") -> None:
        draft = Draft(actor="user:olga")
        draft.signal(task_id, name, {"decision": decision}, step_epoch=epoch)
        world.kernel(kernel.registry).open(handle.id).commit(draft)

    for name, epoch in [("resolution", waiting.epoch + 1), ("resolution", waiting.epoch - 1),
                        ("other", waiting.epoch)]:
        with pytest.raises(StaleStep):
            answer(name, epoch)
    assert world.storage.session(handle.id).head_seq == head
    answer("resolution", waiting.epoch)
    for decision in ("sent", "give_up"):  # a second answer to that step, even the same one
        with pytest.raises(StaleStep, match="no longer waits on resolution"):
            answer("resolution", waiting.epoch, decision)
    assert world.storage.session(handle.id).head_seq == head + 1
    world.scheduler(kernel.registry).run_until_idle()
    assert outcome(world, task_id) == "succeeded"


def test_sleeping_waits_for_its_time_then_runs(world: World) -> None:
    kernel, handle, task_id = start(world, "napper", {"name": "n", "seconds": 60})
    world.scheduler(kernel.registry).run_until_idle()
    task = world.storage.task(task_id)
    assert (task.status, task.phase) == (Status.SLEEPING, "wake")
    assert task.wake_at == world.clock.now() + timedelta(seconds=60)
    world.reopen()
    world.clock.advance(59)
    assert world.scheduler(kernel.registry).run_until_idle() == 0
    world.clock.advance(2)
    world.scheduler(kernel.registry).run_until_idle()
    assert outcome(world, task_id) == "succeeded"


def test_a_sleep_until_a_time_without_a_timezone_is_refused_and_faults_the_task(
    world: World,
) -> None:
    """A wake time with no timezone names no moment (each storage would read it its own
    way): the phase's commit is refused as a value no storage holds, and every other
    task's scheduling goes on."""
    registry = make_registry(Effects())

    @registry.task("naive napper")
    class NaiveNapper:
        initial = "nap"

        def nap(self, run: Run) -> Transition:
            return run.sleep(until=datetime(2026, 1, 1, 0, 0, 5), then="wake")

        def wake(self, run: Run) -> Transition:
            return run.succeed()

    kernel = world.kernel(registry)
    handle = kernel.create_session()
    draft = Draft(actor="user:ann")
    naive = draft.create_task("naive napper", {})
    other = draft.create_task("napper", {"name": "n", "seconds": 60})
    handle.commit(draft)
    assert Worker(kernel, "w1").advance(naive)
    task = world.storage.task(naive)
    assert outcome(world, naive) == "faulted"
    assert "without a timezone" in task.outcome["error"]
    assert task.wake_at is None
    world.scheduler(registry).run_until_idle(advance_clock=True)
    assert outcome(world, other) == "succeeded"


@pytest.mark.parametrize("name", ["tool \x00 call", "tool \ud800 call"])
def test_a_wait_on_a_signal_name_no_storage_holds_is_refused_and_faults_the_task(
    world: World, name: str
) -> None:
    """A signal name that no text column holds (NUL, a lone surrogate: say, a model's
    tool call id) is refused as the phase's commit is built, on either storage: the task
    faults saying why, rather than waiting for a signal nobody can send, or its worker
    failing on the database's error with the lease held."""
    registry = Registry()

    @registry.task("waiter")
    class Waiter:
        initial = "ask"

        def ask(self, run: Run) -> Transition:
            return run.wait_for(name, then="done")

        def done(self, run: Run) -> Transition:
            return run.succeed()

    kernel = world.kernel(registry)
    handle = kernel.create_session()
    draft = Draft(actor="user:ann")
    task_id = draft.create_task("waiter", {})
    handle.commit(draft)
    assert Worker(kernel, "w1").advance(task_id)
    task = world.storage.task(task_id)
    assert outcome(world, task_id) == "faulted"
    assert "signal name cannot be stored" in task.outcome["error"]
    assert task.lease_owner is None


def test_completing_finishes_once_owned_subtasks_are_terminal(world: World) -> None:
    kernel, handle, task_id = start(
        world, "quitter", {"child": {"kind": "asker", "input": {"name": "kid"}}}
    )
    worker = Worker(kernel, "w1")
    worker.advance(task_id)
    owner = world.storage.task(task_id)
    assert owner.status is Status.COMPLETING
    [child] = [t for t in world.storage.session_tasks(handle.id) if t.id != task_id]
    assert child.cancel["reason"] == f"owner {task_id} finished"
    world.reopen()
    world.scheduler(kernel.registry).run_until_idle()
    assert outcome(world, child.id) == "cancelled"
    owner = world.storage.task(task_id)
    assert owner.outcome == {"kind": "succeeded", "result": "done early"}
    assert owner.status is Status.TERMINAL


def test_terminal_runs_nothing_and_serves_its_result(world: World) -> None:
    effects = Effects()
    kernel, handle, task_id = start(world, "step", {"name": "s"}, make_registry(effects))
    world.scheduler(kernel.registry).run_until_idle()
    head = world.storage.session(handle.id).head_seq
    world.reopen()
    world.clock.advance(3600)
    assert world.scheduler(make_registry(effects)).run_until_idle() == 0
    assert not Worker(world.kernel(kernel.registry)).advance(task_id)
    assert world.storage.session(handle.id).head_seq == head
    assert world.storage.task(task_id).outcome == {"kind": "succeeded", "result": {"name": "s"}}
    assert effects.calls == ["s:act"]


# -- invariant 5: fencing ----------------------------------------------------------------


def test_a_stale_lease_holder_cannot_commit(world: World) -> None:
    effects = Effects()
    registry = make_registry(effects)
    kernel, handle, task_id = start(world, "step", {"name": "s"}, registry)
    now = world.clock.now()
    first = world.storage.claim(task_id, "slow", now, now + timedelta(seconds=5))
    world.clock.advance(6)
    now = world.clock.now()
    second = world.storage.claim(task_id, "fast", now, now + timedelta(seconds=30))
    assert second.epoch == first.epoch + 1 and second.restarts == 1
    before = (world.storage.session(handle.id).head_seq, world.storage.task(task_id))

    late = Draft(actor="worker:slow")
    late.set("plan", "p", ["sent"], True)
    from kernel import Finish

    late.transition(task_id, first.epoch, Finish(Outcome.SUCCEEDED, "late"))
    with pytest.raises(StaleLease) as caught:
        kernel.open(handle.id).commit(late)
    assert caught.value.current_epoch == second.epoch
    assert (world.storage.session(handle.id).head_seq, world.storage.task(task_id)) == before
    assert kernel.document_version(handle.id, "plan", "p") == 0
    assert not world.storage.renew(task_id, "slow", first.epoch, now + timedelta(seconds=60))
    assert world.storage.renew(task_id, "fast", second.epoch, now + timedelta(seconds=60))


def test_a_commit_fenced_by_another_owner_at_the_same_epoch_is_refused(world: World) -> None:
    """A claim is not flushed by itself: if a server crash loses one, the next claim
    hands out the same epoch to another worker. The lost claim's holder must not commit."""
    registry = make_registry(Effects())
    kernel, handle, task_id = start(world, "step", {"name": "s"}, registry)
    now = world.clock.now()
    held = world.storage.claim(task_id, "fast", now, now + timedelta(seconds=30))
    before = (world.storage.session(handle.id).head_seq, world.storage.task(task_id))
    from kernel import Finish

    lost = Draft(actor="worker:lost")
    lost.transition(task_id, held.epoch, Finish(Outcome.SUCCEEDED, "lost"), owner="lost")
    with pytest.raises(StaleLease):
        kernel.open(handle.id).commit(lost)
    assert (world.storage.session(handle.id).head_seq, world.storage.task(task_id)) == before
    mine = Draft(actor="worker:fast")
    mine.transition(task_id, held.epoch, Finish(Outcome.SUCCEEDED, "ok"), owner="fast")
    kernel.open(handle.id).commit(mine)
    assert world.storage.task(task_id).outcome == {"kind": "succeeded", "result": "ok"}


def test_claims_hand_out_each_runnable_task_once(world: World) -> None:
    registry = make_registry(Effects())
    kernel = world.kernel(registry)
    handle = kernel.create_session()
    draft = Draft()
    ids = {draft.create_task("step", {"name": str(i)}) for i in range(6)}
    handle.commit(draft)
    now = world.clock.now()
    until = now + timedelta(seconds=30)
    a = world.storage.claim_batch("a", now, until, 4, ["step"])
    b = world.storage.claim_batch("b", now, until, 4, ["step"])
    assert len(a) == 4 and len(b) == 2
    assert {t.id for t in a} | {t.id for t in b} == ids
    assert world.storage.claim_batch("c", now, until, 4, ["step"]) == []
    assert world.storage.claim(a[0].id, "c", now, until) is None


# -- invariant 7: no silent loops ----------------------------------------------------------


def test_a_phase_without_progress_is_a_fault(world: World) -> None:
    registry = make_registry(Effects())

    @registry.task("spinner")
    class Spinner:
        initial = "spin"

        def spin(self, run: Run) -> Transition:
            return run.next("spin")

    @registry.task("forgetful")
    class Forgetful:
        initial = "go"

        def go(self, run: Run) -> Transition:
            return None  # type: ignore[return-value]

    kernel, handle, spinner = start(world, "spinner", {}, registry)
    draft = Draft()
    forgetful = draft.create_task("forgetful", {})
    handle.commit(draft)
    world.scheduler(registry).run_until_idle()
    for task_id in (spinner, forgetful):
        task = world.storage.task(task_id)
        assert task.outcome["kind"] == "faulted"
        assert "no durable progress" in task.outcome["error"]


# -- invariant 3: external work holds no lock ------------------------------------------------


def test_a_phase_running_external_work_does_not_block_commits(world: World) -> None:
    registry = make_registry(Effects())
    committed = threading.Event()

    @registry.task("slow-tool")
    class SlowTool:
        initial = "call"

        def call(self, run: Run) -> Transition:
            run.commit(phase="call", checkpoint={"intent": True})

            def other_writer() -> None:
                try:
                    draft = Draft(actor="user:other")
                    draft.set("plan", "p", ["touched"], True)
                    world.kernel(registry).open(run.session_id).commit(draft)
                    committed.set()
                finally:
                    from django.db import connection

                    connection.close()

            thread = threading.Thread(target=other_writer)
            thread.start()
            thread.join(timeout=10)
            return run.succeed(committed.is_set())

    kernel, handle, task_id = start(world, "slow-tool", {}, registry)
    world.scheduler(registry).run_until_idle()
    assert world.storage.task(task_id).outcome["result"] is True


# -- invariant 8: recovery needs only storage --------------------------------------------


def test_a_new_process_finishes_from_storage_alone(world: World) -> None:
    effects = Effects()
    children = [{"kind": "step", "input": {"name": n}} for n in ("a", "b", "c")]
    registry = make_registry(effects)
    kernel, handle, task_id = start(world, "parent", {"name": "p", "children": children}, registry)
    crash_on = {"b"}

    def maybe_crash(run: Run) -> None:
        if run.input["name"] in crash_on:
            crash_on.clear()
            raise Crash()

    effects.hooks["act"] = maybe_crash
    with pytest.raises(Crash):
        world.scheduler(registry).run_until_idle()
    world.reopen()
    fresh_effects = Effects()
    world.scheduler(make_registry(fresh_effects), worker_id="w2").run_until_idle(advance_clock=True)
    assert outcome(world, task_id) == "succeeded"
    assert "b:act" in fresh_effects.calls and "a:act" not in fresh_effects.calls
    log = log_of(world, kernel, handle.id)
    assert {k: v for k, v in log.items() if k != "p"} == {"a": ["act"], "b": ["act"], "c": ["act"]}


# -- joins ----------------------------------------------------------------------------------


def test_all_settled_resumes_after_every_child_whatever_the_outcome(world: World) -> None:
    children = [
        {"kind": "step", "input": {"name": "ok"}},
        {"kind": "step", "input": {"name": "bad", "fail": True}},
    ]
    kernel, handle, task_id = start(world, "parent", {"name": "p", "children": children})
    world.scheduler(kernel.registry).run_until_idle()
    parent = world.storage.task(task_id)
    assert parent.outcome["kind"] == "failed"
    assert parent.outcome["result"] == ["failed", "succeeded"]


def test_fail_fast_cancels_the_remaining_siblings_and_resumes_after_they_wind_down(
    world: World,
) -> None:
    children = [
        {"kind": "asker", "input": {"name": "waits"}},
        {"kind": "napper", "input": {"name": "naps", "seconds": 100}},
        {"kind": "step", "input": {"name": "bad", "fail": True}},
    ]
    kernel, handle, task_id = start(
        world, "parent", {"name": "p", "children": children, "policy": "fail_fast"}
    )
    world.scheduler(kernel.registry).run_until_idle()
    parent = world.storage.task(task_id)
    assert parent.outcome["kind"] == "failed"
    assert parent.outcome["result"] == ["cancelled", "cancelled", "failed"]
    log = log_of(world, kernel, handle.id)
    assert log["waits"] == ["ask", "cancelled"]
    assert "wake" not in log["naps"]


def test_fail_fast_only_joins_owned_tasks_and_cycles_are_refused(world: World) -> None:
    registry = make_registry(Effects())

    @registry.task("joiner")
    class Joiner:
        initial = "join"

        def join(self, run: Run) -> Transition:
            policy = JoinPolicy(run.input["policy"])
            return run.wait_all(run.input["deps"], then="join", policy=policy)

    kernel = world.kernel(registry)
    handle = kernel.create_session()
    draft = Draft()
    stranger = draft.create_task("asker", {"name": "stranger"})
    handle.commit(draft)
    worker = Worker(kernel, "w")

    draft = Draft()
    fail_fast = draft.create_task("joiner", {"deps": [stranger], "policy": "fail_fast"})
    handle.commit(draft)
    worker.advance(fail_fast)
    refused = world.storage.task(fail_fast).outcome
    assert refused["kind"] == "faulted"
    assert "fail_fast joins only tasks the waiter owns" in refused["error"]

    draft = Draft()
    a = draft.create_task("joiner", {"deps": [], "policy": "all_settled"})
    handle.commit(draft)
    draft = Draft()
    b = draft.create_task("joiner", {"deps": [a], "policy": "all_settled"})
    handle.commit(draft)
    worker.advance(b)
    assert world.storage.task(b).status is Status.WAITING
    claimed = world.storage.claim(a, "w", world.clock.now(), world.clock.now() + timedelta(30))
    from kernel import WaitTasks

    cyclic = Draft()
    cyclic.transition(a, claimed.epoch, WaitTasks((b,), "join"))
    with pytest.raises(WaitCycle):
        handle.commit(cyclic)
    itself = Draft()
    itself.transition(a, claimed.epoch, WaitTasks((a,), "join"))
    with pytest.raises(WaitCycle):
        handle.commit(itself)
    stranger_join = Draft()
    stranger_join.transition(a, claimed.epoch, WaitTasks((stranger,), "join", JoinPolicy.FAIL_FAST))
    with pytest.raises(IllegalTransition, match="owns"):
        handle.commit(stranger_join)


# -- cancellation ---------------------------------------------------------------------------


def test_cancel_is_durable_cascades_and_revokes_the_running_lease(world: World) -> None:
    children = [
        {"kind": "asker", "input": {"name": "kid1"}},
        {"kind": "napper", "input": {"name": "kid2", "seconds": 100}},
    ]
    kernel, handle, task_id = start(world, "parent", {"name": "p", "children": children})
    world.scheduler(kernel.registry).run_until_idle()
    now = world.clock.now()
    kid1 = next(t for t in world.storage.session_tasks(handle.id) if t.input.get("name") == "kid1")
    cancel = Draft(actor="user:olga")
    cancel.cancel(task_id, "wrong recipients")
    kernel.open(handle.id).commit(cancel)
    again = Draft(actor="user:olga")
    again.cancel(task_id, "twice")
    kernel.open(handle.id).commit(again)  # idempotent: nothing new recorded
    parent = world.storage.task(task_id)
    assert parent.cancel["by"] == "user:olga" and parent.cancel["reason"] == "wrong recipients"
    assert world.storage.task(kid1.id).cancel["reason"] == f"owner {task_id} cancelled"
    assert world.storage.claim(kid1.id, "x", now, now) is not None  # runnable: cancel path
    world.clock.advance(1)
    world.reopen()
    world.scheduler(kernel.registry).run_until_idle()
    for task in world.storage.session_tasks(handle.id):
        assert task.status is Status.TERMINAL
        assert task.outcome["kind"] == "cancelled"
    assert world.storage.task(task_id).outcome["result"]["by"] == "user:olga"
    log = log_of(world, kernel, handle.id)
    assert log["p"] == ["fan_out", "cancelled"] and log["kid1"] == ["ask", "cancelled"]


def test_a_cancel_of_a_task_that_has_ended_is_refused_and_writes_nothing(
    world: World,
) -> None:
    """Checked when the commit is built, under the session's lock: a caller that read the
    task before it ended (an operator's cancel racing the task's own ending) is refused,
    and nothing of its commit (the operations-log entry beside the cancel) lands."""
    kernel, handle, task_id = start(world, "step", {"name": "s"})
    world.scheduler(kernel.registry).run_until_idle()
    assert outcome(world, task_id) == "succeeded"
    head = world.storage.session(handle.id).head_seq
    late = Draft(actor="user:olga", key="late-cancel")
    late.cancel(task_id, "too late")
    late.record_operation("cancel", {"target": task_id, "reason": "too late"})
    with pytest.raises(IllegalTransition, match=f"task {task_id} already ended succeeded"):
        kernel.open(handle.id).commit(late)
    assert world.storage.session(handle.id).head_seq == head
    assert world.storage.task(task_id).cancel is None


def test_cancel_while_a_phase_runs_rejects_its_commit(world: World) -> None:
    effects = Effects()
    registry = make_registry(effects)
    kernel, handle, task_id = start(world, "step", {"name": "s"}, registry)

    seen_while_running: list[Any] = []

    def operator_cancels(run: Run) -> None:
        lease_until = world.storage.task(run.task_id).lease_until
        draft = Draft(actor="user:olga")
        draft.cancel(run.task_id, "stop")
        world.kernel(registry).open(run.session_id).commit(draft)
        # The phase is still in its external call: the cancel handler must not run yet.
        task = world.storage.task(run.task_id)
        seen_while_running.append((task.status, task.wake_at == lease_until))
        seen_while_running.append(Worker(kernel, "w2").advance(run.task_id))

    effects.hooks["act"] = operator_cancels
    worker = Worker(kernel, "w1")
    worker.advance(task_id)
    assert seen_while_running == [(Status.SLEEPING, True), False]
    # Its commit refused, the phase's worker says it has returned: the handler may run now.
    task = world.storage.task(task_id)
    assert task.status is Status.PENDING and task.cancel["reason"] == "stop"
    assert kernel.commits_after(handle.id, 0)[-1].actor == "worker:w1"
    assert kernel.document_version(handle.id, "log", "main") == 0
    effects.hooks.clear()
    world.scheduler(registry).run_until_idle()
    assert outcome(world, task_id) == "cancelled"


def test_a_stale_holder_returning_does_not_wake_a_cancel_waiting_for_a_later_one(
    world: World,
) -> None:
    effects = Effects()
    registry = make_registry(effects)
    kernel, handle, task_id = start(world, "step", {"name": "s"}, registry)
    now = world.clock.now()
    stale = world.storage.claim(task_id, "w1", now, now + timedelta(seconds=30))
    assert stale is not None  # w1 hangs; its lease expires and w2 takes the task over
    world.clock.advance(31)
    seen: list[Status] = []

    def cancel_then_the_stale_holder_returns(run: Run) -> None:
        draft = Draft(actor="user:olga")
        draft.cancel(run.task_id, "stop")
        world.kernel(registry).open(run.session_id).commit(draft)
        Worker(kernel, "w1").run_claimed(stale)  # w1 wakes up; its first commit is refused
        seen.append(world.storage.task(run.task_id).status)

    effects.hooks["act"] = cancel_then_the_stale_holder_returns
    Worker(kernel, "w2").advance(task_id)
    assert seen == [Status.SLEEPING]  # w1's return says nothing about w2's call
    assert world.storage.task(task_id).status is Status.PENDING  # w2's return does


def test_cancel_of_a_dead_workers_phase_waits_for_its_lease_to_run_out(world: World) -> None:
    kernel, handle, task_id = start(world, "step", {"name": "s"})
    now = world.clock.now()
    claimed = world.storage.claim(task_id, "dead", now, now + timedelta(seconds=30))
    assert claimed is not None  # the worker dies here, in the middle of its phase
    draft = Draft(actor="user:olga")
    draft.cancel(task_id, "stop")
    kernel.open(handle.id).commit(draft)
    world.clock.advance(29)
    world.scheduler(kernel.registry).run_until_idle()
    assert outcome(world, task_id) is None  # it might still be calling out
    world.clock.advance(2)
    world.scheduler(kernel.registry).run_until_idle()
    assert outcome(world, task_id) == "cancelled"


# -- blocked definitions -----------------------------------------------------------------------


def test_blocked_tasks_keep_their_state_and_run_once_a_definition_fits(world: World) -> None:
    old = Registry()
    old.document("log")

    @old.task("tool", version=1)
    class ToolV1:
        initial = "go"

        def go(self, run: Run) -> Transition:
            return run.succeed("v1")

    kernel = world.kernel(old)
    handle = kernel.create_session()
    draft = Draft()
    task_id = draft.create_task("tool", {"n": 1})
    handle.commit(draft)

    nobody = Registry()
    kernel_without = world.kernel(nobody)
    assert world.scheduler(nobody).run_until_idle() == 0
    [(task, reason)] = kernel_without.blocked(handle.id)
    assert "no definition" in reason and task.status is Status.PENDING

    def migrate_fails(version, input, checkpoint):
        raise ValueError("cannot read v1 input")

    broken = Registry()
    broken.add(_definition("tool", 2, migrate_fails))
    assert world.scheduler(broken).run_until_idle() == 0
    [(_, reason)] = world.kernel(broken).blocked(handle.id)
    assert "migrating 'tool' from v1 to v2 failed" in reason

    too_new = Registry()
    too_new.add(_definition("tool", 2, lambda v, i, c: ({**i, "n2": i["n"] * 2}, c)))
    kernel_v2 = world.kernel(too_new)
    handle_v2 = kernel_v2.open(handle.id)
    draft = Draft()
    newer = draft.create_task("tool", {"n": 5})
    handle_v2.commit(draft)
    reasons = {t.id: r for t, r in world.kernel(old).blocked(handle.id)}
    assert "newer than the registered version 1" in reasons[newer]

    world.scheduler(too_new).run_until_idle()
    assert world.storage.task(task_id).outcome["result"] == {"n": 1, "n2": 2}
    assert world.storage.task(task_id).version == 2
    assert world.kernel(too_new).blocked(handle.id) == []


def test_a_task_changed_since_a_worker_found_it_blocked_is_blocked_no_longer(
    world: World,
) -> None:
    """A worker that finds a task blocked marks all its dispatch rows; a commit since (here
    an operator's migrate to the environment a worker offers) adds a row of its own, which
    is delivered as any other. The task is blocked while all its rows are: the one
    definition the queue depths and the attention list read too."""
    registry = Registry()
    registry.add(_definition("tool", 1, None))
    handle = world.kernel(registry).create_session()
    draft = Draft()
    found_blocked, changed = draft.create_task("tool", {"n": 1}), draft.create_task(
        "tool", {"n": 2})
    handle.commit(draft)
    for task_id in (found_blocked, changed):
        world.storage.block_dispatches(task_id)
    assert {t.id for t in world.storage.blocked_tasks(10)} == {found_blocked, changed}

    draft = Draft()
    draft.migrate_environment(changed, {}, expected_seq=world.storage.task(changed).updated_seq)
    handle.commit(draft)
    assert [t.id for t in world.storage.blocked_tasks(10)] == [found_blocked]


def test_a_claim_for_registered_versions_leaves_other_tasks_as_they_were(
    world: World,
) -> None:
    """``Storage.claim(..., versions)``, the worker's one-round-trip claim (issue 12):
    a task stored at another (kind, version) is not claimed, nor changed in any way."""
    old = Registry()
    old.add(_definition("tool", 1, None))
    kernel = world.kernel(old)
    handle = kernel.create_session()
    draft = Draft()
    task_id = draft.create_task("tool", {"n": 1})
    handle.commit(draft)
    before = world.storage.task(task_id)
    now = world.clock.now()
    until = now + timedelta(seconds=30)
    for versions in (set(), {("tool", 2)}, {("other", 1)}):
        assert world.storage.claim(task_id, "w", now, until, versions) is None
    assert world.storage.task(task_id) == before
    claimed = world.storage.claim(task_id, "w", now, until, {("other", 1), ("tool", 1)})
    assert claimed is not None and claimed.epoch == before.epoch + 1


def test_a_worker_migrates_and_runs_a_task_stored_at_an_older_version(world: World) -> None:
    old = Registry()
    old.add(_definition("tool", 1, None))
    handle = world.kernel(old).create_session()
    draft = Draft()
    task_id = draft.create_task("tool", {"n": 1})
    handle.commit(draft)
    new = Registry()
    new.add(_definition("tool", 2, lambda v, i, c: ({**i, "n2": i["n"] * 2}, c)))
    assert Worker(world.kernel(new), "w").advance(task_id)
    task = world.storage.task(task_id)
    assert task.outcome["result"] == {"n": 1, "n2": 2} and task.version == 2


def _definition(kind: str, version: int, migrate):
    from kernel import TaskDefinition

    return TaskDefinition(
        kind=kind,
        version=version,
        phases={"go": lambda run: run.succeed(run.input)},
        initial="go",
        migrate=migrate,
    )


# -- heartbeat ---------------------------------------------------------------------------------


@pytest.mark.parametrize("heartbeat", [True, False])
def test_a_heartbeat_keeps_a_long_phase_its_lease(world: World, heartbeat: bool) -> None:
    from kernel import Kernel, SystemClock

    registry = make_registry(Effects())
    rival_claims: list[bool] = []

    @registry.task("long-call")
    class LongCall:
        initial = "call"

        def call(self, run: Run) -> Transition:
            import time

            time.sleep(1.2)  # an external call longer than the lease
            now = run.now
            rival = world.storage.claim(run.task_id, "rival", now, now + timedelta(seconds=30))
            rival_claims.append(rival is not None)
            return run.succeed("done")

    kernel = Kernel(world.storage, registry, SystemClock())
    handle = kernel.create_session()
    draft = Draft()
    task_id = draft.create_task("long-call", {})
    handle.commit(draft)
    worker = Worker(kernel, "w1", lease_seconds=0.6, heartbeat=heartbeat)
    try:
        worker.advance(task_id)
    finally:
        worker.close()
    task = world.storage.task(task_id)
    if heartbeat:
        assert rival_claims == [False]
        assert task.outcome["kind"] == "succeeded"
    else:
        assert rival_claims == [True]
        assert (task.status, task.lease_owner) == (Status.RUNNING, "rival")


# -- retry ---------------------------------------------------------------------------------


def test_a_failed_task_retries_from_its_last_saved_phase(world: World) -> None:
    effects = Effects()
    registry = make_registry(effects)
    kernel, handle, task_id = start(world, "step", {"name": "s", "fail": True}, registry)
    world.scheduler(registry).run_until_idle()
    failed = world.storage.task(task_id)
    assert (failed.outcome["kind"], failed.phase) == ("failed", "act")

    draft = Draft(actor="user:olga")
    draft.retry(task_id)
    written = kernel.open(handle.id).commit(draft)
    assert [d.task_id for d in written.dispatches] == [task_id]
    retried = world.storage.task(task_id)
    assert (retried.status, retried.phase, retried.outcome) == (Status.PENDING, "act", None)
    assert retried.checkpoint["_retried"][0]["by"] == "user:olga"
    world.scheduler(registry).run_until_idle()
    assert effects.calls == ["s:act", "s:act"]  # "act" ran again: its effects may repeat

    done = Draft()
    done.retry(task_id)  # failed again, so it may retry again; a success may not
    kernel.open(handle.id).commit(done)
    world.scheduler(registry).run_until_idle()
    ok_id = start(world, "step", {"name": "ok"}, registry)[2]
    world.scheduler(registry).run_until_idle()
    refused = Draft()
    refused.retry(ok_id)
    with pytest.raises(IllegalTransition, match="only failed tasks retry"):
        world.kernel(registry).open(world.storage.task(ok_id).session_id).commit(refused)


def test_a_retry_of_a_task_changed_since_the_caller_saw_it_is_refused(world: World) -> None:
    """Retried by someone else and failed again since: a retry expecting the failure the
    caller saw is refused in the commit and writes nothing; one expecting the failure
    there is now goes."""
    effects = Effects()
    registry = make_registry(effects)
    kernel, handle, task_id = start(world, "step", {"name": "s", "fail": True}, registry)
    world.scheduler(registry).run_until_idle()
    seen = world.storage.task(task_id).updated_seq
    other = Draft(actor="user:omar")
    other.retry(task_id, expected_seq=seen)
    kernel.open(handle.id).commit(other)
    world.scheduler(registry).run_until_idle()  # it fails again
    failed = world.storage.task(task_id)
    assert failed.outcome["kind"] == "failed" and failed.updated_seq > seen
    head = world.storage.session(handle.id).head_seq

    stale = Draft(actor="user:olga")
    stale.retry(task_id, expected_seq=seen)
    with pytest.raises(StaleStep, match=f"changed at #{failed.updated_seq} after the #{seen}"):
        kernel.open(handle.id).commit(stale)
    assert world.storage.session(handle.id).head_seq == head
    assert world.storage.task(task_id) == failed

    current = Draft(actor="user:olga")
    current.retry(task_id, expected_seq=failed.updated_seq)
    kernel.open(handle.id).commit(current)
    assert world.storage.task(task_id).status is Status.PENDING
    assert effects.calls == ["s:act", "s:act"]


def test_a_keep_lease_commit_extends_the_lease(world: World) -> None:
    registry = make_registry(Effects())
    seen: list[Any] = []

    @registry.task("two-step")
    class TwoStep:
        initial = "first"

        def first(self, run: Run) -> Transition:
            world.clock.advance(20)  # a slow external call, 20 of the 30 lease seconds
            run.commit(phase="second")
            seen.append(world.storage.task(run.task_id).lease_until)
            return run.succeed()

        def second(self, run: Run) -> Transition:
            return run.succeed()

    kernel, handle, task_id = start(world, "two-step", {}, registry)
    Worker(kernel, "w1", lease_seconds=30).advance(task_id)
    [until] = seen  # Postgres adds the (tiny) time the commit spent in the database
    expected = world.clock.now() + timedelta(seconds=30)
    assert expected <= until < expected + timedelta(seconds=1)


def test_a_large_join_sees_what_changed_on_its_waiter_and_deps_while_it_waited(
    world: World,
) -> None:
    """A join over many tasks is checked at each of their endings without reading the
    waiter anew each time (issue 12): what changes the waiter or a dependency meanwhile
    (a signal to the waiter, a retried dependency) is still seen."""
    children = [
        {"kind": "step", "input": {"name": f"c{i}", "fail": i == 0}} for i in range(150)
    ]
    kernel, handle, task_id = start(world, "parent", {"name": "p", "children": children})
    worker = Worker(kernel, "w1")
    assert worker.advance(task_id)
    deps = world.storage.task(task_id).wait_deps
    assert len(deps) == 150
    for dep in deps[:100]:
        assert worker.advance(dep)
    draft = Draft(actor="user:ann")
    draft.signal(task_id, "note", {"n": 1})  # the waiter's row changes while it waits
    draft.retry(deps[0])  # and a dependency that had ended is open again
    handle.commit(draft)
    for dep in deps[100:]:
        assert worker.advance(dep)
    assert world.storage.task(task_id).status is Status.WAITING  # deps[0] is open
    assert worker.advance(deps[0])
    parent = world.storage.task(task_id)
    assert parent.status is Status.PENDING
    assert parent.signals == {"note": {"n": 1}}
    assert worker.advance(task_id)
    assert world.storage.task(task_id).outcome["result"] == ["failed"] + ["succeeded"] * 149


def test_an_ending_asks_about_the_newest_tasks_of_a_large_join_first(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a join's newest tasks are open, each ending asks storage about
    ``ANY_OPEN_FIRST`` of them, not about all n (issue 12: sending every id made each
    email of a batch O(n)); once they have ended, it asks further back, in growing
    chunks, and still finds the oldest task open."""
    from kernel.commit import ANY_OPEN_FIRST

    children = [{"kind": "step", "input": {"name": f"c{i}"}} for i in range(400)]
    kernel, _, task_id = start(world, "parent", {"name": "p", "children": children})
    worker = Worker(kernel, "w1")
    assert worker.advance(task_id)
    deps = world.storage.task(task_id).wait_deps
    asked: list[int] = []
    from controlplane.storage.connection import TransactionReads
    from kernel.memory import _CommitReads

    for cls in (TransactionReads, _CommitReads):
        original = cls.any_open

        def counted(self: Any, ids: Any, _original: Any = original) -> bool:
            asked.append(len(ids))
            return _original(self, ids)

        monkeypatch.setattr(cls, "any_open", counted)
    for dep in deps[1:-ANY_OPEN_FIRST]:  # oldest first, as queue messages' workers claim
        assert worker.advance(dep)
    assert asked and max(asked) <= ANY_OPEN_FIRST
    asked.clear()
    for dep in deps[-ANY_OPEN_FIRST:]:
        assert worker.advance(dep)
    assert world.storage.task(task_id).status is Status.WAITING  # deps[0] is still open
    assert max(asked) > ANY_OPEN_FIRST  # it looked further back to find it
    assert worker.advance(deps[0])
    assert world.storage.task(task_id).status is Status.PENDING
