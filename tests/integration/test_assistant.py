"""The seed's request, end to end through the agent loop: the scripted model calls
``send_notices``, the durable batch runs against the real local provider, and the
answer lists the five receipts. And a batch cancelled part-way: the model is given
what went out and what did not, and a later message sends again."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from controlplane.dev.processes import RunningProvider, start_provider
from controlplane.dev.provider_admin import ProviderAdmin
from controlplane.reference import assistant
from controlplane.reference.notices import tasks as notices
from controlplane.reference.notices.channels import HttpChannel
from kernel import (
    Draft,
    InMemoryStorage,
    Kernel,
    ManualClock,
    Registry,
    Scheduler,
    SessionHandle,
    SubmissionStatus,
    Worker,
)
from kernel.agent import ScriptedProvider, register_agent, submit
from kernel.agent.context import CANCELLED_NOTE

CUSTOMERS = [
    "ana@example.com",
    "ben@example.com",
    "cai@example.com",
    "dee@example.com",
    "eve@example.com",
]


@pytest.fixture
def provider() -> Iterator[RunningProvider]:
    with start_provider() as running:
        yield running


def test_send_the_approved_notice_to_five_customers_and_summarise(
    provider: RunningProvider,
) -> None:
    registry = Registry()
    notices.register(registry, {"http": HttpChannel(provider.url, timeout=5)})
    register_agent(registry, assistant.models(), assistant.toolbox(), "scripted")
    kernel = Kernel(InMemoryStorage(), registry, ManualClock())
    handle = kernel.create_session()
    draft = Draft()
    conversation = draft.create_conversation()
    handle.commit(draft)
    text = (
        "Send the approved notice to these five customers and summarise the result: "
        + ", ".join(CUSTOMERS)
    )
    submitted = submit(handle, conversation, {"text": text}, "req-1", actor="user:ann")
    Scheduler(kernel).run_until_idle(advance_clock=True)

    stored = kernel.storage.submission(submitted.submission.id)
    assert stored.status is SubmissionStatus.ANSWERED
    answer = next(e for e in kernel.entries(conversation) if e.id == stored.answer_entry_id)
    messages = {m["to"]: m["id"] for m in ProviderAdmin(provider.url).messages()}
    assert sorted(messages) == CUSTOMERS
    assert answer.payload["text"].startswith("Sent 5 notices.")
    for to, message_id in messages.items():
        assert f"- {to}: {message_id}" in answer.payload["text"]
    assert [e.kind for e in kernel.entries(conversation)] == [
        "user",
        "model_response",
        "tool_result",
        "model_response",
    ]


def _repeats(pattern: str) -> list[str]:
    """The kinds of repetition in a compiled-pattern parse tree (re's own parser)."""
    import re._constants as c
    import re._parser as parser

    found: list[str] = []

    def walk(items: object) -> None:
        for op, arg in items:  # type: ignore[attr-defined]
            if op in (c.MAX_REPEAT, c.MIN_REPEAT, c.POSSESSIVE_REPEAT):
                found.append(str(op))
            for part in arg if isinstance(arg, tuple | list) else ():
                if isinstance(part, parser.SubPattern):
                    walk(part)

    walk(parser.parse(pattern))
    return found


def test_the_demo_models_address_pattern_cannot_backtrack() -> None:
    """Every repetition possessive, and a start only where no address character
    precedes: each character is read by a bounded number of attempts, so a text of 2 MB
    (the proxy's limit) is one pass, not hours (the old pattern was quadratic)."""
    pattern = assistant.EMAIL.pattern
    assert _repeats(pattern) == ["POSSESSIVE_REPEAT"] * 3
    assert pattern.startswith(r"(?<![\w.+-])")
    text = "Notify " + ", ".join(CUSTOMERS) + "; (ops+alerts@mail.example.org) and x@y."
    assert assistant.EMAIL.findall(text) == [*CUSTOMERS, "ops+alerts@mail.example.org"]
    # The shapes that made the old pattern quadratic, at 2 MB: read once each.
    for text in ("a" * 2_000_000, "x@" + "b" * 2_000_000, "a." * 1_000_000,
                 "a@b." * 500_000):
        assistant.EMAIL.findall(text)


FIRST = ["ana@example.com", "ben@example.com", "cai@example.com"]


def app(provider: RunningProvider) -> tuple[Kernel, ScriptedProvider]:
    registry = Registry()
    notices.register(registry, {"http": HttpChannel(provider.url, timeout=5)})
    models = assistant.models()
    register_agent(registry, models, assistant.toolbox(), "scripted")
    scripted = models["scripted"]
    assert isinstance(scripted, ScriptedProvider)
    return Kernel(InMemoryStorage(), registry, ManualClock()), scripted


def start(kernel: Kernel, text: str) -> tuple[SessionHandle, str, str]:
    handle = kernel.create_session()
    draft = Draft()
    conversation = draft.create_conversation()
    handle.commit(draft)
    submitted = submit(handle, conversation, {"text": text}, "req-1", actor="user:ann")
    return handle, conversation, submitted.submission.id


def first_sent_then_stopped(kernel: Kernel, handle: SessionHandle) -> str:
    """Run the turn by hand until the batch has sent its first notice, the others not
    yet started; the turn's id."""
    worker = Worker(kernel, "hand")

    def one(kind: str) -> str:
        return next(t.id for t in kernel.storage.session_tasks(handle.id)
                    if t.kind == kind and not t.terminal)

    turn = one("agent-turn")
    worker.advance(turn)  # the model calls send_notices: its tool task and the wait
    worker.advance(one("agent-tool"))  # spawns the batch
    worker.advance(one("send-batch"))  # plans it: one notice per recipient
    worker.advance(one("send-notice"))  # the first is sent and recorded
    return turn


def cancel(handle: SessionHandle, task_id: str, reason: str) -> None:
    draft = Draft(actor="user:ann")
    draft.cancel(task_id, reason)
    handle.commit(draft)


def test_a_cancelled_turn_leaves_its_partial_result_and_the_next_message_sends_again(
    provider: RunningProvider,
) -> None:
    kernel, scripted = app(provider)
    handle, conversation, first = start(kernel, "Notify " + ", ".join(FIRST))
    turn = first_sent_then_stopped(kernel, handle)
    cancel(handle, turn, "wrong list")
    Scheduler(kernel).run_until_idle(advance_clock=True)

    admin = ProviderAdmin(provider.url)
    sent = {m["to"]: m["id"] for m in admin.messages()}
    assert list(sent) == FIRST[:1]
    assert kernel.storage.submission(first).status is SubmissionStatus.CANCELLED
    [result] = [e.payload for e in kernel.entries(conversation) if e.kind == "tool_result"]
    assert result["cancelled"] is True and result["reason"] == f"owner {turn} cancelled"
    partial = result["partial"]
    assert partial["receipts"][FIRST[0]]["id"] == sent[FIRST[0]]
    assert (partial["sent"], partial["unsent"], partial["uncertain"]) == (1, FIRST[1:], [])

    again = submit(handle, conversation, {"text": "notify gus@example.com"}, "req-2",
                   actor="user:ann")
    Scheduler(kernel).run_until_idle(advance_clock=True)
    stored = kernel.storage.submission(again.submission.id)
    assert stored.status is SubmissionStatus.ANSWERED
    sent = {m["to"]: m["id"] for m in admin.messages()}
    assert list(sent) == [FIRST[0], "gus@example.com"]
    answer = next(e for e in kernel.entries(conversation) if e.id == stored.answer_entry_id)
    assert answer.payload["text"] == (
        f"Sent 1 notices.\n- gus@example.com: {sent['gus@example.com']}"
    )
    # The second turn's model was told what the cancelled call had done.
    told = next(m for m in scripted.requests[-2].messages if m["role"] == "tool")
    assert told["content"] == {
        "cancelled": True,
        "reason": f"cancelled by user:ann: owner {turn} cancelled",
        "partial": partial,
        "note": CANCELLED_NOTE,
    }


@pytest.mark.parametrize("cancelled", ["agent-tool", "send-batch"])
def test_a_cancelled_tool_call_is_summarised_with_what_went_out_and_what_did_not(
    provider: RunningProvider, cancelled: str
) -> None:
    """The tool call's task or the batch it runs, cancelled on its own (the turn goes on):
    the model answers with what the batch's plan says went out."""
    kernel, _ = app(provider)
    handle, conversation, first = start(kernel, "Notify " + ", ".join(FIRST))
    first_sent_then_stopped(kernel, handle)
    task = next(t.id for t in kernel.storage.session_tasks(handle.id) if t.kind == cancelled)
    cancel(handle, task, "wrong list")
    Scheduler(kernel).run_until_idle(advance_clock=True)

    stored = kernel.storage.submission(first)
    assert stored.status is SubmissionStatus.ANSWERED
    sent = {m["to"]: m["id"] for m in ProviderAdmin(provider.url).messages()}
    answer = next(e for e in kernel.entries(conversation) if e.id == stored.answer_entry_id)
    assert answer.payload["text"] == (
        "Sent 1 notices. Problem: the sending was cancelled by user:ann: wrong list\n"
        f"- {FIRST[0]}: {sent[FIRST[0]]}\n"
        f"Not sent: {', '.join(FIRST[1:])}"
    )
