"""What an interrupted graph task waits for, and which resume values it takes.

``interrupt(value)`` in a node ends the run's phase with a durable wait on a signal named
for the interrupted checkpoint (:func:`resume_signal`); the task's checkpoint holds what
was interrupted (``checkpoint["interrupted"]``). This module reads that without LangGraph,
for the API and the dashboard.
"""

from __future__ import annotations

from typing import Any

import jsonschema_rs

from kernel.records import Status, Task

JSON = Any
RESUME = "langgraph.resume"
"""The prefix of the signal an interrupted run waits on (``langgraph.resume:<checkpoint>``)."""


def resume_signal(checkpoint_id: str) -> str:
    return f"{RESUME}:{checkpoint_id}"


def interrupted(task: Task) -> JSON:
    """What an interrupted graph task waits for (``checkpoint_id`` and ``interrupts``,
    each with its ``id`` and ``value``), or None."""
    waiting = (task.checkpoint or {}).get("interrupted")
    signal = task.waits_on.signal if task.status is Status.WAITING else None
    if not waiting or signal != resume_signal(waiting["checkpoint_id"]):
        return None
    if signal in task.signals:  # answered: the resume is on its way to a worker
        return None
    return waiting


def declared_schema(value: JSON) -> JSON:
    """The JSON schema an interrupt's value declares its resume value must meet
    (``{"schema": ...}`` in the value), or None."""
    return value.get("schema") if isinstance(value, dict) else None


def check_resume(task: Task, checkpoint_id: str, value: JSON) -> None:
    """ValueError naming the field unless ``value`` may resume ``task`` where it was
    interrupted at ``checkpoint_id``: a node that interrupts with ``{"schema": ...}`` in
    its value declares the JSON schema its resume value must meet. LookupError when the
    task does not wait there (any more)."""
    waiting = interrupted(task)
    if waiting is None or waiting["checkpoint_id"] != checkpoint_id:
        raise LookupError(
            f"task {task.id} does not wait for a resume at checkpoint {checkpoint_id}"
        )
    for found in waiting["interrupts"]:
        declared = declared_schema(found["value"])
        if declared is None:
            continue
        try:
            jsonschema_rs.validator_for(declared).validate(value)
        except jsonschema_rs.ValidationError as exc:
            where = "".join(f"[{p!r}]" for p in exc.instance_path)
            raise ValueError(f"value{where}: {exc.message}") from exc
