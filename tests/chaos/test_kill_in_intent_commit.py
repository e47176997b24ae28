"""A worker killed inside a notice's first commit, the one that records the intent
("from here on this email may have been sent"), before anything was sent.

A commit in progress when its process dies lands as a whole or not at all, and
recovery carries on from whichever it was, sending the email exactly once. The intent
commit is one statement (``CommitKind.NEXT_WRITING``: the notice's lease read the plan
document's head before it), so wherever it blocks the server already holds all of it
and finishes it once the lock is free, though nobody is left to hear the answer. Two
stopping points:

- blocked on the session's commit order (its first lock);
- blocked writing the plan document (the document's row is held).

Either way the notice is found at ``confirm``: recovery asks the provider, which never
got the email, and sends it once. A general commit killed while it waits for the
session's order has sent nothing but its first round trip, so nothing of it lands:
``test_kill_in_summarize.py``.
"""

from __future__ import annotations

import time

import pytest

from kernel import Status

from .harness import (
    RECIPIENTS,
    Stack,
    assert_sent_once_each,
    backends_gone,
    document_lock,
    lock_waiters,
    session_held,
    session_lock,
    wait_for,
)

FIRST = RECIPIENTS[0]
pytestmark = [pytest.mark.chaos, pytest.mark.slow]


def planned_batch(stack: Stack) -> tuple[str, str]:
    """A batch planned (in the test process), its five notices queued for ``hands``."""
    stack.beat()
    session_id, batch_id = stack.send_batch(RECIPIENTS)
    assert stack.advance(batch_id)
    assert stack.task(batch_id).status is Status.WAITING
    assert [n.status for n in stack.notices(session_id).values()] == [Status.PENDING] * 5
    return session_id, batch_id


def plan_state(stack: Stack, session_id: str, batch_id: str) -> dict[str, str]:
    plan = stack.kernel.document(session_id, "email-plan", batch_id)
    return {to: entry["state"] for to, entry in plan["recipients"].items()}


def finish_and_check(stack: Stack, session_id: str, batch_id: str) -> None:
    stack.worker("w2", queues="default,hands")  # also runs the sweeps and the summary
    batch = stack.wait_terminal(batch_id)
    assert_sent_once_each(stack, batch, RECIPIENTS)
    assert {to: len(stack.posts(to)) for to in RECIPIENTS} == dict.fromkeys(RECIPIENTS, 1)
    notices = stack.notices(session_id)
    # The first notice was claimed twice (the killed run, the recovery); the rest once.
    assert {to: n.epoch for to, n in notices.items()} == {FIRST: 2, **dict.fromkeys(
        RECIPIENTS[1:], 1)}
    # One intent commit landed for it: the killed run's or the recovery's, never both.
    assert stack.history(notices[FIRST].id).count(("running", "confirm")) == 1
    seqs = [c.seq for c in stack.kernel.commits_after(session_id, 0)]
    assert seqs == list(range(1, stack.head_seq(session_id) + 1))


def test_killed_waiting_for_the_session_order_in_the_intent_commit(stack: Stack) -> None:
    session_id, batch_id = planned_batch(stack)
    head = stack.head_seq(session_id)

    with session_lock(session_id) as lock:
        hands = stack.worker("hands1", queues="hands")
        waiters = wait_for(
            lambda: stack.notices(session_id)[FIRST].status is Status.RUNNING
            and lock_waiters(lock),
            "the first notice's intent commit to block on the session lock",
        )
        notice = stack.notices(session_id)[FIRST]
        assert (notice.phase, notice.epoch) == ("send", 1)
        hands.kill()
    wait_for(lambda: backends_gone(waiters), "the killed worker's backend to end")
    landed_whole(stack, session_id, batch_id, head)


def landed_whole(stack: Stack, session_id: str, batch_id: str, head: int) -> None:
    """The intent commit landed whole: the head moved once, the plan says "sending",
    the notice is at ``confirm`` under the dead worker's lease, nothing was sent; then
    recovery asks the provider before it sends, once."""
    assert stack.head_seq(session_id) == head + 1
    [commit] = stack.kernel.commits_after(session_id, head)
    assert commit.actor == f"task:{stack.notices(session_id)[FIRST].id}"
    assert plan_state(stack, session_id, batch_id)[FIRST] == "sending"
    notice = stack.notices(session_id)[FIRST]
    assert (notice.status, notice.phase, notice.epoch) == (Status.RUNNING, "confirm", 1)
    assert stack.admin.requests() == []

    finish_and_check(stack, session_id, batch_id)
    # Recovery asked before sending: one lookup, then the one POST.
    [lookup] = stack.lookups(notice.input["operation_id"])
    [post] = stack.posts(FIRST)
    assert lookup["seq"] < post["seq"]


def test_killed_in_the_write_step_of_the_intent_commit(stack: Stack) -> None:
    session_id, batch_id = planned_batch(stack)
    head = stack.head_seq(session_id)
    plan_version = stack.kernel.document_version(session_id, "email-plan", batch_id)

    with document_lock(session_id, "email-plan", batch_id) as lock:
        hands = stack.worker("hands1", queues="hands")
        waiters = wait_for(
            lambda: stack.notices(session_id)[FIRST].status is Status.RUNNING
            and lock_waiters(lock),
            "the first notice's intent commit to block writing the plan document",
        )
        # It took the session's commit order and has written (so it has a transaction id).
        assert session_held(lock, session_id)
        assert lock.execute(
            "SELECT count(*) FROM pg_locks WHERE pid = ANY(%s) AND granted "
            "AND locktype = 'transactionid'",
            [waiters],
        ).fetchone() == (1,)
        # The worker queues COMMIT right after the statement now blocked: give it a
        # moment to be on the wire (it takes microseconds) before the kill.
        time.sleep(0.2)
        hands.kill()
    wait_for(lambda: backends_gone(waiters), "the killed worker's backend to end")
    assert stack.kernel.document_version(session_id, "email-plan", batch_id) == plan_version + 1
    landed_whole(stack, session_id, batch_id, head)
