"""The general commit reads what its draft announces in its first round trip, with the
session's lock: the submissions it updates too, so settling a turn's submissions costs
no read of its own between the two round trips; and an update "unless settled" is
decided there, on what the lock holds, by both storages alike."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from controlplane.storage import statements as sql
from kernel import (
    Draft,
    IllegalTransition,
    InMemoryStorage,
    Kernel,
    ManualClock,
    Registry,
    SessionHandle,
    SubmissionStatus,
)

from .round_trips import counting_pipelines, kernel_with

pytestmark = pytest.mark.django_db(transaction=True)


def submitted(count: int) -> tuple[SessionHandle, list[str]]:
    kernel = kernel_with()
    handle = kernel.create_session()
    draft = Draft(actor="user:x")
    conversation = draft.create_conversation()
    handle.commit(draft)
    ids = [handle.submit(conversation, f"req-{n}", {"text": f"hello {n}"}).id
           for n in range(count)]
    return handle, ids


def test_the_submissions_a_commit_updates_are_read_with_its_lock_not_one_by_one() -> None:
    handle, ids = submitted(2)
    draft = Draft(actor="user:x")
    for submission in ids:
        draft.update_submission(submission, SubmissionStatus.CANCELLED, reason="not wanted")
    with counting_pipelines() as pipelines, CaptureQueriesContext(connection) as queries:
        handle.commit(draft)
    assert pipelines[0] == 2  # the reads with the lock, then the writes with COMMIT
    sent = [q["sql"] for q in queries.captured_queries]
    assert sql.SUBMISSION_BY_ID not in sent and sent.count(sql.SUBMISSIONS_BY_ID) == 1
    storage = handle.kernel.storage
    for submission in ids:
        stored = storage.submission(submission)
        assert stored is not None
        assert stored.status is SubmissionStatus.CANCELLED and stored.reason == "not wanted"


def test_a_submission_settled_since_the_draft_was_made_is_refused_as_before() -> None:
    handle, [submission] = submitted(1)
    late = Draft(actor="user:x")
    late.update_submission(submission, SubmissionStatus.CANCELLED, reason="late")
    first = Draft(actor="user:y")
    first.update_submission(submission, SubmissionStatus.FAILED, reason="first")
    handle.commit(first)
    with pytest.raises(IllegalTransition, match="already failed"):
        handle.commit(late)


@pytest.mark.parametrize("storage", ["memory", "postgres"])
def test_an_update_unless_settled_leaves_a_settled_submission_as_it_is(storage: str) -> None:
    """What a turn's end asks for its submissions: one settled since it was read (an
    operator cancelled it) stays as it is, and the rest of the commit is written."""
    if storage == "memory":
        kernel = Kernel(InMemoryStorage(), Registry(), ManualClock())
        handle = kernel.create_session()
        draft = Draft(actor="user:x")
        conversation = draft.create_conversation()
        handle.commit(draft)
        ids = [handle.submit(conversation, f"req-{n}", {"text": "hi"}).id for n in range(2)]
    else:
        handle, ids = submitted(2)
    cancelled, open_ = ids
    operator = Draft(actor="user:olga")
    operator.update_submission(cancelled, SubmissionStatus.CANCELLED, reason="not wanted")
    handle.commit(operator)
    ending = Draft(actor="task:t")
    for submission in ids:
        ending.update_submission(submission, SubmissionStatus.FAILED, reason="the turn failed",
                                 unless_settled=True)
    handle.commit(ending)
    stored = [handle.kernel.storage.submission(s) for s in ids]
    assert [(s.status, s.reason) for s in stored if s is not None] == [
        (SubmissionStatus.CANCELLED, "not wanted"), (SubmissionStatus.FAILED, "the turn failed")]
    strict = Draft(actor="task:t")
    strict.update_submission(open_, SubmissionStatus.ANSWERED)
    with pytest.raises(IllegalTransition, match="already failed"):
        handle.commit(strict)
