"""The chaos tests' Pydantic AI agent (:mod:`tests.chaos.pydantic_agent`) with both its
tools on the hands queue (``hands(SAFE)`` and ``HANDS``), loaded into real worker
processes through ``KERNEL_AGENTS={"support": "tests.chaos.pydantic_hands_agent.agent"}``.
The same model, output type, validator, notes and hold points."""

from __future__ import annotations

from typing import Any

from pydantic_ai import Agent, RunContext
from pydantic_ai.models.function import FunctionModel

from kernel.hosts.pydantic_ai import HANDS, SAFE, KernelDurability, hands

from .pydantic_agent import Ticket, check, look_up, model, send_each

agent = Agent(FunctionModel(model), name="support", output_type=Ticket,
              capabilities=[KernelDurability()])
agent.output_validator(check)


@agent.tool_plain(metadata=hands(SAFE))
def lookup(customer: str) -> str:
    """Find the customer's contacts (reads only: safe to run again)."""
    return look_up(customer)


@agent.tool(metadata=HANDS)
def send_notice(ctx: RunContext[Any], recipients: list[str]) -> str:
    """Send the approved notice to each recipient (must not run twice)."""
    return send_each(ctx, recipients)
