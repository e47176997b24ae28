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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import jsonschema_rs

if TYPE_CHECKING:
    from kernel.run import Run

JSON = Any


class Replay(StrEnum):
    SAFE = "safe"
    UNSAFE = "unsafe"


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
