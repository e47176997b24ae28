"""A worker killed inside the batch's ``summarize`` commit.

The batch is planned (in the test process) and its notices are sent by a ``hands``
worker while no ``default`` worker runs. Once the last notice has woken the batch,
the session's commit order is held from outside and two ``default`` workers start:
one claims the batch and blocks in the commit of its summary. It is SIGKILLed there.
The summary never landed, so the batch is found ``running`` in ``summarize`` with an
expired lease: the other worker re-enters the phase from its beginning (a restart is
counted) and the summary reports five sent. No email is sent again: summarising only
reads the receipts the notices committed.
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
    succeeded,
    wait_for,
)

pytestmark = [pytest.mark.chaos, pytest.mark.slow]


def test_worker_killed_in_the_summary_commit(stack: Stack) -> None:
    stack.beat()
    session_id, batch_id = stack.send_batch(RECIPIENTS)
    assert stack.advance(batch_id) and stack.task(batch_id).status is Status.WAITING

    stack.worker("hands", queues="hands")
    wait_for(lambda: stack.task(batch_id).status is Status.PENDING,
             "the last notice to wake the batch")
    assert all(succeeded(n) for n in stack.notices(session_id).values())
    assert stack.task(batch_id).phase == "summarize"
    requests = len(stack.admin.requests())

    with session_lock(session_id) as lock:
        workers = [stack.worker(name, queues="default", wait=False) for name in ("b1", "b2")]
        stack.wait_ready(*workers)
        waiters = wait_for(lambda: stack.task(batch_id).status is Status.RUNNING
                           and lock_waiters(lock),
                           "the summary commit to block on the session lock")
        batch = stack.task(batch_id)
        assert (batch.phase, batch.epoch, batch.restarts) == ("summarize", 2, 0)
        summarizer = stack.holder(batch_id)
        summarizer.kill()
    wait_for(lambda: backends_gone(waiters), "the killed worker's backend to end")
    batch = stack.task(batch_id)
    assert (batch.status, batch.phase, batch.outcome) == (Status.RUNNING, "summarize", None)

    batch = stack.wait_terminal(batch_id)  # the other worker, once the lease has expired
    assert_sent_once_each(stack, batch, RECIPIENTS)
    assert {to: len(stack.posts(to)) for to in RECIPIENTS} == dict.fromkeys(RECIPIENTS, 1)
    assert len(stack.admin.requests()) == requests  # summarising asks the provider nothing
    # Claimed for plan, for the killed summary and for the summary that landed.
    assert (batch.epoch, batch.restarts) == (3, 1)
    assert stack.history(batch_id) == [
        ("pending", "plan"), ("waiting", "summarize"), ("pending", "summarize"),
        ("terminal", "summarize"),
    ]
