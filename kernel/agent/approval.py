"""The approval gate: what a gated call's tool task records while it waits, and what an
operator's decision sends it.

A call its tool's :class:`~kernel.agent.tools.Gate` holds is committed as awaiting
approval: the tool task's checkpoint holds ``approval`` (the call's name, arguments,
their digest, why it is gated and until when it waits) and the task sleeps in phase
``approval`` until that time, holding no worker. A decision is one commit that sends
the task the signal :data:`SIGNAL` and wakes it (:func:`decide`): refused under the
session's lock if the task no longer sleeps there, so of two decisions exactly one
lands. The task then runs the call with exactly the approved arguments (committing its
intent first, as every call does), or gives the model a denial with the reason. When
the time runs out first, it denies the call itself.
"""

from __future__ import annotations

from typing import Any

import jsonschema_rs

from kernel.commit import Draft
from kernel.records import Status, Task

from .tools import digest

JSON = Any
SIGNAL = "approval"
PHASE = "approval"
APPROVAL_PHASE = PHASE
APPROVE = "approve"
DENY = "deny"
TIMED_OUT = "timeout"


def pending(task: Task) -> JSON | None:
    """The approval ``task`` (an ``agent-tool`` task) waits for now, or None."""
    if task.status is not Status.SLEEPING or task.phase != PHASE or task.cancel is not None:
        return None
    if SIGNAL in task.signals:
        return None
    return (task.checkpoint or {}).get("approval")


def check_arguments(requested: JSON, arguments: JSON) -> str | None:
    """Why edited ``arguments`` do not fit the parameters the gated tool declared when
    it asked (``requested["parameters"]``), or None when they do."""
    try:
        jsonschema_rs.validator_for(requested.get("parameters") or {}).validate(arguments)
    except jsonschema_rs.ValidationError as exc:
        where = "/".join(str(p) for p in exc.instance_path)
        return f"arguments{'/' + where if where else ''}: {exc.message}"
    return None


def decide(
    draft: Draft,
    task_id: str,
    decision: str,
    *,
    by: str,
    reason: str,
    seen: str,
    arguments: JSON = None,
) -> JSON:
    """Add an operator's decision on a pending call to ``draft`` (the signal and the wake
    in one commit): ``seen`` is the digest of the arguments they decided on;
    ``arguments``, when given with an approval, are what runs instead (edited)."""
    if decision not in (APPROVE, DENY):
        raise ValueError(f"decision: {APPROVE!r} or {DENY!r}")
    payload: JSON = {"decision": decision, "by": by, "reason": reason, "digest": seen}
    if arguments is not None:
        if decision != APPROVE:
            raise ValueError("arguments: only an approval takes edited arguments")
        payload["arguments"] = arguments
        payload["arguments_digest"] = digest(arguments)
    draft.signal(task_id, SIGNAL, payload)
    draft.wake(task_id)
    return payload
