"""A Pydantic AI agent for chaos tests, loaded into real worker processes through
``KERNEL_AGENTS={"support": "tests.chaos.pydantic_agent.agent"}``.

An ordinary agent (``FunctionModel``, a structured output type and its validator, one
safe tool and one unsafe tool that sends a notice through the project's email
provider) with the kernel's capability added. Every model request appends its step to
``$AGENT_TOOL_DIR/model`` and every tool run ``<name> <pid>`` to ``$AGENT_TOOL_DIR/runs``,
so the test counts from outside the workers. A hold point named in ``$AGENT_TOOL_DIR/
hold-<point>`` blocks the first process that reaches it until ``release`` exists (the
test kills that worker meanwhile); a later process passes it. Points: ``model:<step>``,
``before:<tool>`` (the response is committed, the tool not started), ``tool:<tool>``
and ``validate`` (output validation).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_ai import Agent, RunContext
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from controlplane.reference.notices.channels import HttpChannel
from controlplane.reference.notices.provider import Message
from kernel.hosts.pydantic_ai import SAFE, KernelDurability, operation_id

HOLD_LIMIT = 120.0
RECIPIENTS = ["ana@example.com", "ben@example.com"]


def directory() -> Path:
    return Path(os.environ["AGENT_TOOL_DIR"])


def note(name: str, line: str) -> None:
    with (directory() / name).open("a") as out:
        out.write(line + "\n")


def hold(point: str) -> None:
    """Block here once, while ``hold-<point>`` asks for it; the first arrival says so."""
    if not (directory() / f"hold-{point}").exists():
        return
    marker = directory() / f"held-{point}"
    try:
        marker.open("x").close()
    except FileExistsError:
        return  # held once already: a later worker passes
    note("holding", f"{point} {os.getpid()}")
    deadline = time.monotonic() + HOLD_LIMIT
    while not (directory() / "release").exists() and time.monotonic() < deadline:
        time.sleep(0.05)


class Ticket(BaseModel):
    customer: str
    notified: list[str]


def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    step = sum(1 for m in messages if m.kind == "response")
    note("model", str(step))
    hold(f"model:{step}")
    if step == 0:
        parts: list[Any] = [ToolCallPart("lookup", {"customer": "ana"}, tool_call_id="call_lookup")]
    elif step == 1:
        parts = [TextPart("Sending the notices."),
                 ToolCallPart("send_notice", {"recipients": RECIPIENTS}, tool_call_id="call_send")]
    else:
        parts = [TextPart("**Done.**"), ToolCallPart(
            info.output_tools[0].name, {"customer": "ana", "notified": RECIPIENTS},
            tool_call_id=f"call_output_{step}")]
    return ModelResponse(parts=parts, model_name="function-support")


class Holds(AbstractCapability[Any]):
    """The window between a committed response and its tool's start."""

    async def before_tool_execute(self, ctx: RunContext[Any], *, call: Any, tool_def: Any,
                                  args: dict[str, Any]) -> dict[str, Any]:
        hold(f"before:{tool_def.name}")
        return args


agent = Agent(FunctionModel(model), name="support", output_type=Ticket,
              capabilities=[Holds(), KernelDurability()])


def look_up(customer: str) -> str:
    """The lookup tool's body (this agent's and the hands agent's)."""
    note("runs", f"lookup {os.getpid()}")
    hold("tool:lookup")
    return f"{customer}: {', '.join(RECIPIENTS)}"


def send_each(ctx: RunContext[Any], recipients: list[str]) -> str:
    """The send_notice tool's body (this agent's and the hands agent's)."""
    note("runs", f"send_notice {os.getpid()}")
    channel = HttpChannel(os.environ["EMAIL_PROVIDER_URL"], 10.0)
    for index, to in enumerate(recipients):
        channel.send(Message(to, "Notice", "Approved text."), f"{operation_id(ctx)}_{to}")
        if index == 0:
            hold("tool:send_notice")  # the first message is out, the second is not
    return f"sent to {len(recipients)}"


@agent.tool_plain(metadata=SAFE)
def lookup(customer: str) -> str:
    """Find the customer's contacts (reads only: safe to run again)."""
    return look_up(customer)


@agent.tool
def send_notice(ctx: RunContext[None], recipients: list[str]) -> str:
    """Send the approved notice to each recipient (must not run twice)."""
    return send_each(ctx, recipients)


@agent.output_validator
def check(output: Ticket) -> Ticket:
    note("runs", f"validate {os.getpid()}")
    hold("validate")
    return output
