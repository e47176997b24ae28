"""An operator's action carries what the operator saw, and the commit refuses it (under
the session's lock) when that changed: a wake the task's ``updated_seq``, a cancel the
task's ``run``, a resubmission the original submission's ``updated_seq``, a compaction
the conversation's newest entry. A refused commit writes nothing. Run against both storages."""

from __future__ import annotations

from typing import Any

import pytest

from kernel import DocumentConflict, Draft, StaleStep, Status, SubmissionStatus, UnknownRecord
from kernel.commit import CommitKind
from kernel.forks import phase_entries

from .definitions import start
from .draft_shapes import SHAPES, shaped
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


@pytest.mark.parametrize("shape", SHAPES)
def test_a_newest_entry_expected_of_a_conversation_is_checked_in_the_commit(
    world: World, shape: str,
) -> None:
    """``Draft.expect_newest_entry``: the commit is refused (StaleStep, nothing written)
    unless the conversation's newest entry is the one expected when it is built (an
    operator's compaction names the newest entry they saw). Beside each shape of draft
    that a storage could otherwise write a shorter way, it is committed the general way,
    so no storage passes over the check."""
    kernel, handle, _ = start(world, "napper", {"name": "n"})
    made = Draft(actor="user:ann")
    conversation = made.create_conversation()
    seen = made.append(conversation, "user", {"text": "hello"})
    handle.commit(made)
    later = Draft(actor="agent:turn")
    newest = later.append(conversation, "user", {"text": "one more"})
    handle.commit(later)  # after the caller saw ``seen``

    def draft(expected: str | None) -> tuple[Draft, Any]:
        made, known = shaped(world, handle, shape, conversation, "on", expected,
                             actor="user:olga", key=f"k-{expected}")
        made.expect_newest_entry(conversation, expected)
        assert made.kind() is CommitKind.GENERAL
        return made, known

    for stale in (seen, None):
        refused, known = draft(stale)
        before = head(world, handle.id)
        with pytest.raises(StaleStep, match=f"newest entry of {conversation} is {newest}, "
                                            f"not {stale or 'none'}"):
            kernel.open(handle.id).commit(refused, known=known)
        assert head(world, handle.id) == before
        assert [e.id for e in kernel.entries(conversation)] == [seen, newest]
        assert world.storage.document_head(handle.id, "plan", "other") is None

    current, known = draft(newest)
    written = kernel.open(handle.id).commit(current, known=known)
    assert written.commit.seq == head(world, handle.id)
    if shape in ("alone", "keyed", "next writing"):
        assert kernel.entries(conversation)[-1].payload == {"on": newest}


def test_a_newest_entry_expected_of_an_empty_conversation_or_a_fork_is_its_transcripts(
    world: World,
) -> None:
    """A conversation with no entries ends with none; a fork with none of its own ends
    with the entry it forks at (its origin's later entries are not in its transcript);
    a conversation created in the same draft holds none yet; an unknown one is refused."""
    kernel, handle, _ = start(world, "napper", {"name": "n"})
    made = Draft(actor="user:ann")
    origin = made.create_conversation()
    empty = made.create_conversation()
    first = made.append(origin, "user", {"text": "hello"})
    handle.commit(made)
    forked = Draft(actor="user:ann")
    fork = forked.create_conversation(fork_of=origin, fork_entry_id=first)
    handle.commit(forked)
    after = Draft(actor="agent:turn")
    later = after.append(origin, "user", {"text": "more"})
    handle.commit(after)

    def commit(conversation: str, expected: str | None, *, fresh: bool = False) -> None:
        draft = Draft(actor="user:olga")
        if fresh:
            conversation = draft.create_conversation(fork_of=origin, fork_entry_id=later)
        draft.expect_newest_entry(conversation, expected)
        draft.record_operation("look", {"at": conversation})
        kernel.open(handle.id).commit(draft)

    before = head(world, handle.id)
    with pytest.raises(StaleStep, match=f"newest entry of {empty} is none, not {first}"):
        commit(empty, first)
    with pytest.raises(StaleStep, match=f"newest entry of {fork} is {first}, not {later}"):
        commit(fork, later)
    with pytest.raises(StaleStep, match=f"is {later}, not none"):
        commit("", None, fresh=True)
    with pytest.raises(UnknownRecord, match="no conversation conv_nope"):
        commit("conv_nope", None)
    assert head(world, handle.id) == before
    commit(empty, None)
    commit(fork, first)
    commit(origin, later)
    commit("", later, fresh=True)
    assert head(world, handle.id) == before + 4


def test_a_draft_expecting_a_newest_entry_absorbs_no_append_to_that_conversation() -> None:
    """Apart, an entry appended by one commit would refuse the next that expects the
    entry before it; together in one commit the check would pass over it."""
    for expecting_first in (True, False):
        expects, appends = Draft(), Draft()
        expects.expect_newest_entry("conv_a", "entry_seen")
        appends.append("conv_a", "note", {})
        first, second = (expects, appends) if expecting_first else (appends, expects)
        with pytest.raises(DocumentConflict, match="newest entry of conv_a"):
            first.absorb(second)
    elsewhere, expects = Draft(), Draft()
    elsewhere.append("conv_b", "note", {})
    expects.expect_newest_entry("conv_a", "entry_seen")
    elsewhere.absorb(expects)
    assert elsewhere.newest_entries == [("conv_a", "entry_seen")]
    assert elsewhere.kind() is CommitKind.GENERAL
