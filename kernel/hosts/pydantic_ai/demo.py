"""The demo's Pydantic AI agent, ``helpdesk``: what ``make demo`` registers
(``KERNEL_AGENTS={"helpdesk": "kernel.hosts.pydantic_ai.demo.agent"}``) and starts a
session with.

An ordinary agent with the kernel's capability, offline: a ``FunctionModel`` that
streams its text, looks the customer up with a safe tool, then asks to send them a
notice with a tool that needs an operator's approval (``requires_approval=True``), and
answers with what came back: the notice sent, or the operator's reason for denying it.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator

from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel
from pydantic_ai.tools import DeferredToolRequests

from .capability import SAFE, KernelDurability

WORD_PAUSE = 0.15  # seconds between streamed words, so the preview is seen live
EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")


def _asked(messages: list[ModelMessage]) -> str:
    return " ".join(str(p.content) for m in messages if isinstance(m, ModelRequest)
                    for p in m.parts if isinstance(p, UserPromptPart))


def _returned(messages: list[ModelMessage], call_id: str) -> object:
    return next((p.content for m in messages if isinstance(m, ModelRequest) for p in m.parts
                 if isinstance(p, ToolReturnPart) and p.tool_call_id == call_id), None)


def _unstreamed(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    raise RuntimeError("the demo agent streams every request (KernelDurability(stream=True))")


async def _words(text: str) -> AsyncIterator[str]:
    for word in text.split(" "):
        yield word + " "
        await asyncio.sleep(WORD_PAUSE)


async def _model(messages: list[ModelMessage], info: AgentInfo
                 ) -> AsyncIterator[str | DeltaToolCalls]:
    step = sum(1 for m in messages if m.kind == "response")
    found = EMAIL.findall(_asked(messages))
    to = found[-1] if found else "ana@example.com"
    turn = len([m for m in messages if isinstance(m, ModelRequest)
                and any(isinstance(p, UserPromptPart) for p in m.parts)])
    lookup, notice = f"lookup_{turn}", f"notice_{turn}"
    if _returned(messages, lookup) is None:
        async for word in _words(f"Let me look up **{to}** first."):
            yield word
        yield {0: DeltaToolCall(name="lookup", json_args=f'{{"email": "{to}"}}',
                                tool_call_id=lookup)}
    elif _returned(messages, notice) is None:
        async for word in _words(f"Found them: {_returned(messages, lookup)}. I will send "
                                 "the notice; an operator approves it first."):
            yield word
        yield {0: DeltaToolCall(name="send_notice", json_args=f'{{"to": "{to}"}}',
                                tool_call_id=notice)}
    else:
        async for word in _words(f"Done ({step} requests): {_returned(messages, notice)}"):
            yield word


agent = Agent(FunctionModel(_unstreamed, stream_function=_model, model_name="demo-helpdesk"),
              name="helpdesk", output_type=[str, DeferredToolRequests],
              instructions="Help the operator's customers.",
              capabilities=[KernelDurability(stream=True)])


@agent.tool_plain(metadata=SAFE)
def lookup(email: str) -> str:
    """Find the customer with this email (reads only: safe to run again)."""
    return f"{email.split('@')[0].title()}, customer since 2021"


@agent.tool_plain(requires_approval=True)
def send_notice(to: str) -> str:
    """Send the approved notice to ``to`` (an operator approves each one first)."""
    return f"the notice to {to} is queued"
