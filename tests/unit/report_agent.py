"""An agent whose one tool returns a report large enough to be stored as an artifact, over
any artifact store: the report, the scripted model that asks for it, a kernel with the
agent, a question in a new session, and the tool result the transcript holds."""

from __future__ import annotations

from typing import Any

from kernel import Draft, InMemoryStorage, Kernel, ManualClock, Registry
from kernel.agent import (
    ModelRequest,
    ModelResponse,
    Replay,
    ScriptedProvider,
    Tool,
    Toolbox,
    ToolCall,
    register_agent,
    submit,
)

REPORT = {"rows": [{"n": n, "text": f"row {n} " + "abc" * 20} for n in range(400)]}


def reader(request: ModelRequest) -> ModelResponse:
    asked = max(i for i, m in enumerate(request.messages) if m["role"] == "user")
    tools = [m for m in request.messages[asked + 1:] if m["role"] == "tool"]
    if not tools:
        return ModelResponse("", (ToolCall(f"c{asked}", "report", {}),))
    return ModelResponse(f"saw {tools[-1]['content']['result'].get('bytes')} bytes")


def world(store: Any, clock: ManualClock) -> tuple[Kernel, ScriptedProvider]:
    provider = ScriptedProvider(reader)
    toolbox = Toolbox()
    toolbox.add(Tool("report", "A large report", {"type": "object"}, Replay.SAFE,
                     run=lambda run, args: REPORT, artifact_above=4_096))
    registry = Registry()
    register_agent(registry, {"scripted": provider}, toolbox, "scripted")
    return Kernel(InMemoryStorage(), registry, clock, artifacts=store), provider


def ask(kernel: Kernel, text: str = "the report") -> tuple[Any, str]:
    handle = kernel.create_session()
    draft = Draft()
    conversation = draft.create_conversation()
    handle.commit(draft)
    submit(handle, conversation, {"text": text}, "r1")
    return handle, conversation


def result_of(kernel: Kernel, conversation: str) -> Any:
    [entry] = [e for e in kernel.entries(conversation) if e.kind == "tool_result"]
    return entry.payload["result"]
