"""Tasks (as a list with filters, or as a tree) and the workers holding their leases."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Query, Router

from controlplane import commands
from controlplane.api.auth import caller
from controlplane.api.schemas import (
    ActionOut,
    MigrateIn,
    OutcomeName,
    QueueOut,
    RestartIn,
    RestartPointOut,
    RestartPreviewOut,
    StatusName,
    TaskNode,
    TaskOut,
    WorkerOut,
)
from controlplane.api.types import DateTime, PathText, QueryBoolean, query_text
from controlplane.errors import Invalid
from controlplane.reads import restarts as restart_reads
from controlplane.reads import tasks as reads
from controlplane.reads import workers as worker_reads
from controlplane.reads.tasks import TaskFilter

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
        None, description="only tasks no definition can run (or only the others), "
        "picked before `offset` and `limit` page them"),
    waiting_for_resolution: QueryBoolean | None = Query(
        None, description="waiting for an operator"),
    since: DateTime | None = Query(None, description="last changed at or after"),
    until: DateTime | None = Query(None, description="last changed before"),
    parent_id: str | None = query_text("children of this task; `root` for roots"),
    limit: int = Query(200, ge=1, le=MAX_TASKS),
    offset: int = Query(0, ge=0, le=1_000_000),
) -> Any:
    return reads.find(
        TaskFilter(
            session_id=session_id, kind=kind, status=status, outcome=outcome,
            waiting_for_resolution=waiting_for_resolution, since=since, until=until,
            parent_id=parent_id,
        ),
        offset,
        limit,
        blocked=blocked,
    )


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


@router.get("/tasks/{task_id}/restarts", response=list[RestartPointOut])
def restart_points(request: HttpRequest, task_id: PathText) -> Any:
    """The phases the task entered, oldest first, each with the checkpoint it entered it
    with: the points it may start again from (`POST /tasks/{id}/restart`)."""
    return restart_reads.points(reads.record(task_id))


@router.get("/tasks/{task_id}/restarts/{seq}", response=RestartPreviewOut)
def restart_preview(request: HttpRequest, task_id: PathText, seq: int) -> Any:
    """What starting the task again from the phase it entered at commit `seq` would do:
    the phases that stay and those that run again, and the external calls made after that
    point, which it makes again as new calls under new operation ids. Operators only."""
    found = commands.restart_preview(caller(request), task_id, seq)
    return {"task_id": found.task.id, "expected_seq": found.expected_seq,
            "point": found.point, "stays": found.stays, "runs_again": found.runs_again,
            "calls": found.calls, "may_repeat": found.may_repeat(), "refused": found.refused,
            "environment": found.environment_reason, "expected_report": found.expected_report}


@router.post("/tasks/{task_id}/restart", response=ActionOut)
def restart(request: HttpRequest, task_id: PathText, body: RestartIn) -> Any:
    """Start the task again from the phase it entered at commit `seq`, with what it
    entered it with: what it committed before stays, no phase before it runs again. Send
    the task's `updated_seq` you saw as `expected_seq`: a task changed since (409), one
    running, completing or being cancelled (409: cancel it first), one owning open
    subtasks or owned by an ended task (409) is refused and nothing changes. While a
    worker reports the task's environment different the restart runs under what that
    worker offers: send the preview's `expected_report`; another report (or one you did
    not see) is refused (409)."""
    return commands.restart_task(caller(request), task_id, body.action_id, body.reason,
                                 body.seq, body.expected_seq, body.expected_report)


@router.post("/tasks/{task_id}/migrate", response=ActionOut)
def migrate(request: HttpRequest, task_id: PathText, body: MigrateIn) -> Any:
    """Let a task that a worker found blocked by its environment (its `blocked` says the
    differences: a tool removed or changed, a model no longer configured) continue from
    where it stands under the environment that worker offers. Send the task's
    `updated_seq` and `environment_report` you saw as `expected_seq` and `expected_report`:
    refused (409) when the task changed since, when the report is not the one you saw
    (another worker may rewrite it, offering another environment, while the task stays as
    it was), or when no worker reports a difference for it now. To run it from an earlier
    phase under that environment instead, restart it (a fork)."""
    return commands.migrate_environment(caller(request), task_id, body.action_id,
                                        body.reason, body.expected_seq, body.expected_report)


@router.get("/workers", response=list[WorkerOut], tags=["workers"])
def list_workers(request: HttpRequest) -> Any:
    """Every worker process the registry knows (each writes a heartbeat every few seconds),
    idle ones too, with its state (`live`, `dead` past `WORKER_DEAD_SECONDS` of silence,
    `stopped`) and the leases it holds; then any lease holder without a registry row
    (`state` null). `worker` is the lease owner name (`host:pid`)."""
    return worker_reads.everyone()


@router.get("/queues", response=list[QueueOut], tags=["workers"])
def list_queues(request: HttpRequest) -> Any:
    """Each queue's runnable tasks (from the task table) and when the oldest became
    runnable, with the broker's message count beside it."""
    live = worker_reads.registry()
    return worker_reads.queues(consumed=sorted(
        {q for w in live if w.state == "live" for q in w.queues}))
