"""A cancelled Pydantic AI turn leaves the next one what it did: its cancelled call is
answered with who cancelled it, why, and the partial result the tool had committed
(``save_partial``), in the transcript and in what the next request is told."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from kernel import Draft, InMemoryStorage, Kernel, ManualClock, Registry, Scheduler
from kernel.agent import submit
from kernel.agent.context import CANCELLED_NOTE
from kernel.hosts.pydantic_ai import KernelDurability, register_agent, save_partial
from kernel.records import SubmissionStatus

RECIPIENTS = ["ana@example.com", "ben@example.com"]


class Cancelled(Exception):
    pass


def mailer_session(agent: Agent[Any, Any], storage: InMemoryStorage,
                   clock: ManualClock) -> tuple[Kernel, Any, str]:
    """A kernel hosting ``agent`` as ``mailer``, a session and a conversation in it."""
    registry = Registry()
    register_agent(registry, "mailer", agent)
    kernel = Kernel(storage, registry, clock)
    handle = kernel.create_session()
    draft = Draft()
    conversation = draft.create_conversation()
    handle.commit(draft)
    return kernel, handle, conversation


def test_a_cancelled_call_tells_the_next_request_its_committed_partial_result() -> None:
    storage, clock = InMemoryStorage(), ManualClock()
    asked: list[list[ModelMessage]] = []
    sent: list[str] = []
    where: dict[str, Any] = {}

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        asked.append(list(messages))
        if len(asked) == 1:
            return ModelResponse(parts=[ToolCallPart(
                "send_all", {"recipients": RECIPIENTS}, tool_call_id="call_send")])
        return ModelResponse(parts=[TextPart("I will not send it again.")])

    agent = Agent(FunctionModel(model), name="mailer", capabilities=[KernelDurability()])

    @agent.tool
    def send_all(ctx: RunContext[None], recipients: list[str]) -> str:
        for index, to in enumerate(recipients):
            sent.append(to)
            save_partial(ctx, {"sent": recipients[:index + 1]})
            if index == 0:  # an operator cancels the turn while the call is under way
                cancel = Draft(actor="user:olga")
                cancel.cancel(where["turn"](), "wrong list")
                where["kernel"].open(where["session"]).commit(cancel)
        return "sent"

    kernel, handle, conversation = mailer_session(agent, storage, clock)

    def turn() -> str:
        return next(t.id for t in storage.session_tasks(handle.id)
                    if t.kind == "agent:mailer" and not t.terminal)

    where.update(kernel=kernel, session=handle.id, turn=turn)
    first = submit(handle, conversation, {"text": "Send it", "agent": "mailer"}, "r1")
    assert first.submission is not None
    for _ in range(5):
        try:
            Scheduler(kernel, "w").run_until_idle(advance_clock=True)
            break
        except Exception:  # the cancelled phase's next commit is refused (its lease is gone)
            continue
    (ended,) = [t for t in storage.session_tasks(handle.id) if t.kind == "agent:mailer"]
    assert ended.terminal and ended.outcome["kind"] == "cancelled"
    assert storage.submission(first.submission.id).status is SubmissionStatus.CANCELLED
    # The call went on to ben until its next commit was refused: what it had committed
    # is what the model is told (the note says the rest may or may not have happened).
    assert sent == RECIPIENTS

    [card] = [e.payload for e in kernel.entries(conversation) if e.kind == "tool_result"]
    assert card["cancelled"] is True and card["by"] == "user:olga"
    assert card["partial"] == {"sent": RECIPIENTS[:1]}

    second = submit(handle, conversation, {"text": "Did it go out?", "agent": "mailer"}, "r2")
    assert second.submission is not None
    Scheduler(kernel, "w2").run_until_idle(advance_clock=True)
    assert storage.submission(second.submission.id).status is SubmissionStatus.ANSWERED
    told = [p for m in asked[-1] if isinstance(m, ModelRequest) for p in m.parts
            if isinstance(p, ToolReturnPart)]
    assert [p.tool_call_id for p in told] == ["call_send"]
    assert told[0].content == {
        "cancelled": True, "reason": "cancelled by user:olga: wrong list",
        "partial": {"sent": RECIPIENTS[:1]}, "note": CANCELLED_NOTE,
    }
    assert [m.kind for m in asked[-1]] == ["request", "response", "request"]


@pytest.mark.parametrize("during", ["the call", "the first request"])
def test_a_cancelled_first_turn_leaves_the_next_one_the_agents_system_prompt(
    during: str
) -> None:
    """The framework sends an agent's system prompt only in a conversation's first
    request: a first turn cancelled after its model answered leaves that request as it
    was, one cancelled before it answered leaves no history (nothing took effect); either
    way the next turn's model gets the system prompt."""
    from pydantic_ai.messages import SystemPromptPart

    storage, clock = InMemoryStorage(), ManualClock()
    asked: list[list[ModelMessage]] = []
    where: dict[str, Any] = {}

    def cancel_turn() -> None:
        cancel = Draft(actor="user:olga")
        cancel.cancel(where["turn"], "wrong list")
        where["kernel"].open(where["session"]).commit(cancel)

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        asked.append(list(messages))
        if len(asked) == 1:
            if during == "the first request":
                cancel_turn()
            return ModelResponse(parts=[ToolCallPart("send", {"to": "ana"}, tool_call_id="c1")])
        return ModelResponse(parts=[TextPart("Not sent.")])

    agent = Agent(FunctionModel(model), name="mailer", capabilities=[KernelDurability()],
                  system_prompt="You are ACME's mailer.")

    @agent.tool_plain
    def send(to: str) -> str:
        cancel_turn()
        return "sent"

    kernel, handle, conversation = mailer_session(agent, storage, clock)
    first = submit(handle, conversation, {"text": "Send it", "agent": "mailer"}, "r1")
    assert first.submission is not None
    where.update(kernel=kernel, session=handle.id, turn=next(
        t.id for t in storage.session_tasks(handle.id) if t.kind == "agent:mailer"))
    for _ in range(5):
        try:
            Scheduler(kernel, "w").run_until_idle(advance_clock=True)
            break
        except Exception:  # the cancelled phase's next commit is refused (its lease is gone)
            continue
    assert storage.submission(first.submission.id).status is SubmissionStatus.CANCELLED
    submit(handle, conversation, {"text": "Did it go out?", "agent": "mailer"}, "r2")
    Scheduler(kernel, "w2").run_until_idle(advance_clock=True)
    prompts = [p.content for m in asked[-1] if isinstance(m, ModelRequest) for p in m.parts
               if isinstance(p, SystemPromptPart)]
    assert prompts == ["You are ACME's mailer."]
    kinds = ["request", "response", "request"] if during == "the call" else ["request"]
    assert [m.kind for m in asked[-1]] == kinds
