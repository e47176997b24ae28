"""The API's schemas: what crosses the edge, validated there (django-ninja/pydantic)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ninja import Field, Schema
from pydantic import model_validator

from controlplane.commands import BulkAction
from kernel import Outcome, Status
from kernel.agent import WhenBusy

JSON = Any
ActionId = Field(
    ..., min_length=1, max_length=200, description="client-chosen id; a repeat does nothing new"
)
Reason = Field(..., min_length=1, max_length=2000, description="why: kept with the action")


def storable(value: Any, where: str = "body") -> None:
    """Refuse text that Postgres cannot store: NUL characters and lone surrogates."""
    if isinstance(value, str):
        if "\x00" in value:
            raise ValueError(f"{where}: text may not contain NUL characters")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(f"{where}: text is not valid Unicode") from exc
    elif isinstance(value, dict):
        for key, item in value.items():
            storable(key, where)
            storable(item, f"{where}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            storable(item, f"{where}[{index}]")


class Input(Schema):
    """Base of every request body: all of it must be storable as Postgres text/jsonb."""

    @model_validator(mode="before")
    @classmethod
    def _storable(cls, data: Any) -> Any:
        storable(getattr(data, "_obj", data))  # ninja hands validators a DjangoGetter
        return data


class SessionOut(Schema):
    id: str
    head_seq: int
    created_at: datetime
    metadata: JSON


class SessionIn(Input):
    metadata: dict[str, Any] = Field(default_factory=dict)


class ConversationOut(Schema):
    id: str
    session_id: str
    created_seq: int
    fork_of: str | None = None
    fork_entry_id: str | None = None


class ConversationIn(Input):
    fork_of: str | None = None
    fork_entry_id: str | None = None


class EntryOut(Schema):
    id: str
    conversation_id: str
    seq: int
    ordinal: int
    kind: str
    payload: JSON
    actor: str
    created_at: datetime
    cursor: str = Field(..., description="pass as `after` to read on from here")


class EntryPage(Schema):
    entries: list[EntryOut]
    next: str | None = Field(None, description="cursor of the next page, if there is one")


class DocumentOut(Schema):
    kind: str
    key: str
    version: int
    value: JSON


class DecisionOut(Schema):
    name: str = Field(..., description="what `resolve` sends as `decision`")
    label: str
    may_repeat: str | None = Field(None, description="what may happen twice if it is wrong")
    description: str = ""


class TaskOut(Schema):
    id: str
    session_id: str
    kind: str
    version: int
    status: str
    phase: str
    input: JSON
    checkpoint: JSON
    parent_id: str | None
    owned: bool
    wait: JSON | None
    wake_at: datetime | None
    cancel: JSON | None
    outcome: JSON | None
    restarts: int
    epoch: int
    lease_owner: str | None
    lease_until: datetime | None
    created_seq: int
    updated_seq: int
    blocked: str | None = Field(None, description="why no registered definition can run it")
    shown_status: str = Field(..., description="its status, or once terminal its outcome")
    decisions: list[DecisionOut] = Field(
        default_factory=list, description="what an operator may answer it now (`resolve`)"
    )


class TaskNode(Schema):
    task: TaskOut
    children: list[TaskNode]


class SubmissionIn(Input):
    conversation_id: str = Field(..., min_length=1)
    request_id: str = Field(..., min_length=1, max_length=200)
    input: JSON = Field(..., description="an object with a `text` string (and optionally "
                        "`model`, `options`)")
    when_busy: WhenBusy = Field(
        WhenBusy.FOLLOW_UP,
        description="if a turn is running: `steer` joins it (its next model request sees "
        "the input), `follow_up` queues a turn of its own, `reject` refuses with 409 and "
        "writes nothing",
    )


class SubmissionOut(Schema):
    id: str
    session_id: str
    conversation_id: str
    request_id: str
    input: JSON
    status: str
    created_seq: int
    updated_seq: int
    answer_entry_id: str | None
    reason: str | None
    resubmit_of: str | None = None


class ActionIn(Input):
    action_id: str = ActionId
    reason: str = Reason


class ResolveIn(ActionIn):
    decision: str = Field(
        ..., min_length=1, max_length=100,
        description="one of the task's `decisions` (what its definition offers an operator)",
    )
    receipt: dict[str, Any] | None = Field(None, description="with `sent`: what proves it")


class ActionOut(Schema):
    action_id: str
    action: str
    target: str
    session_id: str
    seq: int = Field(..., description="the commit that recorded the action")
    replayed: bool = Field(..., description="true when this action id was already done")
    may_repeat: list[str] = Field(
        default_factory=list, description="side effects that may run again because of it"
    )


StatusName = Status
OutcomeName = Outcome


class BulkFilter(Input):
    action: BulkAction
    session_id: str | None = None
    kind: str | None = None
    status: StatusName | None = None
    outcome: OutcomeName | None = None


class BulkIn(BulkFilter):
    action_id: str = ActionId
    reason: str = Reason
    expected_count: int | None = Field(
        None, ge=0, description="the count the preview showed; a different count is refused"
    )


class BulkPreview(Schema):
    count: int
    task_ids: list[str]


class BulkResult(Schema):
    task_id: str
    ok: bool
    detail: str
    seq: int | None = None


class BulkOut(Schema):
    action_id: str
    count: int
    results: list[BulkResult]


class LeaseOut(Schema):
    task_id: str
    kind: str
    phase: str
    epoch: int
    lease_until: datetime


class WorkerOut(Schema):
    worker: str = Field(..., description="the lease owner name, `host:pid`")
    leases: list[LeaseOut]
    last_heartbeat: datetime | None = Field(
        None, description="its last registry heartbeat; for a lease holder without a "
        "registry row, its latest lease renewal (lease expiry minus its duration)"
    )
    state: str | None = Field(
        None, description="`live`, `dead` (no heartbeat for WORKER_DEAD_SECONDS) or "
        "`stopped`; null for a lease holder without a registry row"
    )
    name: str | None = Field(None, description="Celery node name, `name@host`")
    host: str | None = None
    pid: int | None = None
    queues: list[str] = Field(default_factory=list)
    concurrency: int | None = None
    in_flight: int | None = Field(None, description="`advance` messages running now")
    processed_last_minute: int | None = None
    failed_last_minute: int | None = None
    processed_total: int | None = None
    failed_total: int | None = None
    started_at: datetime | None = None
    stopped_at: datetime | None = None


class QueueOut(Schema):
    queue: str
    runnable: int = Field(..., description="tasks a worker of this queue may claim now")
    oldest: datetime | None = Field(None, description="when the oldest of them became runnable")
    broker: int | None = Field(None, description="messages in the broker's list (null: unknown)")


class ErrorOut(Schema):
    detail: JSON
