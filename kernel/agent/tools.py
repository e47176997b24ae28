"""Tools an agent may call, with JSON-schema parameters and a replay policy.

The replay policy answers "may this run again if we do not know whether it ran?"
(DESIGN §8). ``safe``: reading, or idempotent by construction. ``unsafe``: anything
with an effect that must not repeat; an interrupted unsafe call becomes an
``interrupted`` result the model sees, never a silent second run.

A tool is either a function run inside the tool task, or an application task
kind (say ``send-batch``) that the tool task spawns and waits for.

A call that is cancelled, or that the kernel ends (restart limit), is still answered:
with that mark and the call's committed partial output. For a function tool that is
what it saved to its progress document; a task-kind tool names ``partial``, which reads
it from the records of the tool's own task (the application knows where they are).

A tool may be gated (:class:`Gate`): a call it says needs approval waits, holding no
worker, until an operator approves it (perhaps with edited arguments), denies it, or
its timeout denies it (see :mod:`kernel.agent.approval`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import jsonschema_rs

from kernel.artifacts import DEFAULT_THRESHOLD

if TYPE_CHECKING:
    from kernel.run import Run

JSON = Any


class Replay(StrEnum):
    SAFE = "safe"
    UNSAFE = "unsafe"


DAY = 86_400.0


def digest(arguments: JSON) -> str:
    """A call's arguments as an operator saw them, in a few characters: what a decision
    names, so a decision on arguments that changed since is refused."""
    text = json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Gate:
    """When a call needs an operator's approval before it runs.

    ``when``: True (always), False (never), or a predicate on the call's arguments that
    answers whether it does - True, or the reason as text ("12 recipients, more than
    10"), which operators are shown. A predicate that raises asks for approval: a gate
    fails closed. ``timeout``: seconds a call waits for a decision; then it is denied.
    """

    when: bool | Callable[[JSON], bool | str | None] = True
    timeout: float = DAY

    def __post_init__(self) -> None:
        if not self.timeout > 0:
            raise ValueError("a gate's timeout is a positive number of seconds")

    def needed(self, arguments: JSON) -> str | None:
        """Why a call with ``arguments`` needs approval, or None when it does not."""
        if isinstance(self.when, bool):
            return "every call of this tool is approved first" if self.when else None
        try:
            answer = self.when(arguments)
        except Exception as exc:
            return f"the gate could not decide ({type(exc).__name__}: {exc})"
        if isinstance(answer, str) and answer:
            return answer
        return "the tool's gate asks for approval" if answer else None


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: JSON
    replay: Replay = Replay.UNSAFE
    run: Callable[[Run, JSON], JSON] | None = None
    task_kind: str | None = None
    partial: Callable[[Run, str | None, JSON], JSON] | None = None
    """``partial(run, task_id, arguments)``: what a call stopped part-way had done, from
    committed state only; ``task_id`` is the ``task_kind`` task the call spawned (None if
    it had not spawned one yet)."""
    gate: Gate | None = None
    """None: calls run as soon as they are committed."""
    artifact_above: int | None = DEFAULT_THRESHOLD
    """A result whose JSON passes this many bytes is stored as an artifact
    (:mod:`kernel.artifacts`) and the model gets its reference with an excerpt; None:
    results are kept whole in the transcript."""

    def __post_init__(self) -> None:
        if (self.run is None) == (self.task_kind is None):
            raise ValueError(f"tool {self.name!r}: give either `run` or `task_kind`")
        jsonschema_rs.validator_for(self.parameters)  # a broken schema fails at registration

    def schema(self) -> JSON:
        """What the model is shown (the OpenAI-style function description)."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }

    def check(self, arguments: JSON) -> str | None:
        """Why ``arguments`` do not fit the parameters, or None when they do."""
        try:
            jsonschema_rs.validator_for(self.parameters).validate(arguments)
        except jsonschema_rs.ValidationError as exc:
            where = "/".join(str(p) for p in exc.instance_path) or "arguments"
            return f"{where}: {exc.message}"
        return None


@dataclass
class Toolbox:
    tools: dict[str, Tool] = field(default_factory=dict)

    def add(self, tool: Tool) -> Tool:
        if tool.name in self.tools:
            raise ValueError(f"tool {tool.name!r} already registered")
        self.tools[tool.name] = tool
        return tool

    def get(self, name: str) -> Tool | None:
        return self.tools.get(name)

    def schemas(self) -> list[JSON]:
        return [t.schema() for t in self.tools.values()]
