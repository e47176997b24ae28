"""Giving a lease back (``Storage.release``, what a draining worker does), on both storages:
fenced by owner and epoch, claimable at once, a restart counted only for a phase that
was interrupted, and a dispatch row for the sweep."""

from __future__ import annotations

from datetime import timedelta

import pytest

from kernel import Draft, Finish, Outcome, Registry, Run, StaleLease, Status, Transition, Worker

from .definitions import Effects, make_registry
from .world import World


def claimed_step(world: World):
    kernel = world.kernel(make_registry(Effects()))
    handle = kernel.create_session()
    draft = Draft(actor="user:ann")
    task_id = draft.create_task("step", {"name": "s"})
    handle.commit(draft)
    now = world.clock.now()
    task = world.storage.claim(task_id, "w1", now, now + timedelta(seconds=30))
    assert task is not None
    return kernel, handle, task


def test_a_released_lease_is_claimable_at_once_without_a_restart(world: World) -> None:
    kernel, handle, held = claimed_step(world)
    now = world.clock.now()
    released = world.storage.release(held.id, "w1", held.epoch, now)
    assert released is not None
    assert (released.status, released.lease_owner, released.lease_until) == (
        Status.PENDING, None, None)
    assert released.epoch == held.epoch + 1 and released.restarts == 0
    assert world.storage.task(held.id) == released
    # the sweep sees it as due work: one dispatch row, however often it is released
    taken = world.storage.take_due_dispatches(now, timedelta(seconds=30), 10)
    assert [d.task_id for d in taken] == [held.id]
    again = world.storage.claim(held.id, "w2", now, now + timedelta(seconds=30))
    assert again is not None and again.epoch == held.epoch + 2 and again.restarts == 0
    assert world.storage.take_due_dispatches(now, timedelta(0), 10) == []


def test_only_the_holder_at_its_epoch_can_release_and_then_it_cannot_commit(
    world: World,
) -> None:
    kernel, handle, held = claimed_step(world)
    now = world.clock.now()
    assert world.storage.release(held.id, "someone-else", held.epoch, now) is None
    assert world.storage.release(held.id, "w1", held.epoch - 1, now) is None
    assert world.storage.task(held.id) == held  # nothing changed
    assert world.storage.take_due_dispatches(now, timedelta(seconds=30), 10) == []

    assert world.storage.release(held.id, "w1", held.epoch, now) is not None
    assert world.storage.release(held.id, "w1", held.epoch, now) is None  # once
    late = Draft(actor="worker:w1")
    late.transition(held.id, held.epoch, Finish(Outcome.SUCCEEDED, "late"))
    with pytest.raises(StaleLease):
        kernel.open(handle.id).commit(late)
    assert not world.storage.renew(held.id, "w1", held.epoch, now + timedelta(seconds=60))


def test_an_interrupted_release_is_an_expiry_now(world: World) -> None:
    kernel, handle, held = claimed_step(world)
    now = world.clock.now()
    released = world.storage.release(held.id, "w1", held.epoch, now, interrupted=True)
    assert released is not None
    assert (released.status, released.lease_owner, released.lease_until) == (
        Status.RUNNING, "w1", now)
    assert released.epoch == held.epoch + 1
    world.clock.advance(0.001)
    later = world.clock.now()
    assert [t.id for t in world.storage.expired_leases(later, 10)] == [held.id]
    again = world.storage.claim(held.id, "w2", later, later + timedelta(seconds=30))
    assert again is not None and again.restarts == 1 and again.epoch == held.epoch + 2


def test_a_terminal_or_unclaimed_task_has_nothing_to_release(world: World) -> None:
    kernel, handle, held = claimed_step(world)
    done = Draft(actor="worker:w1")
    done.transition(held.id, held.epoch, Finish(Outcome.SUCCEEDED, "ok"))
    kernel.open(handle.id).commit(done)
    assert world.storage.release(held.id, "w1", held.epoch, world.clock.now()) is None
    assert world.storage.task(held.id).status is Status.TERMINAL


def two_phases(effects: Effects, on_first=None) -> Registry:
    registry = make_registry(effects)

    @registry.task("two-phases")
    class TwoPhases:
        initial = "first"

        def first(self, run: Run) -> Transition:
            effects.external(run, "first")
            if on_first is not None:
                on_first(run)
            return run.next("second")

        def second(self, run: Run) -> Transition:
            effects.external(run, "second")
            return run.succeed("done")

    return registry


def worker_with_a_task(world: World, registry: Registry, worker_id: str, **kwargs):
    """A worker on ``registry`` and a new "two-phases" task for it to advance."""
    kernel = world.kernel(registry)
    worker = Worker(kernel, worker_id, **kwargs)
    handle = kernel.create_session()
    draft = Draft(actor="user:ann")
    task_id = draft.create_task("two-phases", {"name": "t"})
    handle.commit(draft)
    return kernel, worker, task_id


