"""Tasks (as a list with filters, or as a tree) and the workers holding their leases."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Query, Router

from controlplane.errors import Invalid
from controlplane.reads import tasks as reads
from controlplane.reads.tasks import TaskFilter
from controlplane.reads.workers import lease_holders

from .schemas import OutcomeName, StatusName, TaskNode, TaskOut, WorkerOut
from .types import DateTime, PathText, QueryBoolean, query_text, utc

router = Router(tags=["tasks"])
MAX_TASKS = 1000


@router.get("/tasks", response=list[TaskOut])
def list_tasks(
    request: HttpRequest,
    session_id: str | None = query_text(),
    kind: str | None = query_text(),
    status: StatusName | None = None,
    outcome: OutcomeName | None = None,
    blocked: QueryBoolean | None = Query(
        None, description="only tasks no definition can run (or not)"),
    waiting_for_resolution: QueryBoolean | None = Query(
        None, description="waiting for an operator"),
    since: DateTime | None = Query(None, description="last changed at or after"),
    until: DateTime | None = Query(None, description="last changed before"),
    parent_id: str | None = query_text("children of this task; `root` for roots"),
    limit: int = Query(200, ge=1, le=MAX_TASKS),
    offset: int = Query(0, ge=0, le=1_000_000),
) -> Any:
    found = reads.find(
        TaskFilter(
            session_id=session_id, kind=kind, status=status, outcome=outcome,
            waiting_for_resolution=waiting_for_resolution, since=utc(since), until=utc(until),
            parent_id=parent_id,
        ),
        offset,
        limit,
    )
    if blocked is not None:
        found = [t for t in found if (t.blocked is not None) == blocked]
    return found


@router.get("/sessions/{session_id}/tree", response=list[TaskNode])
def task_tree(request: HttpRequest, session_id: PathText) -> Any:
    """Every task of the session, nested under its parent (roots first)."""
    found = reads.tree(session_id, MAX_TASKS)
    if found is None:
        raise Invalid(
            f"more than {MAX_TASKS} tasks: page them with /tasks?parent_id=...&session_id=..."
        )
    return found


@router.get("/tasks/{task_id}", response=TaskOut)
def get_task(request: HttpRequest, task_id: PathText) -> Any:
    return reads.get(task_id)


@router.get("/workers", response=list[WorkerOut], tags=["workers"])
def list_workers(request: HttpRequest) -> Any:
    """Who holds which leases now. A worker without a lease has nothing to show here."""
    return lease_holders()
