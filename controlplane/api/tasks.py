"""Tasks (as a list with filters, or as a tree) and the workers holding their leases."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from django.conf import settings
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.http import HttpRequest
from ninja import Query, Router
from ninja.errors import HttpError

from controlplane import models
from controlplane.execution import runtime
from kernel import Blocked, Task, UnknownRecord

from .schemas import OutcomeName, StatusName, TaskNode, TaskOut, WorkerOut

router = Router(tags=["tasks"])
MAX_TASKS = 1000
TASK_FIELDS = [f for f in TaskOut.model_fields if f != "blocked"]


def task_out(row: Any) -> dict[str, Any]:
    """A task as the API shows it, with its derived blocked condition."""
    out = {f: getattr(row, f) for f in TASK_FIELDS}
    out["status"] = str(out["status"])
    blocked = None
    if out["status"] != "terminal":
        resolved = runtime().kernel.registry.resolve(cast(Task, row))
        blocked = resolved.reason if isinstance(resolved, Blocked) else None
    return {**out, "blocked": blocked}


def filtered(
    session_id: str | None = None,
    kind: str | None = None,
    status: str | None = None,
    outcome: str | None = None,
    waiting_for_resolution: bool | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    parent_id: str | None = None,
) -> QuerySet[models.Task]:
    rows = models.Task.objects.all()
    if session_id:
        rows = rows.filter(session_id=session_id)
    if kind:
        rows = rows.filter(kind=kind)
    if status:
        rows = rows.filter(status=status)
    if outcome:
        rows = rows.filter(status="terminal", outcome__kind=outcome)
    if waiting_for_resolution is not None:
        waits = Q(status="waiting", wait__has_key="signal")
        rows = rows.filter(waits) if waiting_for_resolution else rows.exclude(waits)
    if since or until:
        # In UTC: Postgres refuses offsets beyond ±16 h, which Python (and ISO 8601) allow.
        since, until = (t.astimezone(UTC) if t else None for t in (since, until))
        last_change = models.Commit.objects.filter(
            session_id=OuterRef("session_id"), seq=OuterRef("updated_seq")
        )
        if since:
            last_change = last_change.filter(at__gte=since)
        if until:
            last_change = last_change.filter(at__lt=until)
        rows = rows.filter(Exists(last_change))
    if parent_id == "root":
        rows = rows.filter(parent_id__isnull=True)
    elif parent_id:
        rows = rows.filter(parent_id=parent_id)
    return rows.order_by("session_id", "created_seq", "id")


@router.get("/tasks", response=list[TaskOut])
def list_tasks(
    request: HttpRequest,
    session_id: str | None = None,
    kind: str | None = None,
    status: StatusName | None = None,
    outcome: OutcomeName | None = None,
    blocked: bool | None = Query(None, description="only tasks no definition can run (or not)"),
    waiting_for_resolution: bool | None = Query(None, description="waiting for an operator"),
    since: datetime | None = Query(None, description="last changed at or after"),
    until: datetime | None = Query(None, description="last changed before"),
    parent_id: str | None = Query(None, description="children of this task; `root` for roots"),
    limit: int = Query(200, ge=1, le=MAX_TASKS),
    offset: int = Query(0, ge=0, le=1_000_000),
) -> Any:
    rows = filtered(
        session_id, kind, status, outcome, waiting_for_resolution, since, until, parent_id
    )
    found = [task_out(r) for r in rows[offset : offset + limit]]
    if blocked is not None:
        found = [t for t in found if (t["blocked"] is not None) == blocked]
    return found


@router.get("/sessions/{session_id}/tree", response=list[TaskNode])
def task_tree(request: HttpRequest, session_id: str) -> Any:
    """Every task of the session, nested under its parent (roots first)."""
    rows = list(filtered(session_id=session_id)[: MAX_TASKS + 1])
    if len(rows) > MAX_TASKS:
        raise HttpError(
            422, f"more than {MAX_TASKS} tasks: page them with /tasks?parent_id=...&session_id=..."
        )
    if not rows and runtime().kernel.storage.session(session_id) is None:
        raise UnknownRecord(f"no session {session_id}")
    children: dict[str | None, list[Any]] = defaultdict(list)
    for row in rows:
        children[row.parent_id].append(row)

    def node(row: Any) -> dict[str, Any]:
        return {"task": task_out(row), "children": [node(c) for c in children[row.id]]}

    known = {r.id for r in rows}
    return [node(r) for r in rows if r.parent_id is None or r.parent_id not in known]


@router.get("/tasks/{task_id}", response=TaskOut)
def get_task(request: HttpRequest, task_id: str) -> Any:
    row = models.Task.objects.filter(id=task_id).first()
    if row is None:
        raise UnknownRecord(f"no task {task_id}")
    return task_out(row)


@router.get("/workers", response=list[WorkerOut], tags=["workers"])
def list_workers(request: HttpRequest) -> Any:
    """Who holds which leases now. A worker without a lease has nothing to show here."""
    return workers()


def workers() -> list[dict[str, Any]]:
    """Lease holders with their leases and last heartbeat (the API and the workers page)."""
    lease = timedelta(seconds=settings.KERNEL_LEASE_SECONDS)
    held: dict[str, list[models.Task]] = defaultdict(list)
    for row in models.Task.objects.filter(status="running").exclude(lease_owner=None):
        held[row.lease_owner].append(row)
    return [
        {
            "worker": owner,
            "leases": [
                {
                    "task_id": r.id,
                    "kind": r.kind,
                    "phase": r.phase,
                    "epoch": r.epoch,
                    "lease_until": r.lease_until,
                }
                for r in rows
            ],
            "last_heartbeat": max(r.lease_until for r in rows) - lease,
        }
        for owner, rows in sorted(held.items())
    ]
