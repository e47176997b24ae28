"""The chaos tests' Pydantic AI agent (:mod:`tests.chaos.pydantic_agent`) with both its
tools on the hands queue (``hands(SAFE)`` and ``HANDS``), loaded into real worker
processes through ``KERNEL_AGENTS={"support": "tests.chaos.pydantic_hands_agent.agent"}``.
The same model, output type, validator, notes and hold points."""

from __future__ import annotations

import os
from typing import Any

from pydantic_ai import Agent, RunContext
from pydantic_ai.models.function import FunctionModel

from controlplane.reference.notices.channels import HttpChannel
from controlplane.reference.notices.provider import Message
from kernel.hosts.pydantic_ai import HANDS, SAFE, KernelDurability, hands, operation_id

from .pydantic_agent import RECIPIENTS, Ticket, check, hold, model, note

agent = Agent(FunctionModel(model), name="support", output_type=Ticket,
              capabilities=[KernelDurability()])
agent.output_validator(check)


@agent.tool_plain(metadata=hands(SAFE))
def lookup(customer: str) -> str:
    """Find the customer's contacts (reads only: safe to run again)."""
    note("runs", f"lookup {os.getpid()}")
    hold("tool:lookup")
    return f"{customer}: {', '.join(RECIPIENTS)}"


@agent.tool(metadata=HANDS)
def send_notice(ctx: RunContext[Any], recipients: list[str]) -> str:
    """Send the approved notice to each recipient (must not run twice)."""
    note("runs", f"send_notice {os.getpid()}")
    channel = HttpChannel(os.environ["EMAIL_PROVIDER_URL"], 10.0)
    for index, to in enumerate(recipients):
        channel.send(Message(to, "Notice", "Approved text."), f"{operation_id(ctx)}_{to}")
        if index == 0:
            hold("tool:send_notice")  # the first message is out, the second is not
    return f"sent to {len(recipients)}"