def test_a_draining_worker_finishes_its_phase_and_hands_the_next_one_over(
    world: World,
) -> None:
    effects = Effects()
    released: list[str] = []
    holder: list[Worker] = []
    registry = two_phases(effects, on_first=lambda run: holder[0].drain())
    kernel, draining, task_id = worker_with_a_task(
        world, registry, "draining", on_release=lambda task: released.append(task.id))
    holder.append(draining)

    assert draining.advance(task_id)  # "first" runs and commits; "second" is handed over
    task = world.storage.task(task_id)
    assert (task.status, task.phase, task.restarts) == (Status.PENDING, "second", 0)
    assert released == [task_id] and effects.calls == ["t:first"]
    assert draining.held == {}
    assert not draining.advance(task_id)  # a draining worker claims nothing more

    assert Worker(kernel, "other").advance(task_id)
    assert effects.calls == ["t:first", "t:second"]
    task = world.storage.task(task_id)
    assert task.status is Status.TERMINAL and task.outcome["kind"] == "succeeded"
    assert task.restarts == 0


def test_leases_released_mid_phase_are_taken_over_and_the_phase_commits_nothing(
    world: World,
) -> None:
    effects = Effects()
    released: list[str] = []
    holder: list[Worker] = []
    # The grace period runs out while "first" is still calling out: the process gives
    # back what it holds (and would exit here); its phase's late commit is refused.
    restarts: list[int] = []

    def first(run: Run) -> None:
        restarts.append(run.restarts)
        if len(restarts) == 1:
            released.extend(t.id for t in holder[0].release_held())

    registry = two_phases(effects, on_first=first)
    kernel, leaving, task_id = worker_with_a_task(world, registry, "leaving")
    holder.append(leaving)

    leaving.advance(task_id)
    task = world.storage.task(task_id)
    assert released == [task_id]
    assert (task.status, task.phase, task.lease_owner) == (Status.RUNNING, "first", "leaving")
    world.clock.advance(0.001)
    assert Worker(kernel, "other").advance(task_id)  # no waiting for the 30 s lease
    task = world.storage.task(task_id)
    assert task.status is Status.TERMINAL
    assert restarts == [0, 1]  # the interrupted phase ran again, counted as a restart
    assert effects.calls == ["t:first", "t:first", "t:second"]


def test_expired_leases_come_oldest_end_first_then_by_id(world: World) -> None:
    """The sweep's order, the same on every storage: which rows a sweep adds first (and
    so which task a burst claim meets first) must not depend on how a storage happens to
    hold its rows. Ties in the lease's end (tasks claimed at one moment) go by id."""
    kernel = world.kernel(make_registry(Effects()))
    handle = kernel.create_session()
    draft = Draft(actor="user:ann")
    ids = [draft.create_task("step", {"name": f"s{n}"}) for n in range(4)]
    handle.commit(draft)
    now = world.clock.now()
    ends = {ids[3]: 10, ids[2]: 20, ids[0]: 20, ids[1]: 10}
    for task_id, seconds in ends.items():  # claimed in another order than made
        assert world.storage.claim(task_id, "w1", now, now + timedelta(seconds=seconds))
    later = now + timedelta(seconds=30)
    expected = sorted(ids, key=lambda i: (ends[i], i))
    assert [t.id for t in world.storage.expired_leases(later, 10)] == expected
    assert [t.id for t in world.storage.expired_leases(later, 3)] == expected[:3]


def test_the_leases_a_dead_owner_holds_end_now_and_its_late_commit_is_refused(
    world: World,
) -> None:
    """``end_leases``: what the sweep does to a worker whose heartbeat stopped. Its live
    leases end at once, fenced by epoch as an interrupted release is; another owner's
    lease and one of its own that ran out already are left alone."""
    kernel = world.kernel(make_registry(Effects()))
    handle = kernel.create_session()
    draft = Draft(actor="user:ann")
    held, other, lapsed = (draft.create_task("step", {"name": n}) for n in "abc")
    handle.commit(draft)
    now = world.clock.now()
    assert world.storage.claim(held, "dead", now, now + timedelta(seconds=60))
    assert world.storage.claim(other, "alive", now, now + timedelta(seconds=60))
    assert world.storage.claim(lapsed, "dead", now, now + timedelta(seconds=1))
    world.clock.advance(2)
    now = world.clock.now()
    before = {t: world.storage.task(t) for t in (held, other, lapsed)}

    ended = world.storage.end_leases(["dead", "unknown"], now)
    assert [t.id for t in ended] == [held]
    assert ended[0] == world.storage.task(held)
    assert (ended[0].status, ended[0].lease_owner, ended[0].lease_until) == (
        Status.RUNNING, "dead", now)
    assert ended[0].epoch == before[held].epoch + 1 and ended[0].restarts == 0
    assert world.storage.task(other) == before[other]
    assert world.storage.task(lapsed) == before[lapsed]
    assert world.storage.end_leases(["dead"], now) == []  # once
    assert world.storage.end_leases([], now) == []

    # the owner was alive after all: it can neither renew nor commit
    assert not world.storage.renew(held, "dead", before[held].epoch, now + timedelta(60))
    late = Draft(actor="worker:dead")
    late.transition(held, before[held].epoch, Finish(Outcome.SUCCEEDED, "late"))
    with pytest.raises(StaleLease):
        kernel.open(handle.id).commit(late)

    world.clock.advance(0.001)
    later = world.clock.now()
    assert [t.id for t in world.storage.expired_leases(later, 10)] == [lapsed, held]
    again = world.storage.claim(held, "w2", later, later + timedelta(seconds=30))
    assert again is not None and again.restarts == 1 and again.epoch == before[held].epoch + 2
