"""Model providers: how an agent turn asks a model for its next message.

A provider turns a request (model, messages, tool schemas, options) into a
response (text, tool calls, token usage), or into a *pending* handle for a
background response that is polled later. Failures say whether trying again may
help (:class:`TransientModelError`) or not (:class:`PermanentModelError`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

JSON = Any
OnText = Callable[[str], None]


class ModelError(Exception):
    pass


class TransientModelError(ModelError):
    """Rate limits, timeouts, 5xx: the same request may succeed later."""


class PermanentModelError(ModelError):
    """The request itself is wrong (or refused for good): retrying cannot help."""


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: JSON

    def to_json(self) -> JSON:
        return {"id": self.id, "name": self.name, "arguments": self.arguments}

    @classmethod
    def from_json(cls, data: JSON) -> ToolCall:
        return cls(data["id"], data["name"], data["arguments"])


@dataclass(frozen=True)
class ModelRequest:
    model: str
    messages: list[JSON]
    tools: list[JSON] = field(default_factory=list)
    options: JSON = field(default_factory=dict)


@dataclass(frozen=True)
class ModelResponse:
    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    usage: JSON = field(default_factory=dict)

    def to_json(self) -> JSON:
        return {
            "text": self.text,
            "tool_calls": [c.to_json() for c in self.tool_calls],
            "usage": dict(self.usage),
        }


@dataclass(frozen=True)
class Pending:
    """A background response: ask again later with this handle."""

    handle: str


class ModelProvider(Protocol):
    def generate(self, request: ModelRequest, on_text: OnText) -> ModelResponse | Pending: ...

    def poll(self, handle: str) -> ModelResponse | None:
        """The finished response, or None while it is still being generated."""
        ...


Script = Callable[[ModelRequest], ModelResponse | Pending]


class ScriptedProvider:
    """A deterministic provider for demos and tests: ``script(request)`` answers.

    ``responses`` is the shortcut for a fixed conversation: the n-th request of a
    turn (counted by assistant messages already in the context) gets the n-th.
    """

    def __init__(
        self,
        script: Script | None = None,
        responses: Sequence[ModelResponse] = (),
        stream_chunk: int = 16,
    ) -> None:
        if (script is None) == (not responses):
            raise ValueError("give either a script or a list of responses")
        self.script = script or self._by_position
        self.responses = list(responses)
        self.stream_chunk = stream_chunk
        self.requests: list[ModelRequest] = []
        self.background: dict[str, ModelResponse] = {}

    def _by_position(self, request: ModelRequest) -> ModelResponse:
        answered = sum(1 for m in request.messages if m["role"] == "assistant")
        return self.responses[min(answered, len(self.responses) - 1)]

    def generate(self, request: ModelRequest, on_text: OnText) -> ModelResponse | Pending:
        self.requests.append(request)
        answer = self.script(request)
        if isinstance(answer, ModelResponse):
            for start in range(0, len(answer.text), self.stream_chunk):
                on_text(answer.text[start : start + self.stream_chunk])
        return answer

    def poll(self, handle: str) -> ModelResponse | None:
        return self.background.get(handle)
