"""Model providers: how an agent turn asks a model for its next message.

A provider turns a request (model, messages, tool schemas, options) into a
response (text, tool calls, token usage), or into a *pending* handle for a
background response that is polled later. Failures say whether trying again may
help (:class:`TransientModelError`) or not (:class:`PermanentModelError`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

JSON = Any
OnText = Callable[[str], None]


class ModelError(Exception):
    pass


class TransientModelError(ModelError):
    """Rate limits, timeouts, 5xx: the same request may succeed later.

    ``retry_after``: how many seconds the server asked us to wait (its ``Retry-After``),
    when it said; the turn waits at least that long before it asks again."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class PermanentModelError(ModelError):
    """The request itself is wrong (or refused for good): retrying cannot help."""


class ContextOverflowError(PermanentModelError):
    """The request's context is longer than the model's window: the same request cannot
    succeed, a shorter one (after compaction) may."""


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
class Option:
    """A model option a submission may set: a number (``integer`` or any finite
    ``number``) from ``minimum`` to ``maximum``."""

    name: str
    kind: Literal["number", "integer"]
    minimum: float
    maximum: float
    description: str

    def check(self, value: Any) -> int | float:
        """``value`` as stored; ValueError naming the option if it is not allowed."""
        if isinstance(value, float) and self.kind == "integer" and value.is_integer():
            value = int(value)  # 3.0 is the JSON integer 3
        wanted = int if self.kind == "integer" else int | float
        if (
            isinstance(value, bool)
            or not isinstance(value, wanted)
            or (isinstance(value, float) and not math.isfinite(value))
            or not self.minimum <= value <= self.maximum
        ):
            a = "an integer" if self.kind == "integer" else "a number"
            raise ValueError(f"options.{self.name}: {a} from {self.minimum:g} to {self.maximum:g}")
        return value


MODEL_OPTIONS = (
    Option("temperature", "number", 0, 2, "sampling temperature"),
    Option("top_p", "number", 0, 1, "nucleus sampling: the probability mass considered"),
    Option("max_tokens", "integer", 1, 32_768, "the most tokens the answer may have"),
    Option("presence_penalty", "number", -2, 2, "penalty for tokens already present"),
    Option("frequency_penalty", "number", -2, 2, "penalty by how often a token appeared"),
    Option("seed", "integer", 0, 2**31 - 1, "ask for repeatable sampling"),
)
"""The options a submission may give a model, each checked by type and range. Nothing
else passes: the request's model, messages, tools, stream or ``n`` are the turn's to set,
never a submitter's."""
MAX_MODEL_NAME = 200


def check_options(options: Any) -> dict[str, int | float]:
    """``options`` if every key is one of :data:`MODEL_OPTIONS` with a value it allows;
    ValueError naming the first that is not."""
    if not isinstance(options, dict):
        raise ValueError(f"options: an object, not {type(options).__name__}")
    allowed = {option.name: option for option in MODEL_OPTIONS}
    checked: dict[str, int | float] = {}
    for name, value in options.items():
        option = allowed.get(name)
        if option is None:
            raise ValueError(
                f"options.{str(name)[:100]}: not an allowed option (allowed: "
                f"{', '.join(allowed)})"
            )
        checked[name] = option.check(value)
    return checked


def check_model(model: Any) -> None:
    """A model name is text (which models exist is the turn's registry to say)."""
    if not isinstance(model, str) or not 1 <= len(model) <= MAX_MODEL_NAME:
        raise ValueError(f"model: a name of 1 to {MAX_MODEL_NAME} characters")


@dataclass(frozen=True)
class ModelRequest:
    model: str
    messages: list[JSON]
    tools: list[JSON] = field(default_factory=list)
    options: JSON = field(default_factory=dict)
    purpose: Literal["turn", "compaction"] = "turn"
    """What the request is for: a turn's next message, or a summary of the earlier part
    of the conversation (never sent to the model; a scripted one may tell them apart)."""


@dataclass(frozen=True)
class ModelResponse:
    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    usage: JSON = field(default_factory=dict)
    model: str | None = None
    """The model that answered, as the server named it (when it said)."""

    def to_json(self) -> JSON:
        found: JSON = {
            "text": self.text,
            "tool_calls": [c.to_json() for c in self.tool_calls],
            "usage": dict(self.usage),
        }
        if self.model is not None:
            found["model"] = self.model
        return found


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
