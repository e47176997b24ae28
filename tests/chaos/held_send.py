"""A worker killed while the HTTP provider holds its send of email 4 (``stall``,
``before_store``), the recovery that follows, and the held request absorbed by its key
when it lands at last: the scenario of tests/chaos/test_kill_during_send.py, which
tests/chaos/test_kill_on_woken_path.py runs again with every dispatch woken."""

from __future__ import annotations

from kernel import Status

from .harness import RECIPIENTS, Stack, assert_sent_once_each, wait_for

STALLED = RECIPIENTS[3]
STALL_MS = 15_000  # the recovery (lease 3 s + sweep + a worker start) takes 4-10 s


def kill_while_the_provider_holds_the_send(stack: Stack) -> None:
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
