"""The demo assistant: the agent loop wired to the notice tasks.

The model is scripted (deterministic, no network) unless ``MODEL_BASE_URL`` points
at an OpenAI-compatible server, which is then offered as model ``remote``. The own
tool, ``send_notices``, runs the durable ``send-batch`` task: a tool call is just
another task, with all its recovery. A call to more recipients than
``settings.NOTICE_APPROVAL_ABOVE`` waits for an operator's approval first. More tools
come from the modules named in ``settings.ASSISTANT_TOOL_MODULES`` (each exposes
``TOOLS``).
"""

from __future__ import annotations

import importlib
import os
import re
from dataclasses import replace
from typing import Any

from django.conf import settings

from kernel.agent import (
    Gate,
    ModelProvider,
    ModelRequest,
    ModelResponse,
    ScriptedProvider,
    Tool,
    Toolbox,
    ToolCall,
)
from kernel.agent.openai import OpenAICompatibleProvider

EMAIL = re.compile(r"[\w.+-]+@[\w-]+\.[\w.-]+")
SUBJECT = "Service notice"
BODY = "Please read the approved notice."

def many_recipients(arguments: Any) -> str | None:
    """Whether a send_notices call needs an operator's approval first (and why)."""
    count = len(arguments.get("recipients") or [])
    above = settings.NOTICE_APPROVAL_ABOVE
    return f"{count} recipients, more than {above}" if count > above else None


SEND_NOTICES = Tool(
    name="send_notices",
    description="Send the approved notice by email to each recipient, once each.",
    parameters={
        "type": "object",
        "properties": {
            "recipients": {"type": "array", "items": {"type": "string"}, "minItems": 1},
            "subject": {"type": "string"},
            "body": {"type": "string"},
            "channel": {"enum": ["http", "smtp"]},
        },
        "required": ["recipients", "subject", "body"],
        "additionalProperties": False,
    },
    task_kind="send-batch",
)


def send_notices() -> Tool:
    """``send_notices`` behind its gate (read when the toolbox is built: the settings
    are loaded by then)."""
    return replace(SEND_NOTICES, gate=Gate(many_recipients,
                                           timeout=settings.NOTICE_APPROVAL_TIMEOUT))


def notices_script(request: ModelRequest) -> ModelResponse:
    """Round 1: call ``send_notices`` for the addresses in the last user message.
    Round 2: summarise the receipts the tool returned."""
    results = [m for m in request.messages if m["role"] == "tool"]
    if results:
        content: Any = results[-1]["content"]
        summary = (content.get("result") or {}) if isinstance(content, dict) else {}
        receipts = summary.get("receipts", {})
        lines = [f"- {to}: {receipt['id']}" for to, receipt in sorted(receipts.items())]
        problem = content.get("error") if isinstance(content, dict) else None
        head = f"Sent {summary.get('sent', 0)} notices." + (
            f" Problem: {problem}" if problem else ""
        )
        return ModelResponse(
            "\n".join([head, *lines]), usage={"input_tokens": 40, "output_tokens": 20}
        )
    last = next(m["content"] for m in reversed(request.messages) if m["role"] == "user")
    recipients = list(dict.fromkeys(EMAIL.findall(last)))
    if not recipients:
        return ModelResponse("Which customers? I found no email addresses.")
    call = ToolCall(
        "call_send_notices",
        "send_notices",
        {"recipients": recipients, "subject": SUBJECT, "body": BODY},
    )
    return ModelResponse("", (call,), {"input_tokens": 30, "output_tokens": 10})


def models() -> dict[str, ModelProvider]:
    available: dict[str, ModelProvider] = {"scripted": ScriptedProvider(notices_script)}
    if os.environ.get("MODEL_BASE_URL"):
        available["remote"] = OpenAICompatibleProvider.from_env()
    return available


def toolbox() -> Toolbox:
    tools = Toolbox()
    tools.add(send_notices())
    for module in settings.ASSISTANT_TOOL_MODULES:
        for tool in importlib.import_module(module).TOOLS:
            tools.add(tool)
    return tools
