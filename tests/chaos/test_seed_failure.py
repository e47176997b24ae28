"""The seed's failure (DESIGN §10), replayed with a real SIGKILL.

Emails 1-3 confirmed, email 4 accepted by the provider but its receipt not yet
committed, email 5 not started - then the worker dies. After a new worker starts:
1-3 are reused, 4 is confirmed by a lookup (never sent twice), 5 is sent, and the
summary reports five sent.
"""

from __future__ import annotations

import pytest

from .harness import Stack, wait_for

RECIPIENTS = [f"{name}@example.com" for name in ("ana", "ben", "cai", "dee", "eve")]
pytestmark = [pytest.mark.chaos, pytest.mark.slow]


def test_worker_killed_after_the_provider_accepted_email_4(stack: Stack) -> None:
    fourth = RECIPIENTS[3]
    stack.admin.set_faults(stall={"to": fourth, "ms": 60_000, "when": "after_store"})
    worker = stack.worker("w1")
    stack.beat()
    session_id, batch_id = stack.send_batch(RECIPIENTS)

    wait_for(lambda: any(m["to"] == fourth for m in stack.admin.messages()),
             "the provider to accept email 4")
    notices = stack.notices(session_id)
    assert [notices[to].outcome["kind"] for to in RECIPIENTS[:3]] == ["succeeded"] * 3
    assert notices[fourth].status.value == "running" and notices[fourth].phase == "confirm"
    assert notices[RECIPIENTS[4]].phase == "send" and notices[RECIPIENTS[4]].epoch == 0
    worker.kill()
    requests_before_restart = len(stack.admin.requests())

    stack.admin.set_faults()
    stack.worker("w2")
    batch = stack.wait_terminal(batch_id, timeout=60)

    messages = stack.admin.messages()
    assert sorted(m["to"] for m in messages) == sorted(RECIPIENTS)
    later = stack.admin.requests()[requests_before_restart:]
    assert not [r for r in later if r.get("to") in RECIPIENTS[:3]]
    assert [r["method"] for r in later if r.get("to") == fourth or
            r.get("idempotency_key") == notices[fourth].input["operation_id"]] == ["GET"]
    assert len(stack.posts(RECIPIENTS[4])) == 1
    assert batch.outcome["kind"] == "succeeded"
    assert batch.outcome["result"]["sent"] == 5
    receipts = batch.outcome["result"]["receipts"]
    assert {to: receipts[to]["id"] for to in RECIPIENTS} == {m["to"]: m["id"] for m in messages}
