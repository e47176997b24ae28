"""A Pydantic AI agent whose unsafe tool runs on the hands queue and, when armed, dies
inside its first call (``Crash``, as a SIGKILLed process would stop there). Loaded by
``KERNEL_AGENTS={"courier": "tests.integration.pydantic_hands.agent"}``."""

from __future__ import annotations

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from kernel.hosts.pydantic_ai import HANDS, KernelDurability
from tests.unit.crashes import Crash

calls: list[str] = []
armed: set[str] = set()


def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    if not any(m.kind == "response" for m in messages):
        return ModelResponse(parts=[ToolCallPart(
            "send_parcel", {"to": "ana"}, tool_call_id="call_parcel")])
    return ModelResponse(parts=[TextPart("On its way.")])


agent = Agent(FunctionModel(model), name="courier", capabilities=[KernelDurability()])


@agent.tool_plain(metadata=HANDS)
def send_parcel(to: str) -> str:
    calls.append(to)
    if "crash" in armed:
        armed.discard("crash")
        raise Crash()
    return f"sent to {to}"
