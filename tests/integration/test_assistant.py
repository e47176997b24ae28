"""The seed's request, end to end through the agent loop: the scripted model calls
``send_notices``, the durable batch runs against the real local provider, and the
answer lists the five receipts."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from controlplane import assistant
from controlplane.dev.processes import RunningProvider, start_provider
from controlplane.dev.provider_admin import ProviderAdmin
from controlplane.notices import tasks as notices
from controlplane.notices.channels import HttpChannel
from kernel import (
    Draft,
    InMemoryStorage,
    Kernel,
    ManualClock,
    Registry,
    Scheduler,
    SubmissionStatus,
)
from kernel.agent import register_agent, submit

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
