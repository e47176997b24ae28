"""A worker killed after a notice committed its intent, while its call to the provider
had not completed: the provider holds the request (``stall``, ``before_store``) and has
stored nothing yet.

The next worker finds the notice ``running`` in ``confirm`` with an expired lease.
``confirm`` asks the provider by the operation id, hears "not found", and sends once
more with the same key. When the stalled original request finally reaches the store,
the provider recognises the key: it stores nothing new. One email per recipient.
"""

from __future__ import annotations

import pytest

from kernel import Status

from .harness import RECIPIENTS, Stack, assert_sent_once_each, wait_for

STALLED = RECIPIENTS[3]
STALL_MS = 15_000  # the recovery (lease 3 s + sweep + a worker start) takes 4-10 s
pytestmark = [pytest.mark.chaos, pytest.mark.slow]


def test_worker_killed_while_the_provider_holds_the_send(stack: Stack) -> None:
    stack.admin.set_faults(stall={"to": STALLED, "ms": STALL_MS, "when": "before_store"})
    worker = stack.worker("w1")
    stack.beat()
    session_id, batch_id = stack.send_batch(RECIPIENTS)

    wait_for(lambda: stack.admin.faults()["fired"]["stall"] == 1,
             "the provider to hold the send of email 4")
    notices = stack.notices(session_id)
    assert [notices[to].status for to in RECIPIENTS[:3]] == [Status.TERMINAL] * 3
    assert (notices[STALLED].status, notices[STALLED].phase) == (Status.RUNNING, "confirm")
    assert sorted(m["to"] for m in stack.admin.messages()) == RECIPIENTS[:3]
    worker.kill()
    requests_before_restart = len(stack.admin.requests())
    key = notices[STALLED].input["operation_id"]

    stack.admin.set_faults()  # the stalled request keeps its stall; new ones are not held
    stack.worker("w2")
    batch = stack.wait_terminal(batch_id)
    assert_sent_once_each(stack, batch, RECIPIENTS)

    # The recovery: a lookup that finds nothing, then one send under the same key...
    later = stack.admin.requests()[requests_before_restart:]
    assert not any(r["faults"] == ["stall"] for r in later), (
        f"the machine is too slow for this test: the held send ended after {STALL_MS} ms, "
        "before the recovery had looked it up"
    )
    assert [(r["method"], r["outcome"]) for r in later
            if r["idempotency_key"] == key] == [("GET", "not_found"), ("POST", "accepted")]
    assert not [r for r in later if r["to"] in RECIPIENTS[:3]]
    assert len(stack.posts(RECIPIENTS[4])) == 1
    notice = stack.notices(session_id)[STALLED]
    assert (notice.epoch, notice.outcome["result"]["idempotency_key"]) == (2, key)

    # ...and the killed worker's request, released at last, is absorbed by its key. The
    # recovery is over: the stall need not run out its 15 s.
    stack.admin.end_stalls()
    late = wait_for(lambda: [r for r in stack.admin.requests()
                             if r["idempotency_key"] == key and r["faults"] == ["stall"]],
                    "the stalled request to reach the store", timeout=STALL_MS / 1000 + 10)
    assert [(r["outcome"], r["created"]) for r in late] == [("duplicate", False)]
    assert len(stack.admin.messages()) == len(RECIPIENTS)
