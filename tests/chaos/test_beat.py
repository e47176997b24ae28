"""Beat, which runs the sweep every second (DESIGN §7), killed mid-batch; and two beats
at once.

The sweep is what notices an expired lease. With beat and the worker holding email 3
both SIGKILLed, the surviving worker sits idle and email 3 stays ``running`` past its
lease: nothing in the system looks at it. A new beat sweeps, the notice is dispatched
again, confirmed by lookup as never stored, and sent once under its key.

Two beats send every sweep twice (a known Celery pitfall, DESIGN §13). The sweep only
delivers "look at task X"; the claim in Postgres decides, so every duplicate delivery
is a no-op: each notice is claimed exactly as often as a single beat would cause.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from kernel import Status

from .harness import (
    RECIPIENTS,
    Stack,
    assert_sent_once_each,
    succeeded,
    sweeps_sent,
    wait_for,
)

pytestmark = [pytest.mark.chaos, pytest.mark.slow]


def held_send(to: str) -> dict[str, object]:
    """Hold the first send to ``to`` before storing it, far longer than any test runs."""
    return {"to": to, "ms": 120_000, "when": "before_store", "times": 1}


def test_beat_killed_mid_batch_with_the_worker_of_email_3(stack: Stack) -> None:
    stalled = RECIPIENTS[2]
    stack.admin.set_faults(stall=held_send(stalled))
    workers = [stack.worker("w1", wait=False), stack.worker("w2", wait=False)]
    beat = stack.beat()
    stack.wait_ready(*workers, beat)
    session_id, batch_id = stack.send_batch(RECIPIENTS)

    others = [to for to in RECIPIENTS if to != stalled]
    wait_for(lambda: stack.admin.faults()["fired"]["stall"] == 1 and all(
        succeeded(stack.notices(session_id)[to]) for to in others),
        "email 3 to be held by the provider and the others to be sent")
    notice = stack.notices(session_id)[stalled]
    holder = stack.holder(notice.id)
    [survivor] = [w for w in workers if w is not holder]
    holder.kill()
    beat.kill()

    # Without a sweep, nothing looks at the expired lease: two sweep periods pass.
    lease_until = stack.task(notice.id).lease_until
    assert lease_until is not None
    wait_for(lambda: datetime.now(UTC) > lease_until + timedelta(seconds=2),
             "email 3's lease to have expired two sweep periods ago")
    assert (stack.task(notice.id).status, stack.task(notice.id).epoch) == (Status.RUNNING, 1)
    assert notice.id not in stack.queued("hands")
    assert stack.task(batch_id).status is Status.WAITING

    stack.admin.set_faults()
    stack.beat("beat2")
    batch = stack.wait_terminal(batch_id)
    assert_sent_once_each(stack, batch, RECIPIENTS)
    assert {to: len(stack.posts(to)) for to in RECIPIENTS} == dict.fromkeys(RECIPIENTS, 1)
    key = notice.input["operation_id"]
    assert [(r["method"], r["outcome"]) for r in stack.admin.requests()
            if r["idempotency_key"] == key] == [("GET", "not_found"), ("POST", "accepted")]
    assert stack.task(notice.id).epoch == 2
    assert survivor.alive and True in survivor.advances()


def test_two_beats_at_once_do_no_harm(stack: Stack) -> None:
    fourth, fifth = RECIPIENTS[3], RECIPIENTS[4]
    stack.admin.set_faults(stall=held_send(fourth))
    # The ``default`` worker runs the batch and the sweeps that both beats send.
    batch_worker = stack.worker("batch", queues="default", wait=False)
    first = stack.worker("hands1", queues="hands", wait=False)
    beats = [stack.beat("beat1"), stack.beat("beat2")]
    stack.wait_ready(batch_worker, first, *beats)
    session_id, batch_id = stack.send_batch(RECIPIENTS)

    wait_for(lambda: stack.admin.faults()["fired"]["stall"] == 1,
             "the provider to hold email 4")
    notices = stack.notices(session_id)
    first.kill()
    # The sweeps re-dispatch email 4 (its lease expired) and re-deliver email 5's
    # unclaimed dispatch, so the queue holds more than one "look at" for email 5.
    wait_for(lambda: notices[fourth].id in (queued := stack.queued("hands"))
             and queued.count(notices[fifth].id) >= 2,
             "the sweeps to queue email 4 again and email 5 twice")
    sweeps = [sweeps_sent(beat) for beat in beats]

    stack.admin.set_faults()
    second = stack.worker("hands2", queues="hands")
    batch = stack.wait_terminal(batch_id)
    wait_for(lambda: all(sweeps_sent(beat) > n for beat, n in zip(beats, sweeps, strict=True)),
             "both beats to go on sending sweeps")
    assert_sent_once_each(stack, batch, RECIPIENTS)
    assert {to: len(stack.posts(to)) for to in RECIPIENTS} == dict.fromkeys(RECIPIENTS, 1)

    # Each notice claimed once, email 4 once more after its worker died; the batch twice.
    epochs = {to: n.epoch for to, n in stack.notices(session_id).items()}
    assert epochs == {**dict.fromkeys(RECIPIENTS, 1), fourth: 2}
    assert (batch.epoch, batch.restarts) == (2, 0)
    # The second hands worker claimed emails 4 and 5 (from their own messages, or from a
    # queue's wake-up or an announcement, whichever reached it first); every other
    # message it got (the duplicates) found nothing to claim.
    ran = second.advances()
    assert ran.count(True) + second.woken() + second.announced() == 2, (
        ran, second.woken(), second.announced())
    assert ran.count(False) >= 1, ran
