"""Tool calls waiting for an operator's approval (the approval gate,
:mod:`kernel.agent.approval`): per session for the API and the session page, across
sessions for Needs attention, and the one tool task a call id names."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from controlplane import models
from controlplane.reads import sessions
from controlplane.storage.schema import TASK
from kernel import Status, Task, UnknownRecord
from kernel.agent import digest
from kernel.agent.approval import PHASE, TASK_KIND, WHO, pending

TOOL_KIND = "agent-tool"
KINDS = (TOOL_KIND, TASK_KIND)
"""A native call's tool task, or the approval task of an agent that runs its own tools."""
MAX_PENDING = 200


@dataclass(frozen=True)
class PendingApproval:
    """A gated call as the operator decides on it: what it would do, and the digest of
    those arguments (what a decision names)."""

    task_id: str
    session_id: str
    conversation_id: str
    call_id: str
    name: str
    arguments: Any
    digest: str
    why: str
    until: datetime
    parameters: Any
    requested_seq: int
    who: str = WHO
    """Who may decide."""
    request: str = ""
    """This request's identity (:func:`request_identity`): what a decision names beside
    the digest of the arguments."""


def request_identity(requested: Any) -> str:
    """What names one request for approval as the operator saw it (a digest of all it
    records, its deadline too): a call asked again (restarted, or a call id a later turn
    reuses) with the same arguments is another request, which a decision on this one must
    not answer."""
    return digest(requested)


def shown(task: Task) -> PendingApproval | None:
    requested = pending(task)
    if requested is None:
        return None
    return PendingApproval(
        task.id, task.session_id, task.input.get("conversation_id", ""),
        str(task.input["call"].get("id", "")), requested["name"], requested["arguments"],
        requested["digest"], requested.get("why", ""),
        datetime.fromisoformat(requested["until"]), requested.get("parameters"),
        task.updated_seq, requested.get("who") or WHO, request_identity(requested),
    )


def _waiting(session_id: str | None) -> list[PendingApproval]:
    rows = models.Task.objects.filter(kind__in=KINDS, status=Status.SLEEPING, phase=PHASE)
    if session_id is not None:
        rows = rows.filter(session_id=session_id)
    found = [shown(TASK.record(v)) for v in
             rows.order_by("session_id", "created_seq")[:MAX_PENDING].values(*TASK.columns)]
    return [p for p in found if p is not None]


def pending_in(session_id: str) -> list[PendingApproval]:
    """The session's calls waiting for a decision, oldest first."""
    sessions.session(session_id)
    return _waiting(session_id)


def pending_anywhere() -> list[PendingApproval]:
    """Every session's calls waiting for a decision (Needs attention)."""
    return _waiting(None)


def call_task(session_id: str, call_id: str, request: str | None = None) -> Task:
    """The task of call ``call_id`` in the session that approvals address (its tool task,
    or its approval task): the one asked with the request ``request``
    (:func:`request_identity`: what the operator saw, decided since or not) if there is
    one, else the newest one waiting for approval if there is one, else the newest. One
    id may name several calls of a session: a model may reuse a call id in a later turn,
    and a turn branched from a response makes its calls anew under their ids, while the
    original's may still wait."""
    sessions.session(session_id)
    rows = models.Task.objects.filter(session_id=session_id, kind__in=KINDS,
                                      input__call__id=call_id).order_by("-created_seq")
    found = [TASK.record(v) for v in rows[:20].values(*TASK.columns)]
    if not found:
        raise UnknownRecord(f"no tool call {call_id} in session {session_id}")
    seen = [t for t in found if request is not None
            and request_identity((t.checkpoint or {}).get("approval")) == request]
    waiting = [t for t in found if pending(t) is not None]
    return next(iter(seen or waiting or found))
