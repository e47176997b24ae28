"""The demo's scripted model and the batch's partial result, without a kernel: the model
answers each user message on its own, and a batch stopped part-way is told apart into
sent, not sent and uncertain from its plan as committed."""

from __future__ import annotations

from typing import Any

from controlplane.reference.assistant import notices_script
from controlplane.reference.notices.tasks import partial_summary
from kernel.agent import ModelRequest


def ask(*messages: Any) -> Any:
    return notices_script(ModelRequest("scripted", list(messages), [], {}))


CALL = {"id": "call_send_notices_0", "name": "send_notices", "arguments": {}}


def test_a_later_message_with_addresses_calls_the_tool_again() -> None:
    cancelled = {"cancelled": True, "reason": "cancelled by user:ann: stop",
                 "partial": {"sent": 0, "receipts": {}, "unsent": ["ana@example.com"],
                             "uncertain": []}}
    answer = ask(
        {"role": "user", "content": "notify ana@example.com"},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": CALL["id"], "name": CALL["name"], "content": cancelled},
        {"role": "user", "content": "notify gus@example.com"},
    )
    [call] = answer.tool_calls
    assert call.arguments["recipients"] == ["gus@example.com"]
    assert call.id != CALL["id"]  # the conversation's earlier call keeps its own result


def test_a_stopped_call_is_summarised_with_what_was_sent_not_sent_and_uncertain() -> None:
    content = {"cancelled": True, "reason": "cancelled by user:ann: stop", "partial": {
        "sent": 1, "receipts": {"ana@example.com": {"id": "m1"}},
        "unsent": ["ben@example.com"], "uncertain": ["cai@example.com"]}}
    answer = ask(
        {"role": "user", "content": "notify ana@example.com, ben@example.com, cai@example.com"},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": CALL["id"], "name": CALL["name"], "content": content},
    )
    assert answer.tool_calls == ()
    assert answer.text.splitlines() == [
        "Sent 1 notices. Problem: the sending was cancelled by user:ann: stop",
        "- ana@example.com: m1",
        "Not sent: ben@example.com",
        "Uncertain (may have been sent): cai@example.com",
    ]


def test_the_partial_summary_reads_each_notice_state() -> None:
    receipt = {"id": "m1"}
    plan = {"recipients": {
        "a@x.io": {"state": "sent", "receipt": receipt},
        "b@x.io": {"state": "planned"},
        "c@x.io": {"state": "sending"},
        "d@x.io": {"state": "retrying", "error": "dropped"},
        "e@x.io": {"state": "uncertain"},
        "f@x.io": {"state": "cancelled_uncertain", "error": "cancelled; it may have been sent"},
        "g@x.io": {"state": "cancelled", "error": "dropped"},  # an old error: looked up since
        "h@x.io": {"state": "not_sent"},
        "i@x.io": {"state": "failed"},
    }}
    assert partial_summary(plan, [*plan["recipients"], "j@x.io"]) == {
        "sent": 1,
        "receipts": {"a@x.io": receipt},
        "unsent": ["b@x.io", "g@x.io", "h@x.io", "i@x.io", "j@x.io"],
        "uncertain": ["c@x.io", "d@x.io", "e@x.io", "f@x.io"],
    }
    assert partial_summary({}, ["a@x.io"]) == {  # not planned yet: nothing went out
        "sent": 0, "receipts": {}, "unsent": ["a@x.io"], "uncertain": []}


def test_a_failed_batch_is_summarised_with_its_receipts_and_what_was_not_sent() -> None:
    content = {"error": "failed: 1 of 2 not sent", "result": {
        "sent": 1, "receipts": {"ana@example.com": {"id": "m1"}}, "unsent": ["ben@example.com"]}}
    answer = ask(
        {"role": "user", "content": "notify ana@example.com, ben@example.com"},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": CALL["id"], "name": CALL["name"], "content": content},
    )
    assert answer.text.splitlines() == [
        "Sent 1 notices. Problem: failed: 1 of 2 not sent",
        "- ana@example.com: m1",
        "Not sent: ben@example.com",
    ]
