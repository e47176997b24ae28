"""A lease that expires while its holder still runs (DESIGN §4.5, §6, §7).

The first worker runs without its heartbeat (``KERNEL_HEARTBEAT=0``) and a 4-second
lease, and is frozen (SIGSTOP: a stuck process, a long GC pause) while its call to
the provider is in flight; the provider stores ben's email at once but answers only
after a stall longer than the lease. (A call no longer outlives its lease by itself:
every send carries the lease's end as its deadline, which the client and the provider
honour; only a holder that stops running can outlive it.) Beat's sweep finds the
expired lease; a second, normal worker claims the notice with the
next epoch, re-enters ``confirm``, finds the stored email by its operation id and
commits the receipt. When the first worker's call finally returns, its commit
carries the old epoch and is rejected: it logs "lease lost, abandoning".

A second variant stalls the send *before* the provider stores it: the second
worker's lookup then finds nothing and it sends under the same operation id; the
first worker's late request, thawed, is answered as a duplicate of that message.

What must hold either way: at most one message per idempotency key, exactly one
commit per phase in ben's history (created, intent from the first worker, one
terminal transition from the second), nothing committed by the first worker after
its lease was taken over, and a batch that reports five sent.

The second worker is started up front but consumes only an idle queue until ben's
send is under way (then it is told to consume the real queues by Celery remote
control), so that a slow worker start on a busy machine cannot eat the stall.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest

from controlplane import models
from kernel import Status

from .harness import Stack, consume, wait_for
from .private_services import point_celery_at

RECIPIENTS = [f"{name}@example.com" for name in ("ana", "ben", "cai", "dee", "eve")]
STALLED = RECIPIENTS[1]
STALL_MS = 15_000  # far longer than the lease (4 s) + a sweep (every 1 s) + a confirm
LEASE_LOST = "lease lost, abandoning"
pytestmark = [pytest.mark.chaos, pytest.mark.slow]


def history(session_id: str, task_id: str) -> list[tuple[str, str, str | None]]:
    """(status, phase, outcome) of each commit that touched the task: the CLI's query."""
    commits = models.Commit.objects.filter(
        session_id=session_id, summary__contains=[{"id": task_id}]
    ).order_by("seq")
    return [
        (item["status"], item["phase"], item.get("outcome"))
        for commit in commits
        for item in commit.summary
        if item.get("id") == task_id
    ]


@pytest.mark.parametrize("when", ["after_store", "before_store"])
def test_lease_expires_while_the_first_worker_still_runs(stack: Stack, when: str) -> None:
    """``after_store``: the email is stored at once, the answer is late; the second
    worker's lookup finds it. ``before_store``: nothing is stored until the stall ends;
    the second worker's lookup finds nothing and it sends under the same key, so the
    first worker's late send is only a duplicate of it."""
    point_celery_at(stack.redis_url)  # so that the batch's first dispatch reaches our Redis
    stack.admin.set_faults(stall={"to": STALLED, "ms": STALL_MS, "times": 1, "when": when})
    stack.beat()
    first = stack.worker("w1", KERNEL_HEARTBEAT="0", KERNEL_LEASE_SECONDS="4")
    # The second worker starts now (a start takes seconds on a busy machine) but only
    # listens to a queue nothing is sent to, until ben's send is under way.
    second = stack.worker("w2", queues="brain")
    session_id, batch_id = stack.send_batch(RECIPIENTS)

    def sending() -> bool:  # the intent is committed: the send is under way
        notice = stack.notices(session_id).get(STALLED)
        return notice is not None and notice.phase == "confirm"

    wait_for(sending, "the first worker to commit ben's intent and call the provider")
    if when == "after_store":
        wait_for(lambda: any(m["to"] == STALLED for m in stack.admin.messages()),
                 "the provider to store ben's email (its answer is stalled)")
    first.suspend()  # its call stays in flight, its lease runs out
    stalled_at = time.monotonic()
    notice = stack.notices(session_id)[STALLED]
    key = notice.input["operation_id"]
    assert notice.status is Status.RUNNING and notice.epoch == 1
    assert notice.lease_owner is not None and notice.lease_owner.endswith(f":{first.popen.pid}")

    consume(stack, second, "default", "hands")  # it recovers the expired lease via the sweep
    recovered = stack.wait_terminal(notice.id, timeout=30)
    assert time.monotonic() - stalled_at < STALL_MS / 1000, "recovered after the stall ended"
    assert LEASE_LOST not in first.output(), "the first worker should still be waiting"
    assert recovered.epoch == 2 and recovered.restarts == 1
    assert recovered.outcome is not None and recovered.outcome["kind"] == "succeeded"
    first.resume()

    # The stall ends, the first worker's send returns a receipt, its commit is fenced off.
    wait_for(lambda: LEASE_LOST in first.output(), "the first worker to lose its lease",
             timeout=STALL_MS / 1000 + 30, every=0.2)
    batch = stack.wait_terminal(batch_id, timeout=60)
    lost = [line for line in first.output().splitlines() if LEASE_LOST in line]
    assert len(lost) == 1 and notice.id in lost[0], lost

    # At most one message per idempotency key: ben's email exists once.
    messages = stack.admin.messages()
    assert Counter(m["idempotency_key"] for m in messages).most_common(1)[0][1] == 1
    assert sorted(m["to"] for m in messages) == sorted(RECIPIENTS)
    (message,) = [m for m in messages if m["to"] == STALLED]
    assert message["idempotency_key"] == key
    plan = stack.kernel.document(session_id, "email-plan", batch_id)
    if when == "after_store":
        assert [r["outcome"] for r in stack.posts(STALLED)] == ["accepted"]
        assert [r["outcome"] for r in stack.lookups(key)] == ["found"]
        assert plan["recipients"][STALLED]["confirmed_by"] == "lookup"
    else:
        # The thawed worker's client gave up at its deadline; the provider still answers
        # the stalled request when its stall ends (brought forward: the recovery is over).
        stack.admin.end_stalls()
        wait_for(lambda: len(stack.posts(STALLED)) == 2, "the stalled request to be answered",
                 timeout=STALL_MS / 1000 + 30, every=0.2)
        assert sorted(r["outcome"] for r in stack.posts(STALLED)) == ["accepted", "duplicate"]
        assert [r["outcome"] for r in stack.lookups(key)] == ["not_found"]
        assert plan["recipients"][STALLED]["confirmed_by"] == "send"

    # One commit per phase: created, intent (first worker), receipt (second worker).
    # Nothing from the first worker after its lease was taken over.
    assert history(session_id, notice.id) == [
        ("pending", "send", None),
        ("running", "confirm", None),
        ("terminal", "confirm", "succeeded"),
    ]
    after = stack.task(notice.id)
    assert (after.epoch, after.outcome) == (recovered.epoch, recovered.outcome)
    assert recovered.outcome["result"]["id"] == message["id"]
    assert batch.outcome is not None and batch.outcome["kind"] == "succeeded"
    assert batch.outcome["result"]["sent"] == 5
    assert batch.outcome["result"]["receipts"][STALLED]["id"] == message["id"]
