"""The environment a run was started under (kernel.environment): recorded when its task
is created; a worker that lacks or changed what the run needs leaves it blocked and says
why; a compatible change (something added) continues; a migrate (a commit) lets it go on
under the worker's environment; a restart from a phase may take it too. Run against both
storages."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from kernel import Draft, IllegalTransition, Registry, Run, StaleStep, Status, Transition, Worker
from kernel.dispatch import Dispatcher
from kernel.environment import BLOCKED_DOCUMENT, ENVIRONMENT, KERNEL_VERSION
from kernel.forks import phase_entries

from .world import World

JSON = Any


def tooled(offered: dict[str, JSON], ran: list[str]) -> Registry:
    """A task that needs one tool (its input names it): it waits for a go, then uses it."""
    registry = Registry()

    @registry.task("tooled")
    class Tooled:
        initial = "wait"

        def needs(self, input: JSON, checkpoint: JSON) -> dict[str, JSON]:
            name = input["tool"]
            return {f"tool {name}": offered.get(name)}

        def wait(self, run: Run) -> Transition:
            if run.signal("go") is None:
                return run.wait_for("go")
            return run.next("use")

        def use(self, run: Run) -> Transition:
            ran.append(run.input["tool"])
            return run.succeed(run.input["tool"])

    return registry


def started(world: World, registry: Registry, *tools: str) -> tuple[Any, list[str]]:
    kernel = world.kernel(registry)
    handle = kernel.create_session()
    draft = Draft(actor="user:ann")
    ids = [draft.create_task("tooled", {"tool": t}) for t in tools]
    handle.commit(draft)
    worker = Worker(kernel, "w1")
    for task_id in ids:
        assert worker.advance(task_id)  # waits for its go
    go = Draft(actor="user:ann")
    for task_id in ids:
        go.signal(task_id, "go", True)
    handle.commit(go)
    return handle, ids


def test_a_changed_tool_blocks_the_run_that_needs_it_and_a_migrate_lets_it_go_on(
    world: World,
) -> None:
    offered = {"pay": "schema-1", "look": "schema-1"}
    ran: list[str] = []
    registry = tooled(offered, ran)
    handle, (pay, look) = started(world, registry, "pay", "look")
    recorded = world.storage.task(pay).checkpoint[ENVIRONMENT]
    assert recorded == {"kernel": KERNEL_VERSION, "definition": "tooled v1",
                        "tool pay": "schema-1"}

    offered["pay"] = "schema-2"  # the worker now runs with pay's schema changed
    offered["extra"] = "new"  # and a tool added, which no run needs
    kernel = world.kernel(registry)
    worker = Worker(kernel, "w2")
    assert not worker.advance(pay)
    assert worker.advance(look)  # the run that needs nothing changed continues
    assert ran == ["look"]
    blocked = world.storage.task(pay)
    assert (blocked.status, blocked.lease_owner) == (Status.PENDING, None)
    report = kernel.document(handle.id, BLOCKED_DOCUMENT, pay)
    assert report["differences"] == [
        "tool pay: schema-2 here, it was started with schema-1"]
    assert report["worker"] == "w2" and report["task_seq"] == blocked.updated_seq
    head = world.storage.session(handle.id).head_seq
    assert not worker.advance(pay)  # found again: said once
    assert world.storage.session(handle.id).head_seq == head

    stale = Draft(actor="user:olga")
    stale.migrate_environment(pay, report["offered"], expected_seq=blocked.updated_seq - 1)
    with pytest.raises(StaleStep):
        kernel.open(handle.id).commit(stale)
    migrate = Draft(actor="user:olga")
    migrate.migrate_environment(pay, report["offered"], expected_seq=blocked.updated_seq)
    written = kernel.open(handle.id).commit(migrate)
    assert [d.task_id for d in written.dispatches] == [pay]
    assert world.storage.task(pay).checkpoint[ENVIRONMENT]["tool pay"] == "schema-2"
    assert worker.advance(pay)
    assert ran == ["look", "pay"]
    assert world.storage.task(pay).outcome["kind"] == "succeeded"


def test_a_removed_tool_blocks_and_a_restart_forks_under_the_new_environment(
    world: World,
) -> None:
    offered = {"pay": "schema-1"}
    ran: list[str] = []
    registry = tooled(offered, ran)
    handle, (pay,) = started(world, registry, "pay")
    del offered["pay"]
    kernel = world.kernel(registry)
    worker = Worker(kernel, "w2")
    assert not worker.advance(pay)
    report = kernel.document(handle.id, BLOCKED_DOCUMENT, pay)
    assert report["differences"] == ["tool pay: missing here (it was started with schema-1)"]

    offered["pay"] = "schema-3"
    first = next(phase_entries(pay, world.storage.commits_after(handle.id, 0, 100)))
    fork = Draft(actor="user:olga")
    fork.restart(pay, first, expected_seq=world.storage.task(pay).updated_seq,
                 environment={**report["offered"], "tool pay": "schema-3"})
    kernel.open(handle.id).commit(fork)
    assert worker.advance(pay)  # from the first phase: waits for a go of its own
    assert world.storage.task(pay).status is Status.WAITING and ran == []


def test_only_a_task_waiting_to_run_again_is_migrated(world: World) -> None:
    offered = {"pay": "schema-1"}
    registry = tooled(offered, [])
    handle, (pay,) = started(world, registry, "pay")
    kernel = world.kernel(registry)
    assert Worker(kernel, "w1").advance(pay)
    done = world.storage.task(pay)
    assert done.terminal
    late = Draft(actor="user:olga")
    late.migrate_environment(pay, {"tool pay": "x"}, expected_seq=done.updated_seq)
    with pytest.raises(IllegalTransition, match="only a task waiting"):
        kernel.open(handle.id).commit(late)


def test_a_task_left_blocked_here_backs_off_instead_of_coming_back_at_every_sweep(
    world: World,
) -> None:
    """The worker that gave a blocked task back is not sent it again at every sweep:
    its deliveries back off, as a task no definition can run does."""
    offered = {"pay": "schema-1"}
    registry = tooled(offered, [])
    handle, (pay,) = started(world, registry, "pay")
    offered["pay"] = "schema-2"
    kernel = world.kernel(registry)
    worker = Worker(kernel, "w2")
    delivered: list[str] = []

    def deliver(task: str, queue: str) -> None:
        delivered.append(task)
        worker.advance(task)

    dispatcher = Dispatcher(kernel, deliver, redeliver_after=timedelta(seconds=30))
    dispatcher.sweep()  # the go's row: blocked here
    for _ in range(600):  # ten minutes of a sweep a second
        world.clock.advance(1)
        dispatcher.sweep()
    task = world.storage.task(pay)
    assert task.status is Status.PENDING and task.lease_owner is None
    # Backing off from 30 s, doubling: at most 30, 60, 120, 240 s in ten minutes.
    assert 1 <= len(delivered) <= 5, len(delivered)
