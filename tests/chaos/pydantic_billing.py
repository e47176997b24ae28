"""A Pydantic AI agent with a deferred tool, for tests with real workers and a browser:
``KERNEL_AGENTS={"billing": "tests.chaos.pydantic_billing.agent"}``.

An ordinary agent as Pydantic AI documents deferred tools (``requires_approval=True``,
``output_type=[str, DeferredToolRequests]``), streaming through a ``FunctionModel``,
with the kernel's capability (``stream=True``: its text is shown as previews). The model
asks to ``pay`` 5, then answers with what the call returned. From inside the workers it
appends each request's step to ``$AGENT_TOOL_DIR/model``, what the call returned to the
model to ``told``, and each run of the tool to ``runs``. With ``$AGENT_TOOL_DIR/
hold-stream`` the answer's stream stops after its first words until ``release``
exists, so a browser sees the preview while it is streamed.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel
from pydantic_ai.tools import DeferredToolRequests

from kernel.hosts.pydantic_ai import KernelDurability

from .pydantic_agent import hold, note

CALL_ID = "call_pay"


def told(messages: list[ModelMessage]) -> Any:
    """What the pay call's return said to the model (a denial's message, if denied)."""
    return next((p.content for m in messages if isinstance(m, ModelRequest)
                 for p in m.parts if isinstance(p, ToolReturnPart)
                 and p.tool_call_id == CALL_ID), None)


def unstreamed(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    raise AssertionError("the capability streams every request (stream=True)")


async def model(messages: list[ModelMessage], info: AgentInfo
                ) -> AsyncIterator[str | DeltaToolCalls]:
    step = sum(1 for m in messages if m.kind == "response")
    note("model", str(step))
    if step == 0:
        yield "I will pay the supplier."
        yield {0: DeltaToolCall(name="pay", json_args='{"amount": 5}', tool_call_id=CALL_ID)}
        return
    said = told(messages)
    note("told", json.dumps(said))
    yield "The payment call "
    yield "came back: "
    await asyncio.to_thread(hold, "stream")
    yield f"**{said}**"


agent = Agent(FunctionModel(unstreamed, stream_function=model), name="billing",
              output_type=[str, DeferredToolRequests],
              capabilities=[KernelDurability(stream=True)])


@agent.tool_plain(requires_approval=True)
def pay(amount: int) -> str:
    """Pay the supplier ``amount`` (an operator approves each payment first)."""
    note("runs", f"pay {os.getpid()}")
    return f"paid {amount}"
