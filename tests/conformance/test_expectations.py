"""An operator's action carries what the operator saw, and the commit refuses it (under
the session's lock) when that changed: a wake the task's ``updated_seq``, a cancel the
task's ``run``, a resubmission the original submission's ``updated_seq``. A refused
commit writes nothing. Run against both storages."""

from __future__ import annotations

import pytest

from kernel import Draft, StaleStep, Status, SubmissionStatus
from kernel.forks import phase_entries

from .definitions import start
from .world import World


def head(world: World, session_id: str) -> int:
    session = world.storage.session(session_id)
    assert session is not None
    return session.head_seq


def test_a_wake_for_a_sleep_that_changed_since_is_refused_and_writes_nothing(
    world: World,
) -> None:
    kernel, handle, task_id = start(world, "napper", {"name": "n", "seconds": 60})
    world.scheduler(kernel.registry).run_until_idle()
    sleeping = world.storage.task(task_id)
    assert sleeping.status is Status.SLEEPING
    before = head(world, handle.id)

    stale = Draft(actor="user:olga", key="wake-stale")
    stale.wake(task_id, expected_seq=sleeping.updated_seq - 1)
    stale.record_operation("wake", {"target": task_id})
    with pytest.raises(StaleStep, match=f"changed at #{sleeping.updated_seq}"):
        kernel.open(handle.id).commit(stale)
    assert head(world, handle.id) == before
    assert world.storage.task(task_id).status is Status.SLEEPING

    woken = Draft(actor="user:olga")
    woken.wake(task_id, expected_seq=sleeping.updated_seq)
    kernel.open(handle.id).commit(woken)
    assert world.storage.task(task_id).status is Status.PENDING


def test_a_retry_and_a_restart_each_start_another_run_which_a_cancel_names(
    world: World,
) -> None:
    """The run changes when an operator starts the task again (retry, restart from a
    phase), not at its own commits and claims: a cancel naming the run it saw stops the
    task whatever phase that run reached, and is refused once the task runs again."""
    kernel, handle, task_id = start(world, "step", {"name": "s", "fail": True})
    world.scheduler(kernel.registry).run_until_idle()
    failed = world.storage.task(task_id)
    assert failed.outcome["kind"] == "failed" and failed.run == 0
    retry = Draft(actor="user:omar")
    retry.retry(task_id)
    kernel.open(handle.id).commit(retry)
    assert world.storage.task(task_id).run == 1

    before = head(world, handle.id)
    stale = Draft(actor="user:olga", key="cancel-stale")
    stale.cancel(task_id, "stop the run I saw", expected_run=0)
    stale.record_operation("cancel", {"target": task_id})
    with pytest.raises(StaleStep, match="run 1"):
        kernel.open(handle.id).commit(stale)
    assert head(world, handle.id) == before
    assert world.storage.task(task_id).cancel is None

    world.scheduler(kernel.registry).run_until_idle()  # fails again: run 1 still
    entry = next(phase_entries(task_id, world.storage.commits_after(handle.id, 0, 1000)))
    restart = Draft(actor="user:omar")
    restart.restart(task_id, entry, expected_seq=world.storage.task(task_id).updated_seq)
    kernel.open(handle.id).commit(restart)
    assert world.storage.task(task_id).run == 2


def test_a_cancel_naming_the_run_it_saw_lands_whatever_phase_that_run_reached(
    world: World,
) -> None:
    kernel, handle, task_id = start(world, "napper", {"name": "n", "seconds": 60})
    seen = world.storage.task(task_id)
    world.scheduler(kernel.registry).run_until_idle()  # claimed, a phase, asleep: same run
    assert world.storage.task(task_id).updated_seq != seen.updated_seq
    cancel = Draft(actor="user:olga")
    cancel.cancel(task_id, "not needed", expected_run=seen.run)
    kernel.open(handle.id).commit(cancel)
    assert world.storage.task(task_id).cancel["reason"] == "not needed"


def test_a_resubmission_from_a_stale_view_of_its_original_is_refused_and_writes_nothing(
    world: World,
) -> None:
    """Two operators resubmitting one failed submission from the same page: the first
    resubmission changes the original (its count of resubmissions, its seq), so the
    second, which saw it before, is refused rather than run the same input twice."""
    kernel, handle, _ = start(world, "napper", {"name": "n"})
    made = Draft(actor="user:ann")
    conversation = made.create_conversation()
    original_id = made.submit(conversation, "req-1", {"text": "hello"})
    made.update_submission(original_id, SubmissionStatus.FAILED, reason="provider down")
    kernel.open(handle.id).commit(made)
    seen = world.storage.submission(original_id)
    assert seen.resubmits == 0

    def resubmit(request_id: str, expected_seq: int) -> None:
        draft = Draft(actor="user:olga")
        draft.submit(conversation, request_id, {"text": "hello"}, resubmit_of=original_id,
                     expected_seq=expected_seq)
        draft.record_operation("resubmit", {"target": original_id})
        kernel.open(handle.id).commit(draft)

    resubmit("by-omar", seen.updated_seq)
    original = world.storage.submission(original_id)
    assert (original.resubmits, original.status) == (1, SubmissionStatus.FAILED)
    assert original.updated_seq == head(world, handle.id)
    before = head(world, handle.id)
    with pytest.raises(StaleStep, match=f"changed at #{original.updated_seq}"):
        resubmit("by-olga", seen.updated_seq)
    assert head(world, handle.id) == before
    assert world.storage.submission_by_request(handle.id, "by-olga") is None
    resubmit("by-olga", original.updated_seq)  # having looked again
    assert world.storage.submission(original_id).resubmits == 2
