"""A Pydantic AI agent whose one tool sends notices and commits its progress with
``save_partial``; an operator cancels the turn (``commands.cancel_task``, what the API
and the dashboard call) while the tool is under way, after its first notice. Loaded by
``KERNEL_AGENTS={"mailer": "tests.integration.pydantic_mailer.agent"}``."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from controlplane import commands
from controlplane.worker.runtime import runtime
from kernel.hosts.pydantic_ai import KernelDurability, save_partial

RECIPIENTS = ["ana@example.com", "ben@example.com"]
asked: list[list[ModelMessage]] = []
cancel: dict[str, Any] = {}
"""What the test arms: ``user`` and ``task`` (the turn to cancel after the first notice)."""


def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    asked.append(list(messages))
    if len(asked) == 1:
        return ModelResponse(parts=[ToolCallPart(
            "send_notices", {"recipients": RECIPIENTS}, tool_call_id="call_send")])
    return ModelResponse(parts=[TextPart("Ana has it; I will not send it again.")])


agent = Agent(FunctionModel(model), name="mailer", capabilities=[KernelDurability()])


@agent.tool
def send_notices(ctx: RunContext[None], recipients: list[str]) -> str:
    for index, _to in enumerate(recipients):
        save_partial(ctx, {"sent": recipients[:index + 1]})
        if index == 0 and cancel:
            user = User.objects.get(username=cancel["user"])
            task_id = cancel["task"]()
            commands.cancel_task(user, task_id, "stop-1", "wrong list",
                                 runtime().kernel.task(task_id).run)
    return f"sent to {len(recipients)}"
