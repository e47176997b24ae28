"""Restarting a task from a committed phase (kernel.forks): what ran before the chosen
phase does not run again, the restart is a commit naming who, the history before it
stays, and the states that refuse it. Run against both storages."""

from __future__ import annotations

from collections import Counter

import pytest

from kernel import Draft, IllegalTransition, Registry, Run, StaleStep, Status, Transition
from kernel.forks import RESTARTED, PhaseEntry, phase_entries

from .definitions import Effects, make_registry, start
from .world import World


class CountingProvider:
    """An outside service that counts each call it gets, by phase and operation id."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.operations: list[str] = []

    def call(self, run: Run, what: str) -> None:
        self.calls[what] += 1
        self.operations.append(run.operation_id(what))


def four_phases(provider: CountingProvider, registry: Registry | None = None) -> Registry:
    registry = registry or make_registry(Effects())

    @registry.task("pipeline")
    class Pipeline:
        initial = "one"

        def one(self, run: Run) -> Transition:
            provider.call(run, "one")
            return run.next("two", {"from_one": 1})

        def two(self, run: Run) -> Transition:
            provider.call(run, "two")
            return run.sleep(1, then="three", checkpoint={"from_two": 2})

        def three(self, run: Run) -> Transition:
            provider.call(run, "three")
            assert run.checkpoint["from_two"] == 2  # what it entered with: the saved node
            return run.next("four", {"from_three": run.checkpoint.get("from_three", 0) + 1})

        def four(self, run: Run) -> Transition:
            provider.call(run, "four")
            if run.input.get("fail") and not run.checkpoint.get(RESTARTED):
                return run.fail("phase four failed")
            return run.succeed(dict(run.checkpoint))

    return registry


def entries(world: World, task_id: str) -> list[PhaseEntry]:
    task = world.storage.task(task_id)
    return list(phase_entries(task_id, world.storage.commits_after(task.session_id, 0, 1000)))


def finish(world: World, registry: Registry) -> None:
    scheduler = world.scheduler(registry)
    for _ in range(5):
        scheduler.run_until_idle()
        world.clock.advance(2)


def test_a_restart_from_phase_three_runs_nothing_before_it_again(world: World) -> None:
    provider = CountingProvider()
    registry = four_phases(provider)
    kernel, handle, task_id = start(world, "pipeline", {"fail": True}, registry)
    finish(world, registry)
    failed = world.storage.task(task_id)
    assert failed.outcome["kind"] == "failed"
    assert provider.calls == {"one": 1, "two": 1, "three": 1, "four": 1}

    found = entries(world, task_id)
    assert [e.phase for e in found] == ["one", "two", "three", "four"]
    three = found[2]
    assert three.checkpoint == {"from_one": 1, "from_two": 2}  # as it entered phase three
    assert three.version == 1

    draft = Draft(actor="user:olga")
    draft.restart(task_id, three, expected_seq=failed.updated_seq)
    written = kernel.open(handle.id).commit(draft)
    assert [d.task_id for d in written.dispatches] == [task_id]
    restarted = world.storage.task(task_id)
    assert (restarted.status, restarted.phase, restarted.outcome) == (Status.PENDING, "three",
                                                                      None)
    [record] = restarted.checkpoint[RESTARTED]
    assert (record["from_seq"], record["by"], record["was"]) == (three.seq, "user:olga", "failed")

    finish(world, registry)
    done = world.storage.task(task_id)
    assert done.outcome["kind"] == "succeeded"
    # Counted at the provider: phases one and two did not run again.
    assert provider.calls == {"one": 1, "two": 1, "three": 2, "four": 2}
    assert done.outcome["result"]["from_three"] == 1  # from the saved node, not from the end
    # The calls after the fork went out under new operation ids; those before it did not
    # go out again at all.
    assert provider.operations == [
        f"op_{task_id}_one", f"op_{task_id}_two", f"op_{task_id}_three", f"op_{task_id}_four",
        f"op_{task_id}_three_r1", f"op_{task_id}_four_r1",
    ]
    # The original history stays readable beside the fork: the log holds both runs.
    after = entries(world, task_id)
    assert [e.phase for e in after] == ["one", "two", "three", "four", "three", "four"]
    assert after[4].restart_of == three.seq
    assert after[:4] == found


def test_a_restart_is_refused_when_the_task_moved_or_runs(world: World) -> None:
    provider = CountingProvider()
    registry = four_phases(provider)
    kernel, handle, task_id = start(world, "pipeline", {}, registry)
    scheduler = world.scheduler(registry)
    scheduler.run_until_idle()  # one, two: asleep before three
    sleeping = world.storage.task(task_id)
    assert sleeping.status is Status.SLEEPING
    first = entries(world, task_id)[0]

    stale = Draft(actor="user:olga")
    stale.restart(task_id, first, expected_seq=sleeping.updated_seq - 1)
    with pytest.raises(StaleStep, match="look again"):
        kernel.open(handle.id).commit(stale)

    # A task no phase of which runs (asleep here) may start again from a phase.
    ok = Draft(actor="user:olga")
    ok.restart(task_id, first, expected_seq=sleeping.updated_seq)
    kernel.open(handle.id).commit(ok)
    assert world.storage.task(task_id).phase == "one"

    # Running: refused until it is cancelled and has ended.
    now = world.clock.now()
    from datetime import timedelta
    claimed = world.storage.claim(task_id, "w9", now, now + timedelta(seconds=30))
    assert claimed is not None
    running = Draft(actor="user:olga")
    running.restart(task_id, first, expected_seq=claimed.updated_seq)
    with pytest.raises(IllegalTransition, match="cancel it"):
        kernel.open(handle.id).commit(running)
    assert world.storage.task(task_id).status is Status.RUNNING


def test_an_owned_subtask_of_an_ended_owner_is_refused(
    world: World,
) -> None:
    kernel, handle, parent_id = start(
        world, "parent", {"name": "p", "children": [{"kind": "asker", "input": {"name": "a"}}]}
    )
    registry = kernel.registry
    scheduler = world.scheduler(registry)
    scheduler.run_until_idle()
    [child_id] = world.storage.task(parent_id).wait_deps
    answer = Draft(actor="user:ann")
    answer.signal(child_id, "resolution", {"decision": "yes"})
    handle.commit(answer)
    scheduler.run_until_idle()
    assert world.storage.task(parent_id).outcome["kind"] == "succeeded"

    child = world.storage.task(child_id)
    owned = Draft(actor="user:ann")
    owned.restart(child_id, entries(world, child_id)[0], expected_seq=child.updated_seq)
    with pytest.raises(IllegalTransition, match="start its owner again"):
        kernel.open(handle.id).commit(owned)

    # The owner itself starts again from its first phase: a new child, which waits for an
    # answer of its own (the old one's answer is not the new one's).
    parent = world.storage.task(parent_id)
    again = Draft(actor="user:ann")
    again.restart(parent_id, entries(world, parent_id)[0], expected_seq=parent.updated_seq)
    kernel.open(handle.id).commit(again)
    scheduler.run_until_idle()
    waiting = world.storage.task(parent_id)
    assert waiting.status is Status.WAITING
    [new_child] = waiting.wait_deps
    assert new_child != child_id
    assert world.storage.task(new_child).status is Status.WAITING
    assert world.storage.task(child_id).outcome["kind"] == "succeeded"  # the old one stays


def test_a_restarted_phase_waits_again_for_the_signal_it_had_received(world: World) -> None:
    kernel, handle, task_id = start(world, "asker", {"name": "a"})
    scheduler = world.scheduler(kernel.registry)
    scheduler.run_until_idle()
    answer = Draft(actor="user:ann")
    answer.signal(task_id, "resolution", {"decision": "yes"})
    handle.commit(answer)
    scheduler.run_until_idle()
    answered = world.storage.task(task_id)
    assert answered.outcome["kind"] == "succeeded"

    draft = Draft(actor="user:ann")
    draft.restart(task_id, entries(world, task_id)[0], expected_seq=answered.updated_seq)
    kernel.open(handle.id).commit(draft)
    scheduler.run_until_idle()
    again = world.storage.task(task_id)
    assert (again.status, again.waits_on.signal, again.signals) == (Status.WAITING,
                                                                    "resolution", {})
