"""A commit that only creates tasks (a client starting work) is built before anything
is read and written with its BEGIN in one round trip: the database advances the
session's head and every seq written is that head. Anything else it would need (a
read, a write besides new tasks) or anything the database refuses sends it down the
usual two-round-trip path, whose build decides and says why.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from kernel import CommitRejected, Draft, DuplicateCommit, SessionHandle, UnknownRecord
from kernel.records import Status

from .round_trips import counting_pipelines, kernel_with, log_is_whole

pytestmark = pytest.mark.django_db(transaction=True)


def head(handle: SessionHandle) -> int:
    stored = handle.kernel.storage.session(handle.id)
    assert stored is not None
    return stored.head_seq


def create(handle: SessionHandle, count: int = 1) -> list[str]:
    draft = Draft(actor="user:x")
    ids = [draft.create_task("steps", {"n": n}) for n in range(count)]
    handle.commit(draft)
    return ids


def test_a_commit_of_new_tasks_is_one_round_trip_stamped_with_the_head() -> None:
    kernel = kernel_with(phases=1)
    handle = kernel.create_session()
    for _ in range(3):  # the head moves: the build's guess (0) is not it
        create(handle)
    draft = Draft(actor="user:x")
    ids = [draft.create_task("steps", {"n": n}) for n in range(3)]
    with counting_pipelines() as pipelines:
        written = handle.commit(draft)
    assert pipelines == [1]
    seq = written.commit.seq
    assert seq == handle.head_seq == head(handle)
    assert written.commit.id > 0
    assert [t.id for t in written.new_tasks] == ids
    for task_id in ids:
        stored = kernel.storage.task(task_id)
        assert stored is not None and stored.status is Status.PENDING
        assert (stored.created_seq, stored.updated_seq) == (seq, seq)
    assert {t.created_seq for t in written.new_tasks} == {seq}
    assert [d.seq for d in written.dispatches] == [seq] * 3
    assert all(d.id > 0 for d in written.dispatches)
    assert log_is_whole(kernel, handle.id)[-1] == seq


def test_a_create_in_a_session_that_does_not_exist_lands_nothing() -> None:
    kernel = kernel_with(phases=1)
    handle = kernel.create_session()
    handle.id = "session_0000000000000000000000000000"
    draft = Draft(actor="user:x")
    task_id = draft.create_task("steps", {})
    with pytest.raises(UnknownRecord, match="no session"):
        handle.commit(draft)
    assert kernel.storage.task(task_id) is None


def test_a_create_whose_id_is_taken_is_refused_and_leaves_the_head() -> None:
    kernel = kernel_with(phases=1)
    handle = kernel.create_session()
    [task_id] = create(handle)
    before = head(handle)
    again = Draft(actor="user:x")
    again.create_task("steps", {})
    again.new_tasks[0] = replace(again.new_tasks[0], id=task_id)
    with pytest.raises(Exception, match="duplicate key"):
        handle.commit(again)
    assert head(handle) == before
    assert log_is_whole(kernel, handle.id)[-1] == before


@pytest.mark.parametrize("what", ["a key used before", "an unknown kind", "a parent"])
def test_a_create_that_needs_a_read_or_is_refused_takes_the_usual_path(what: str) -> None:
    kernel = kernel_with(phases=1)
    handle = kernel.create_session()
    [parent_id] = create(handle)
    if what == "a key used before":
        handle.commit(Draft(actor="user:x", key="k"))
    draft = Draft(actor="user:x", key="k" if what == "a key used before" else None)
    if what == "a parent":
        child_id = draft.create_task("steps", {}, parent_id=parent_id)
    else:
        draft.create_task("nope" if what == "an unknown kind" else "steps", {})
    with counting_pipelines() as pipelines:
        if what == "a key used before":
            with pytest.raises(DuplicateCommit):
                handle.commit(draft)
        elif what == "an unknown kind":
            with pytest.raises(CommitRejected, match="nope"):
                handle.commit(draft)
        else:
            written = handle.commit(draft)
            child = kernel.storage.task(child_id)
            assert child is not None and child.created_seq == written.commit.seq
    assert pipelines[0] >= 1
    log_is_whole(kernel, handle.id)
