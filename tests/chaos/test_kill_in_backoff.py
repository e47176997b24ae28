"""A worker killed while every notice sleeps in backoff.

The provider answers every send ``503`` (``error_rate: 1.0``): certainly not stored,
so each notice records "not_sent" and sleeps until its next attempt. With no beat
running nothing wakes them, so the worker is idle when it is killed: what survives
is only what Postgres holds (``sleeping``, a wake time, the phase to run, the
attempt count). The provider recovers; a new worker and beat wake each notice at
its time and ``send`` sends it again under that same key (nothing to look up: the
refusal said it was not stored): one stored email per recipient, whose first send was
refused.
"""

from __future__ import annotations

import pytest

from kernel import Status, Task

from .harness import RECIPIENTS, Stack, assert_sent_once_each, wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.slow]


def test_worker_killed_while_the_notices_sleep_in_backoff(stack: Stack) -> None:
    stack.admin.set_faults(error_rate=1.0)
    worker = stack.worker("w1")  # no beat yet: a sleeper stays asleep
    session_id, batch_id = stack.send_batch(RECIPIENTS)

    def all_asleep() -> dict[str, Task] | None:
        notices = stack.notices(session_id)
        asleep = len(notices) == len(RECIPIENTS) and all(
            n.status is Status.SLEEPING for n in notices.values()
        )
        return notices if asleep else None

    notices = wait_for(all_asleep, "every notice to sleep in backoff")
    assert {n.phase for n in notices.values()} == {"send"}
    assert {n.checkpoint["attempts"] for n in notices.values()} == {1}
    assert stack.task(batch_id).status is Status.WAITING
    refused = stack.admin.requests()
    assert [(r["method"], r["outcome"]) for r in refused] == [("POST", "error")] * 5
    assert stack.admin.messages() == []
    worker.kill()

    stack.admin.set_faults()
    stack.worker("w2")
    stack.beat()
    batch = stack.wait_terminal(batch_id)
    assert_sent_once_each(stack, batch, RECIPIENTS)

    for to, notice in notices.items():
        key = notice.input["operation_id"]
        # The refused send, then after the kill: one accepted send, one key.
        assert [(r["method"], r["outcome"]) for r in stack.admin.requests()
                if r["idempotency_key"] == key] == [("POST", "error"), ("POST", "accepted")], to
        assert [r["to"] for r in stack.posts(to)] == [to, to]
        done = stack.task(notice.id)
        assert (done.epoch, done.checkpoint["attempts"]) == (2, 1)
    plan = stack.kernel.document(session_id, "email-plan", batch_id)
    assert {e["state"] for e in plan["recipients"].values()} == {"sent"}
