"""SMTP, which can neither deduplicate nor be asked (DESIGN §8, §10): a worker killed
after the SMTP server received email 4 and before the receipt was committed.

The stand-in records email 4 and holds its answer back; the worker is SIGKILLed
while it waits. The next worker finds the notice in ``confirm``, and the channel
cannot confirm anything: the notice waits for an operator's resolution and is not
sent again on its own. Email 5 is sent meanwhile, and the batch keeps waiting. The
operator's decision is a durable commit with their identity:

- "sent": the notice succeeds with an operator receipt, nothing is sent again;
- "send_again": email 4 goes out exactly once more, under the same operation id.

Either way the batch ends ``succeeded`` with five sent.
"""

from __future__ import annotations

import email
from collections import Counter

import pytest

from controlplane.dev.smtp_server import SmtpStandIn
from kernel import Draft, Task

from .harness import RECIPIENTS, Stack
from .uncertain_smtp import FOURTH, received, uncertain_email_4

pytestmark = [pytest.mark.chaos, pytest.mark.slow]


def operation_ids(smtp: SmtpStandIn, to: str) -> list[str]:
    return [email.message_from_bytes(m.data)["X-Operation-Id"]
            for m in smtp.messages() if to in m.rcpt_tos]


def resolve(stack: Stack, session_id: str, notice: Task, decision: str) -> None:
    draft = Draft(actor="user:olga")
    draft.signal(notice.id, "resolution-1", {"decision": decision, "by": "user:olga"})
    stack.kernel.open(session_id).commit(draft)


def assert_batch_sent_five(stack: Stack, batch_id: str) -> dict[str, dict[str, str]]:
    batch = stack.wait_terminal(batch_id)
    assert batch.outcome is not None and batch.outcome["kind"] == "succeeded", batch.outcome
    assert batch.outcome["result"]["sent"] == len(RECIPIENTS)
    assert batch.outcome["result"]["unsent"] == []
    assert stack.admin.messages() == []  # nothing went through the HTTP provider
    receipts: dict[str, dict[str, str]] = batch.outcome["result"]["receipts"]
    return receipts


def test_an_operator_confirms_the_uncertain_smtp_send(stack: Stack, smtp: SmtpStandIn) -> None:
    session_id, batch_id, notice = uncertain_email_4(stack, smtp)

    resolve(stack, session_id, notice, "sent")
    receipts = assert_batch_sent_five(stack, batch_id)

    assert received(smtp) == Counter(RECIPIENTS)  # five messages, one per recipient
    assert receipts[FOURTH]["id"] == "operator:user:olga"
    plan = stack.kernel.document(session_id, "email-plan", batch_id)
    assert plan["recipients"][FOURTH]["confirmed_by"] == "user:olga"
    assert stack.task(notice.id).signals["resolution-1"]["by"] == "user:olga"


def test_an_operator_has_the_uncertain_smtp_send_sent_again(
    stack: Stack, smtp: SmtpStandIn
) -> None:
    session_id, batch_id, notice = uncertain_email_4(stack, smtp)

    resolve(stack, session_id, notice, "send_again")
    receipts = assert_batch_sent_five(stack, batch_id)

    # Exactly once more, on the operator's word, under the same operation id.
    assert received(smtp) == Counter({**Counter(RECIPIENTS), FOURTH: 2})
    assert operation_ids(smtp, FOURTH) == [notice.input["operation_id"]] * 2
    assert receipts[FOURTH]["idempotency_key"] == notice.input["operation_id"]
    plan = stack.kernel.document(session_id, "email-plan", batch_id)
    assert plan["recipients"][FOURTH]["confirmed_by"] == "send"
    assert stack.task(notice.id).checkpoint["resolutions"] == 1
