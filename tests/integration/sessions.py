"""Sessions the page tests render: a send-batch nothing runs, a conversation with a tool call,
and one whose tool result is a large artifact; each holds untrusted text where the page
must escape it. And a long conversation of tool-calling turns."""

from __future__ import annotations

from controlplane.storage.artifacts import PostgresArtifacts
from controlplane.worker.runtime import runtime
from kernel import Draft, agent
from kernel.agent.turn import PROGRESS
from kernel.artifacts import offload

EVIL = "<script>window.__pwned = 1</script>"
REPORT = {"rows": [{"n": n, "text": f"row {n} <b>bold</b>"} for n in range(2000)]}


def batch(recipients: int = 3, subject: str = "Notice") -> tuple[str, str]:
    kernel = runtime().kernel
    handle = kernel.create_session(metadata={"title": "ui test"})
    draft = Draft(actor="user:test")
    conversation = draft.create_conversation()
    draft.append(conversation, "user", {"text": EVIL})
    task_id = draft.create_task("send-batch", {
        "recipients": [f"r{i}@example.com" for i in range(recipients)],
        "subject": subject, "body": "b", "channel": "http"})
    handle.commit(draft)
    return handle.id, task_id


def call_arguments() -> dict[str, object]:
    return {"recipients": ["ana@example.com"], "subject": "Notice"}


def conversation_with_a_tool_call() -> tuple[str, str]:
    """A session whose conversation holds a user message, a model response calling one
    tool (with usage), the tool's result, and the model's markdown answer."""
    kernel = runtime().kernel
    handle = kernel.create_session(metadata={"title": "agent"})
    draft = Draft(actor="user:test")
    conversation = draft.create_conversation()
    handle.commit(draft)
    submitted = agent.submit(handle, conversation, {"text": "Send the notice to ana"},
                             "req-1", actor="user:ann")
    assert submitted.submission is not None
    draft = Draft(actor="task:turn_x")
    call = {"id": "call_1", "name": "send_notices", "arguments": call_arguments()}
    draft.append(conversation, "model_response", {
        "text": "", "tool_calls": [call], "turn": "turn_x", "attempt": 1,
        "usage": {"input_tokens": 30, "output_tokens": 10}})
    draft.append(conversation, "tool_result", {
        "call_id": "call_1", "name": "send_notices",
        "result": {"sent": 1, "receipts": {"ana@example.com": {"id": "msg_1"}}}})
    draft.append(conversation, "model_response", {
        "text": f"**Sent 1 notice.**\n\n- ana@example.com: msg_1\n\n{EVIL}",
        "tool_calls": [], "turn": "turn_x", "attempt": 1,
        "usage": {"input_tokens": 40, "output_tokens": 20}})
    handle.commit(draft)
    return handle.id, conversation


def session_with_a_large_result() -> tuple[str, str, dict]:
    kernel = runtime().kernel
    assert isinstance(kernel.artifacts, PostgresArtifacts)
    reference = offload(kernel.artifacts, REPORT, 4_096)
    handle = kernel.create_session()
    draft = Draft(actor="user:test")
    conversation = draft.create_conversation()
    handle.commit(draft)
    draft = Draft(actor="task:turn_x")
    draft.append(conversation, "user", {"text": "the report"})
    draft.append(conversation, "model_response", {
        "text": "", "tool_calls": [{"id": "c1", "name": "report", "arguments": {}}],
        "turn": "turn_x", "attempt": 1})
    draft.append(conversation, "tool_result", {"call_id": "c1", "name": "report",
                                               "result": reference})
    handle.commit(draft)
    return handle.id, conversation, reference


LONG_TEXT = " ".join(f"word{n} <i>{EVIL}</i>" for n in range(1_000))
"""A user message above the kernel's artifact threshold: its text is stored apart."""


def session_with_large_entries() -> tuple[str, str, list[str]]:
    """A conversation whose user message and model response are longer than the kernel's
    artifact threshold (kernel.large_values stores their text apart), and a progress
    document's value as long; the session, the conversation and its two entries."""
    kernel = runtime().kernel
    assert kernel.artifact_above is not None and len(LONG_TEXT) > kernel.artifact_above
    handle = kernel.create_session(metadata={"title": "long"})
    draft = Draft(actor="user:test")
    conversation = draft.create_conversation()
    handle.commit(draft)
    draft = Draft(actor="task:turn_x")
    user = draft.append(conversation, "user", {"text": LONG_TEXT})
    answer = draft.append(conversation, "model_response", {
        "text": "**Read.** " + LONG_TEXT, "tool_calls": [], "turn": "turn_x", "attempt": 1,
        "usage": {"input_tokens": 40, "output_tokens": 20}})
    draft.set(PROGRESS, "task_none", ["text"], LONG_TEXT[::-1])
    handle.commit(draft)
    return handle.id, conversation, [user, answer]


def add_turns(session_id: str, conversation: str, first: int, count: int) -> None:
    """Turns ``first`` to ``first + count - 1`` of a conversation: each a user message, a
    response calling a tool (call ``c<i>``) and the call's result, 50 turns a commit."""
    handle = runtime().kernel.open(session_id)
    for start in range(first, first + count, 50):
        draft = Draft(actor="task:turn_x")
        for i in range(start, min(start + 50, first + count)):
            draft.append(conversation, "user", {"text": f"question {i}"})
            draft.append(conversation, "model_response", {
                "text": "", "tool_calls": [{"id": f"c{i}", "name": "lookup", "arguments": {}}],
                "turn": "turn_x"})
            draft.append(conversation, "tool_result", {"call_id": f"c{i}", "name": "lookup",
                                                       "result": {"n": i}})
        handle.commit(draft)


def turns_conversation(turns: int) -> tuple[str, str]:
    """A session with a conversation of ``turns`` turns (:func:`add_turns`)."""
    handle = runtime().kernel.create_session()
    draft = Draft(actor="user:test")
    conversation = draft.create_conversation()
    handle.commit(draft)
    add_turns(handle.id, conversation, 0, turns)
    return handle.id, conversation
