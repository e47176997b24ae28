"""Every worker killed while the batch waits on its notices, two of them done.

The batch runs on a ``default`` worker and its notices on a ``hands`` worker. The
provider has accepted email 3 and answered late; its receipt commit is blocked on
the session's commit order when both workers are SIGKILLed (a deploy replacing the
whole pool). The batch held no lease while it waited, so nothing of it is lost: after
restart it keeps waiting on the same five notices, is woken once, by the commit that
finishes the last of them, and summarises once. Notices 1-2 are not touched again;
3 is confirmed by a lookup (its receipt commit rolled back), 4-5 are sent once.
"""

from __future__ import annotations

import pytest

from kernel import Status

from .harness import (
    RECIPIENTS,
    Stack,
    assert_sent_once_each,
    backends_gone,
    lock_waiters,
    session_lock,
    wait_for,
)

THIRD = RECIPIENTS[2]
pytestmark = [pytest.mark.chaos, pytest.mark.slow]


def test_all_workers_killed_while_the_batch_waits_on_its_notices(stack: Stack) -> None:
    # Email 3 is stored at once and answered 5 s later: time to take the session lock.
    stack.admin.set_faults(stall={"to": THIRD, "ms": 5_000, "when": "after_store"})
    batch_worker = stack.worker("batch", queues="default", wait=False)
    hands = stack.worker("hands1", queues="hands", wait=False)
    stack.beat()
    stack.wait_ready(batch_worker, hands)
    session_id, batch_id = stack.send_batch(RECIPIENTS)

    wait_for(lambda: any(m["to"] == THIRD for m in stack.admin.messages()),
             "the provider to accept email 3")
    with session_lock(session_id) as lock:
        assert stack.notices(session_id)[THIRD].status is Status.RUNNING, (
            "the machine is too slow for this test: email 3's receipt was committed "
            "before the session lock could be taken"
        )
        waiters = wait_for(lambda: lock_waiters(lock),
                           "the receipt commit of email 3 to block on the session lock")
        batch, notices = stack.task(batch_id), stack.notices(session_id)
        assert (batch.status, batch.phase, batch.lease_owner) == (Status.WAITING, "summarize",
                                                                  None)
        assert batch.wait_deps == [notices[to].id for to in RECIPIENTS]
        assert [notices[to].outcome["kind"] for to in RECIPIENTS[:2]] == ["succeeded"] * 2
        assert (notices[THIRD].status, notices[THIRD].phase) == (Status.RUNNING, "confirm")
        assert [notices[to].epoch for to in RECIPIENTS[3:]] == [0, 0]
        hands.kill()
        batch_worker.kill()
    wait_for(lambda: backends_gone(waiters), "the killed worker's backend to end")
    assert stack.notices(session_id)[THIRD].phase == "confirm"  # its receipt rolled back
    requests_before_restart = len(stack.admin.requests())

    stack.admin.set_faults()
    stack.worker("w2")
    batch = stack.wait_terminal(batch_id)
    assert_sent_once_each(stack, batch, RECIPIENTS)
    assert {to: len(stack.posts(to)) for to in RECIPIENTS} == dict.fromkeys(RECIPIENTS, 1)
    later = stack.admin.requests()[requests_before_restart:]
    assert not [r for r in later if r["to"] in RECIPIENTS[:2]]
    key = notices[THIRD].input["operation_id"]
    assert [(r["method"], r["outcome"]) for r in later
            if r["idempotency_key"] == key] == [("GET", "found")]

    # Planned once, woken once, summarised once: no second plan, no extra notices.
    assert len(stack.notices(session_id)) == len(RECIPIENTS)
    assert stack.history(batch_id) == [
        ("pending", "plan"), ("waiting", "summarize"), ("pending", "summarize"),
        ("terminal", "summarize"),
    ]
    assert (batch.epoch, batch.restarts) == (2, 0)
    plan = stack.kernel.document(session_id, "email-plan", batch_id)
    assert plan["recipients"][THIRD]["confirmed_by"] == "lookup"
