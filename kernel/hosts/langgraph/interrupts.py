"""What an interrupted graph task waits for, and which resume values it takes.

``interrupt(value)`` in a node ends the run's phase with a durable wait on a signal named
for the interrupted checkpoint and the interrupts that wait there (:func:`resume_signal`);
the task's checkpoint holds what was interrupted (``checkpoint["interrupted"]``). This
module reads that without LangGraph, for the API, the dashboard and the host.

The signal is named for the interrupts too, not only the checkpoint: a node that calls
``interrupt()`` a second time after its resume, and parallel nodes resumed one at a time,
interrupt again at the same checkpoint (no super-step ended in between), and a wait on a
signal the task already holds would take the earlier answer for the new question.
"""

from __future__ import annotations

import hashlib
from typing import Any

import jsonschema_rs

from kernel.records import Status, Task

JSON = Any
RESUME = "langgraph.resume"
"""The prefix of the signal an interrupted run waits on (``langgraph.resume:<checkpoint>``)."""


def resume_signal(checkpoint_id: str, interrupt_ids: list[str] | None = None) -> str:
    """The signal a run interrupted at ``checkpoint_id`` by ``interrupt_ids`` waits on
    (without ids: the name waits had before they were named for their interrupts)."""
    if interrupt_ids is None:
        return f"{RESUME}:{checkpoint_id}"
    digest = hashlib.sha256("\n".join(sorted(interrupt_ids)).encode()).hexdigest()[:16]
    return f"{RESUME}:{checkpoint_id}:{digest}"


def waited_signal(waiting: JSON) -> str:
    """The signal the interrupted run ``waiting`` (``checkpoint["interrupted"]``) waits on."""
    return waiting.get("signal") or resume_signal(waiting["checkpoint_id"])


def resume_map(waiting: JSON, value: JSON) -> dict[str, JSON]:
    """The resume value ``value`` as LangGraph's map of interrupt id to the value that
    interrupt receives: ``value`` itself when it is an object whose keys are ids of
    interrupts that wait (LangGraph's ``Command(resume={id: value})``, and the way to
    answer each of several interrupts), else the one waiting interrupt's value. Mapped
    by id, any value reaches the node as it is: LangGraph reads a bare ``None`` as no
    resume at all and a bare ``{}`` as a map that answers nothing. ValueError when
    several interrupts wait and ``value`` does not name them."""
    ids = [i["id"] for i in waiting["interrupts"]]
    if isinstance(value, dict) and value and set(value) <= set(ids):
        return value
    if len(ids) == 1:
        return {ids[0]: value}
    raise ValueError(
        f"value: {len(ids)} interrupts wait ({', '.join(ids)}): an object giving each "
        "interrupt you answer its value by its id"
    )


def interrupted(task: Task) -> JSON:
    """What an interrupted graph task waits for (``checkpoint_id`` and ``interrupts``,
    each with its ``id`` and ``value``), or None."""
    waiting = (task.checkpoint or {}).get("interrupted")
    signal = task.waits_on.signal if task.status is Status.WAITING else None
    if not waiting or signal != waited_signal(waiting):
        return None
    if signal in task.signals:  # answered: the resume is on its way to a worker
        return None
    return waiting


def declared_schema(found: JSON) -> JSON:
    """The JSON schema the resume value of the interrupt ``found`` (an entry of
    ``interrupts``) must meet, or None: the ``response_schema`` the node gave
    ``interrupt()`` (LangGraph validates the resume against a Pydantic model, a
    ``TypedDict`` or a dataclass in the node, which fails the run on a value it refuses),
    else the one its value declares (``{"schema": ...}`` in the value)."""
    if found.get("schema") is not None:
        return found["schema"]
    value = found.get("value")
    return value.get("schema") if isinstance(value, dict) else None


def resume_schema(waiting: JSON) -> JSON:
    """The JSON schema of the whole resume value for the interrupts in ``waiting``, when a
    node declared one (None otherwise): the one interrupt's own, or, with several, an
    object giving interrupts by id, each answer under its interrupt's schema."""
    found = waiting.get("interrupts") or []
    declared = {str(i.get("id")): declared_schema(i) for i in found}
    if len(found) == 1:
        return next(iter(declared.values()))
    if not any(s is not None for s in declared.values()):
        return None
    return {
        "type": "object", "minProperties": 1, "propertyNames": {"enum": list(declared)},
        "properties": {i: s for i, s in declared.items() if s is not None},
    }


def check_resume(
    task: Task, checkpoint_id: str, value: JSON, interrupt_ids: list[str] | None = None,
) -> None:
    """ValueError naming the field unless ``value`` may resume ``task`` where it was
    interrupted at ``checkpoint_id``: a node declares the JSON schema its resume value
    must meet with ``interrupt(value, response_schema=...)`` or ``{"schema": ...}`` in
    its value (:func:`declared_schema`). With several
    interrupts waiting, ``value`` gives each one it answers its value by id
    (:func:`resume_map`). LookupError when the task does not wait there (any more), or,
    given ``interrupt_ids`` (the interrupts the operator was shown), waits there on other
    interrupts: a node that interrupts again after its resume does so at the same
    checkpoint, and an answer meant for its first question must not answer the next."""
    waiting = interrupted(task)
    if waiting is None or waiting["checkpoint_id"] != checkpoint_id:
        raise LookupError(
            f"task {task.id} does not wait for a resume at checkpoint {checkpoint_id}"
        )
    pending = [i["id"] for i in waiting["interrupts"]]
    if interrupt_ids is not None and sorted(interrupt_ids) != sorted(pending):
        raise LookupError(
            f"task {task.id} waits at checkpoint {checkpoint_id} on interrupt "
            f"{', '.join(pending)}, not {', '.join(interrupt_ids) or 'none'}"
        )
    answers = resume_map(waiting, value)
    by_id = len(waiting["interrupts"]) > 1 or answers is value
    for found in waiting["interrupts"]:
        declared = declared_schema(found)
        if declared is None or found["id"] not in answers:
            continue
        try:
            jsonschema_rs.validator_for(declared).validate(answers[found["id"]])
        except jsonschema_rs.ValidationError as exc:
            path = ([found["id"]] if by_id else []) + list(exc.instance_path)
            where = "".join(f"[{p!r}]" for p in path)
            raise ValueError(f"value{where}: {exc.message}") from exc
