"""An operator cancels a batch through the API while real workers are sending it.

No email is sent after the cancel commit, the ones sent keep their receipts, and
the tree ends cancelled with the operator named in the operations log.

"Sent after the cancel" is judged by the intent commit, the point where a notice
says "from here on it may have been sent": the cancel fences every lease, so no
intent can commit after it. A call whose intent committed just before the cancel
may still reach the provider a moment after it (the call is already on its way);
that one is allowed, and its receipt is kept: two workers run the batch, so the
cancel handler of a notice whose call is in flight on one of them would run on the
other if the kernel let it (it waits until the revoked phase has returned).
"""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client

from kernel.commit import operations_log_id

from .harness import Stack, wait_for

RECIPIENTS = [f"r{i:02d}@example.com" for i in range(20)]
pytestmark = [pytest.mark.chaos, pytest.mark.slow]


def test_cancel_in_the_middle_of_a_batch(stack: Stack) -> None:
    operator = Client()
    account = User.objects.create_user("olga")
    account.groups.add(Group.objects.get_or_create(name="operator")[0])
    operator.force_login(account)
    assert operator.get("/api/sessions").status_code == 200  # the API is loaded and warm

    stack.admin.set_faults(latency_ms=300)
    stack.worker("w1")
    stack.worker("w2")
    stack.beat()
    session_id, batch_id = stack.send_batch(RECIPIENTS)
    wait_for(lambda: len(stack.admin.messages()) >= 2, "two emails to be accepted", timeout=60)
    response = operator.post(
        f"/api/tasks/{batch_id}/cancel",
        json.dumps({"action_id": "stop-1", "reason": "wrong recipients", "expected_run": 0}),
        content_type="application/json",
    )
    assert response.status_code == 200, response.content
    cancel_seq = response.json()["seq"]

    batch = stack.wait_terminal(batch_id, timeout=60)
    assert batch.outcome["kind"] == "cancelled"
    assert batch.outcome["result"] == {"by": "user:olga", "reason": "wrong recipients"}
    tasks = stack.tasks(session_id)
    assert all(t.terminal for t in tasks)

    intents = intent_seqs(stack, session_id)
    assert all(seq < cancel_seq for seq in intents.values()), (intents, cancel_seq)
    posts = [r for r in stack.admin.requests() if r["method"] == "POST"]
    assert posts and all(r["idempotency_key"] in intents for r in posts), \
        "a send reached the provider without an intent committed before the cancel"
    messages = {m["to"]: m for m in stack.admin.messages()}
    assert 2 <= len(messages) < len(RECIPIENTS)

    plan = stack.kernel.document(session_id, "email-plan", batch_id)["recipients"]
    for to, entry in plan.items():
        if to in messages:
            assert entry["state"] == "sent" and entry["receipt"]["id"] == messages[to]["id"], to
        else:
            assert entry["state"] in ("planned", "cancelled"), (to, entry)
    notices = stack.notices(session_id)
    assert {notices[to].outcome["kind"] for to in messages} <= {"succeeded", "cancelled"}

    [logged] = stack.kernel.entries(operations_log_id(session_id))
    assert (logged.kind, logged.actor, logged.payload["reason"]) == (
        "cancel", "user:olga", "wrong recipients")


def intent_seqs(stack: Stack, session_id: str) -> dict[str, int]:
    """The seq of each notice's intent commit (its move to ``confirm``), by operation id."""
    operations = {t.id: t.input["operation_id"] for t in stack.notices(session_id).values()}
    found: dict[str, int] = {}
    for commit in stack.kernel.commits_after(session_id, 0):
        for item in commit.summary:
            if item.get("type") == "task" and item.get("phase") == "confirm":
                found.setdefault(operations.get(item["id"], ""), commit.seq)
    found.pop("", None)
    return found
