"""The demo assistant: the agent loop wired to the notice tasks.

The models are those ``settings.MODELS`` configures by name (:mod:`model_catalog`):
the scripted one (deterministic, no network) and any OpenAI-compatible servers. The own
tool, ``send_notices``, runs the durable ``send-batch`` task: a tool call is just
another task, with all its recovery. A call to more recipients than
``settings.NOTICE_APPROVAL_ABOVE`` waits for an operator's approval first. More tools
come from the modules named in ``settings.ASSISTANT_TOOL_MODULES`` (each exposes
``TOOLS``).
"""

from __future__ import annotations

import importlib
import re
from dataclasses import replace
from typing import Any

from django.conf import settings

from controlplane import model_catalog
from controlplane.reference.notices.tasks import batch_partial
from kernel.agent import (
    Gate,
    ModelProvider,
    ModelRequest,
    ModelResponse,
    Pending,
    PermanentModelError,
    ScriptedProvider,
    Tool,
    Toolbox,
    ToolCall,
)
from kernel.agent.models import OnText
from kernel.agent.openai import OpenAICompatibleProvider

# Linear in the text, whatever it holds: an address starts only where no address
# character precedes it (the lookbehind), and each run is taken whole, never given back
# (possessive quantifiers, which cannot backtrack). With plain `+` and no lookbehind, a
# run of n word characters without an `@` was scanned from each of its n starts.
EMAIL = re.compile(r"(?<![\w.+-])[\w.+-]++@[\w-]++\.[\w.-]++")
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
    partial=batch_partial,
)


def send_notices() -> Tool:
    """``send_notices`` behind its gate (read when the toolbox is built: the settings
    are loaded by then)."""
    return replace(SEND_NOTICES, gate=Gate(many_recipients,
                                           timeout=settings.NOTICE_APPROVAL_TIMEOUT))


def notices_script(request: ModelRequest) -> ModelResponse:
    """Each user message on its own: with no tool result since it, call ``send_notices``
    for the addresses it names; with one, summarise that result (receipts, and for a
    call that stopped part-way what was sent, what was not and what is uncertain). A
    summary request (compaction) is answered with the requests and results it covers."""
    if request.purpose == "compaction":
        questions = [str(m["content"])[:200] for m in request.messages[1:-1]
                     if m["role"] == "user"]
        sent = [summarise(m["content"]) for m in request.messages if m["role"] == "tool"]
        return ModelResponse(
            "Earlier in this conversation:\n" + "\n".join(
                [*(f"- asked: {q}" for q in questions), *(f"- {s}" for s in sent)]),
            usage={"input_tokens": 60, "output_tokens": 25},
        )
    asked = max(i for i, m in enumerate(request.messages) if m["role"] == "user")
    since = request.messages[asked + 1:]
    results = [m for m in since if m["role"] == "tool"]
    if results:
        return ModelResponse(
            summarise(results[-1]["content"]), usage={"input_tokens": 40, "output_tokens": 20}
        )
    recipients = list(dict.fromkeys(EMAIL.findall(request.messages[asked]["content"])))
    if not recipients:
        return ModelResponse("Which customers? I found no email addresses.")
    call = ToolCall(  # one id per user message: a conversation holds many calls
        f"call_send_notices_{asked}",
        "send_notices",
        {"recipients": recipients, "subject": SUBJECT, "body": BODY},
    )
    return ModelResponse("", (call,), {"input_tokens": 30, "output_tokens": 10})


def summarise(content: Any) -> str:
    content = content if isinstance(content, dict) else {}
    stopped = content.get("cancelled") or content.get("interrupted")
    summary = (
        content.get("partial") if stopped else content.get("result") or content.get("partial")
    ) or {}
    receipts = summary.get("receipts", {})
    lines = [f"- {to}: {receipt['id']}" for to, receipt in sorted(receipts.items())]
    if content.get("cancelled"):
        problem = f"the sending was {content.get('reason', 'cancelled')}"
    elif content.get("interrupted"):
        problem = "the sending was interrupted"
    else:
        problem = content.get("error")
    head = f"Sent {summary.get('sent', 0)} notices." + (f" Problem: {problem}" if problem else "")
    if summary.get("unsent"):
        lines.append(f"Not sent: {', '.join(summary['unsent'])}")
    if summary.get("uncertain"):
        lines.append(f"Uncertain (may have been sent): {', '.join(summary['uncertain'])}")
    return "\n".join([head, *lines])


class MissingKey:
    """A model whose key variable is not set in this process: each request is refused,
    naming the variable (a process that asks no model, such as the web process, needs no
    key)."""

    def __init__(self, entry: model_catalog.ModelEntry) -> None:
        self.problem = (f"model {entry.name!r}: its key variable {entry.api_key_env} is not "
                        "set in the worker's environment")

    def generate(self, request: ModelRequest, on_text: OnText) -> ModelResponse | Pending:
        raise PermanentModelError(self.problem)

    def poll(self, handle: str) -> ModelResponse | None:
        raise PermanentModelError(self.problem)


def provider(entry: model_catalog.ModelEntry) -> ModelProvider:
    """The provider of one configured model."""
    if entry.provider == model_catalog.SCRIPTED:
        return ScriptedProvider(notices_script)
    key = model_catalog.api_key(entry)
    if entry.api_key_env is not None and not key:
        return MissingKey(entry)
    assert entry.base_url is not None  # the catalog requires one for a server's model
    return OpenAICompatibleProvider(entry.base_url, entry.model, key, timeout=entry.timeout,
                                    background=entry.background, stream=entry.stream,
                                    max_retries=entry.max_retries)


def models() -> dict[str, ModelProvider]:
    """Every configured model's provider, by the name a submission gives."""
    return {name: provider(entry) for name, entry in settings.MODELS.items()}


def toolbox() -> Toolbox:
    tools = Toolbox()
    tools.add(send_notices())
    for module in settings.ASSISTANT_TOOL_MODULES:
        for tool in importlib.import_module(module).TOOLS:
            tools.add(tool)
    return tools
