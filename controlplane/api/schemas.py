"""The API's schemas: what crosses the edge, validated there (django-ninja/pydantic)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from ninja import Field, Schema
from pydantic import ConfigDict, model_validator

from controlplane.api.types import (
    MAX_NAME,
    NO_NUL,
    NOT_BLANK,
    Integer,
    JsonObject,
    SessionMetadata,
    SubmissionInput,
    storable,
    text,
)
from controlplane.commands import MAX_BULK, BulkAction
from controlplane.reads import graphs as graph_reads
from kernel import Decision, Outcome, Status
from kernel.agent import WhenBusy

JSON = Any
MAX_EPOCH = 2**63 - 1  # a bigint
# An action id becomes a commit key (kernel.values.NAME_BYTES), a bulk action's with a
# task id after it: 200 characters leave room for that.
ActionId = text(
    ..., min_length=1, max_length=200, description="client-chosen id; a repeat does nothing new"
)
Reason = text(..., min_length=1, max_length=2000, pattern=NOT_BLANK,
              description="why: kept with the action (not only white space)")


class Input(Schema):
    """Base of every request body: a JSON object with only the fields its schema names
    (an unknown one is refused, naming it), all of it storable as Postgres text/jsonb."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _storable(cls, data: Any) -> Any:
        body = getattr(data, "_obj", data)  # ninja hands validators a DjangoGetter
        if not isinstance(body, dict):
            raise ValueError(f"body: a JSON object, not {type(body).__name__}")
        storable(body)
        return data


class SessionOut(Schema):
    id: str
    head_seq: int
    created_at: datetime
    metadata: JSON
    pruned_seq: int = Field(
        0, description="retention removed the commits up to this seq (0: none); the change "
        "feed answers a cursor below it with a snapshot"
    )


class SessionIn(Input):
    metadata: SessionMetadata = Field(default_factory=dict)


class ConversationOut(Schema):
    id: str
    session_id: str
    created_seq: int
    fork_of: str | None = None
    fork_entry_id: str | None = None


class ConversationIn(Input):
    fork_of: str | None = text(None)
    fork_entry_id: str | None = text(None)


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
    receipt: JSON | None = Field(
        None, description="the `receipt` `resolve` may send with it (a JSON schema); "
        "null: it takes none"
    )

    @staticmethod
    def resolve_receipt(decision: Decision) -> JSON | None:
        return decision.receipt.schema() if decision.receipt is not None else None


class StepOut(Schema):
    signal: str = Field(..., description="the signal the task waits on")
    epoch: int = Field(..., description="the task's epoch while it waits (a later step has "
                       "another)")


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
    run: int = Field(..., description="which run of the task this is: 0 as created, one more "
                     "at each retry and restart from a phase (its own phases and claims keep "
                     "it): what `cancel` sends back as `expected_run`")
    blocked: str | None = Field(
        None, description="why no worker can run it: no registered definition can, or (only "
        "`GET /tasks/{id}` reads these) a worker does not offer its environment, or the "
        "workers found it blocked")
    environment_report: str | None = Field(
        None, description="the identity of the worker's report that it does not offer the "
        "environment the run was started under (`blocked` says its differences; only "
        "`GET /tasks/{id}` reads it): send it to migrate as `expected_report`")
    shown_status: str = Field(..., description="its status, or once terminal its outcome")
    decisions: list[DecisionOut] = Field(
        default_factory=list, description="what an operator may answer it now (`resolve`)"
    )
    step: StepOut | None = Field(
        None, description="the uncertain step `resolve` answers now: send it with the decision"
    )
    trace_id: str | None = Field(
        None, description="the OpenTelemetry trace its phases' spans are in (32 hex digits)")


class TaskNode(Schema):
    task: TaskOut
    children: list[TaskNode]


class SubmissionIn(Input):
    conversation_id: str = text(..., min_length=1)
    request_id: str = text(..., min_length=1, max_length=200)
    input: SubmissionInput = Field(..., description="an object with a `text` string (and "
                                   "optionally `model`, `options`)")
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
    resubmits: int = Field(0, description="how many submissions resubmit it; each one changes "
                           "its `updated_seq`, which `resubmit` sends back as `expected_seq`")


class ActionIn(Input):
    action_id: str = ActionId
    reason: str = Reason


class RetryIn(ActionIn):
    expected_seq: Integer = Field(..., ge=0, le=MAX_EPOCH,
                                  description="the task's `updated_seq` as you saw it: a task "
                                  "changed since (retried by someone else, and failed "
                                  "again, say) is refused (409)")


class CancelIn(ActionIn):
    expected_run: Integer = Field(..., ge=0, le=MAX_EPOCH,
                                  description="the task's `run` as you saw it: the run you "
                                  "stop, whatever phase it has reached since; a task started "
                                  "again since (retried, restarted from a phase) is refused "
                                  "(409)")


class WakeIn(ActionIn):
    expected_seq: Integer = Field(..., ge=0, le=MAX_EPOCH,
                                  description="the task's `updated_seq` as you saw its sleep: "
                                  "a task changed since (woke and slept again, say) is "
                                  "refused (409)")


class ResubmitIn(ActionIn):
    expected_seq: Integer = Field(..., ge=0, le=MAX_EPOCH,
                                  description="the submission's `updated_seq` as you saw it: "
                                  "one changed since (resubmitted by someone else, say) is "
                                  "refused (409)")


class CompactIn(ActionIn):
    last_entry_id: str = text(..., min_length=1, max_length=200,
                              description="the newest entry of the conversation you saw: "
                              "a conversation that has a newer one is refused (409)")


InterruptId = Annotated[str, Field(pattern=NO_NUL, max_length=MAX_NAME)]


class ResumeIn(ActionIn):
    checkpoint_id: str = text(..., min_length=1, max_length=200,
                              description="the interrupt you answer: the task's "
                              "`checkpoint.interrupted.checkpoint_id`")
    value: JsonObject = Field(..., description="the resume value the interrupted node "
                              "receives (checked against the `schema` its interrupt "
                              "declares); when several interrupts wait, an object giving "
                              "each one you answer its value by its id")
    interrupt_ids: list[InterruptId] = Field(
        ..., min_length=1, max_length=100, description="the ids of the interrupts you "
        "answer (the thread's `interrupts[].interrupt_ids`): refused (409) when the run "
        "waits on others, as a node that interrupts again after its resume does at the "
        "same checkpoint")


class ForkIn(ActionIn):
    checkpoint_id: str = text(..., min_length=1, max_length=200,
                              description="the checkpoint of the graph itself (not a "
                              "subgraph's) to go on from: one of the thread's `checkpoints`")
    expected_version: Integer = Field(..., ge=0, le=MAX_EPOCH,
                                      description="the thread's `version` as you saw it: a "
                                      "thread changed since (a checkpoint written, pruned, "
                                      "another run started or forked) is refused (409)")
    values: JsonObject | None = Field(
        None, description="update the state there first (LangGraph's `update_state`: the "
        "channels to write, as a JSON object); absent or null replays it as it was")
    kind: str | None = text(None, min_length=1, max_length=200,
                            description="the graph to run, registered here (a new version "
                            "of it, say); absent or null: the thread's newest run's (`kind`)")
    as_node: str | None = text(None, min_length=1, max_length=200,
                               description="with `values`: the node they are written as "
                               "(LangGraph's `as_node`), needed where the checkpoint's step "
                               "ran several nodes; absent or null: the node that wrote last")


class GraphRunIn(ActionIn):
    kind: str = text(..., min_length=1, max_length=200,
                     description="a graph registered here (`register_graph`)")
    input: JSON = Field(..., description="the graph's input: invoked with it from the "
                        "thread's newest checkpoint, or from the start on a new thread")
    expected_version: Integer = Field(..., ge=0, le=MAX_EPOCH,
                                      description="the thread's `version` as you saw it, 0 "
                                      "for a session that holds no thread yet: a thread "
                                      "changed since is refused (409)")


class GraphCheckpointOut(Schema):
    id: str
    step: int | None = Field(..., description="the super-step (-1: the input)")
    source: str = Field(..., description="what wrote it: `input`, `loop`, `update`, `fork`")
    parent: str | None
    at: datetime | None
    branch: int = Field(..., description="0 the first run's branch, n the n-th fork's")
    fork_of: str | None = Field(..., description="the checkpoint a fork went on from, when "
                                "this one starts a branch")
    latest: bool = Field(..., description="the thread's newest: what a run goes on from")
    ends_branch: bool = Field(..., description="no checkpoint follows it")


class GraphSubgraphOut(Schema):
    namespace: str = Field(..., description="`node:task id`, nested ones joined by `|`")
    checkpoints: int
    newest: GraphCheckpointOut
    timeline: list[GraphCheckpointOut] = Field(
        ..., description=f"its newest {graph_reads.SUBGRAPH_TIMELINE} checkpoints, oldest "
        "first (all of them: `GET /sessions/{session_id}/graph/checkpoints?namespace=`)")


class GraphTimelineOut(Schema):
    namespace: str = Field(..., description="empty: the graph's own")
    total: int = Field(..., description="the checkpoints the namespace holds")
    checkpoints: list[GraphCheckpointOut] = Field(
        ..., description="the newest `limit` of them, oldest first")


class GraphInterruptOut(Schema):
    task_id: str
    kind: str
    checkpoint_id: str = Field(..., description="send it with the resume "
                               "(`POST /tasks/{task_id}/resume`)")
    values: list[JSON] = Field(..., description="each interrupt's value, as the node gave it")
    interrupt_ids: list[str] = Field(..., description="each interrupt's id, in the order of "
                                     "`values`: with several, the resume value gives each "
                                     "one its value by its id")
    resume_schema: JSON = Field(..., description="the JSON schema a resume value must meet, "
                                "when the node declared one")
    refused: str | None = Field(None, description="why the node refused the last resume "
                                "value (its response_schema's validation): it waits for "
                                "another")

    @staticmethod
    def resolve_resume_schema(found: Any) -> JSON:
        return found.schema

    @staticmethod
    def resolve_interrupt_ids(found: Any) -> list[str]:
        return list(found.ids)


class GraphRunOut(Schema):
    task_id: str
    kind: str
    status: str = Field(..., description="as the dashboard shows it")
    fork_of: str | None = Field(..., description="the checkpoint a forked run went on from")

    @staticmethod
    def resolve_status(found: Any) -> str:
        return str(found.shown_status)


class GraphOut(Schema):
    session_id: str
    version: int = Field(..., description="send it back as a start's or a fork's "
                         "`expected_version`")
    checkpoints: list[GraphCheckpointOut] = Field(
        ..., description=f"the graph's own checkpoints, the newest "
        f"{graph_reads.CHECKPOINTS_SHOWN}, oldest first")
    total: int = Field(..., description="all the graph's own checkpoints in the thread")
    branches: int
    namespaces: int = Field(..., description="subgraph namespaces that hold checkpoints")
    subgraphs: list[GraphSubgraphOut] = Field(
        ..., description=f"the {graph_reads.SUBGRAPHS_SHOWN} namespaces with the newest "
        "checkpoints, newest first")
    interrupts: list[GraphInterruptOut] = Field(
        ..., description="runs that wait for a resume value")
    runs: list[GraphRunOut] = Field(..., description="the thread's graph runs, oldest first")
    kind: str | None = Field(..., description="the task kind a fork runs unless it names "
                             "another")
    graphs: list[str] = Field(..., description="the graphs registered here: what a start "
                              "or a fork may run")


class ResolveIn(ActionIn):
    decision: str = text(
        ..., min_length=1, max_length=100,
        description="one of the task's `decisions` (what its definition offers an operator)",
    )
    receipt: JsonObject | None = Field(
        None, description="what proves it, if the decision takes a receipt (its `receipt` "
        "says the shape)"
    )
    signal: str = text(..., min_length=1, max_length=200,
                       description="the step you decide: the task's `step.signal`")
    epoch: Integer = Field(..., ge=0, le=MAX_EPOCH,
                           description="the step you decide: the task's `step.epoch`")


class MigrateIn(ActionIn):
    expected_seq: Integer = Field(..., ge=0, le=MAX_EPOCH,
                                  description="the task's `updated_seq` as you saw it: a task "
                                  "changed since is refused (409)")
    expected_report: str = text(..., min_length=1, max_length=64,
                                description="the task's `environment_report` as you saw it: "
                                "a report rewritten since (another worker offering another "
                                "environment) is refused (409)")


class RestartIn(ActionIn):
    seq: Integer = Field(..., ge=1, le=MAX_EPOCH,
                         description="the restart point you chose: the commit at which the "
                         "task entered that phase (`GET /tasks/{id}/restarts`)")
    expected_seq: Integer = Field(..., ge=0, le=MAX_EPOCH,
                                  description="the task's `updated_seq` as you saw it: a task "
                                  "changed since is refused (409)")
    expected_report: str | None = text(
        None, min_length=1, max_length=64,
        description="the preview's `expected_report` (null or absent: you saw no report): "
        "while a worker reports the run's environment different the restart runs under "
        "what it offers, and another report than the one you saw is refused (409)")


class BranchOut(Schema):
    action_id: str
    session_id: str
    entry_id: str = Field(..., description="the model response branched from")
    conversation_id: str = Field(..., description="the new conversation, forked at the entry")
    turn_id: str = Field(..., description="the new turn, which starts from that response")
    seq: int = Field(..., description="the commit that recorded the branch")
    replayed: bool = Field(..., description="true when this action id was already done")


class RestartPointOut(Schema):
    seq: int = Field(..., description="the commit at which the task entered the phase")
    at: datetime
    actor: str
    phase: str
    checkpoint: JSON = Field(..., description="what the task entered the phase with")
    version: int | None
    restart_of: int | None = Field(None, description="for a phase entered by a restart: the "
                                   "seq it restarted from")


class CallOut(Schema):
    task_id: str
    kind: str
    name: str
    operation_id: str | None
    replay: str = Field(..., description="`safe`, `unsafe`, or `unknown`")
    new_operation_id: str | None = Field(
        None, description="the id the task's own call goes out under after the restart (a "
        "subtask's call is made by a new subtask, with an id of its own)")


class RestartPreviewOut(Schema):
    task_id: str
    expected_seq: int = Field(..., description="send it back with the restart")
    point: RestartPointOut
    stays: list[RestartPointOut] = Field(..., description="phases kept as they are")
    runs_again: list[RestartPointOut] = Field(
        ..., description="phases entered from the point on (history; they run anew)")
    calls: list[CallOut] = Field(..., description="external calls made after the point: "
                                 "a restart makes them again as new calls")
    may_repeat: list[str]
    refused: str | None = Field(None, description="why the task's state refuses it now")
    environment: str | None = Field(
        None, description="while a worker reports the run's environment different: that "
        "report, in words (the restart runs under what that worker offers)")
    expected_report: str | None = Field(
        None, description="that report's identity: send it back with the restart")


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
    task_id: str | None = Field(
        None, description="the task the action created: a graph run (start, fork)")


StatusName = Status
OutcomeName = Outcome
ABSENT: Any = None
"""Default of a field that may be left out but not sent as null (pydantic does not
validate defaults, so an explicit null is refused while an absent field is None)."""


class ApprovalOut(Schema):
    """A tool call waiting for an operator's approval (the approval gate)."""

    call_id: str = Field(..., description="what `approve` and `deny` are addressed by")
    task_id: str = Field(..., description="the task that waits: the call's tool task, or "
                         "the approval task of a hosted agent's deferred call")
    session_id: str
    conversation_id: str
    name: str = Field(..., description="the tool")
    arguments: JSON = Field(..., description="what the call would run with")
    digest: str = Field(..., description="of those arguments: send it with the decision")
    why: str = Field(..., description="why the tool's gate holds this call")
    until: datetime = Field(..., description="when it is denied if nobody decides")
    parameters: JSON = Field(None, description="the JSON schema edited arguments must fit")
    requested_seq: int
    request: str = Field(..., description="this request's identity: send it with the "
                         "decision as `expected_request` (a call asked again, restarted or "
                         "in a later turn, is another request even with the same arguments)")
    who: str = Field(..., description="who may decide (`operators`: the operator role)")


DIGEST = r"^sha256:[0-9a-f]{64}$"


class DenyIn(ActionIn):
    digest: str = Field(..., pattern=DIGEST,
                        description="the `digest` of the arguments you saw (the pending "
                        "approval's): other arguments waiting now are refused (409)")
    expected_request: str = Field(..., pattern=DIGEST,
                                  description="the pending approval's `request` you saw: "
                                  "another request waiting now is refused (409)")


class ApproveIn(DenyIn):
    arguments: JsonObject = Field(
        ABSENT, description="edited arguments to run instead (they must fit the tool's "
        "`parameters`); leave out to run the call as it is"
    )


FILTERS = ("session_id", "kind", "status", "outcome")


class BulkFilter(Input):
    """Which tasks a bulk action touches: at least one of the filters, each a value."""

    model_config = ConfigDict(
        json_schema_extra={"anyOf": [{"required": [name]} for name in FILTERS]}
    )

    action: BulkAction
    session_id: str = text(ABSENT, min_length=1)
    kind: str = text(ABSENT, min_length=1)
    status: StatusName = Field(ABSENT)
    outcome: OutcomeName = Field(ABSENT)

    @model_validator(mode="after")
    def _filtered(self) -> BulkFilter:
        if all(getattr(self, name) is None for name in FILTERS):
            raise ValueError(f"filter: give at least one of {', '.join(FILTERS)}")
        return self


class BulkIn(BulkFilter):
    action_id: str = ActionId
    reason: str = Reason
    expected_count: Integer = Field(
        ..., ge=0, le=MAX_BULK,
        description="the count the preview showed; a different count is refused",
    )
    expected_digest: str = Field(
        ..., pattern=r"^[0-9a-f]{64}$",
        description="the preview's `digest`: the action applies to exactly the tasks the "
        "preview found, as it found them, and is refused (409, nothing done) if the filter "
        "finds others now, or the same tasks changed since (a retry: failed again; a "
        "cancel: started again)",
    )


class BulkPreview(Schema):
    count: int
    task_ids: list[str]
    seen: list[int] = Field(..., description="what the action acts on of each task, in "
                            "`task_ids`' order: for a retry its `updated_seq` (the failure "
                            "you saw), for a cancel its `run` (the run you saw)")
    digest: str = Field(..., description="SHA-256 (hex) of the tasks, each `<task id> <seen>` "
                        "on a line, sorted: send it back as `expected_digest`")


class BulkResult(Schema):
    task_id: str
    ok: bool
    detail: str
    seq: int | None = None
    replayed: bool = Field(False, description="done before under this action id: nothing "
                           "ran again")


class BulkOut(Schema):
    action_id: str
    count: int
    digest: str = Field(..., description="the set acted on (the preview's digest)")
    results: list[BulkResult]


class LeaseOut(Schema):
    task_id: str
    kind: str
    phase: str
    epoch: int
    lease_until: datetime


class PricesOut(Schema):
    input: float | None = Field(None, description="per million input tokens")
    output: float | None = Field(None, description="per million output tokens")


class ModelOut(Schema):
    name: str = Field(..., description="what a submission's `input.model` names")
    provider: str = Field(..., description="`scripted` (the demo's) or `openai` "
                          "(an OpenAI-compatible server)")
    model: str = Field(..., description="the model name the server is asked for")
    context_window: int | None = Field(
        None, description="tokens; a submission's `options.max_tokens` may not exceed it")
    prices: PricesOut | None = None
    background: bool = Field(False, description="asked in background mode (polled)")
    default: bool = Field(..., description="answers a submission that names no model")


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
    runnable: int = Field(..., description="tasks a worker of this queue may claim now, "
                          "not counting blocked ones")
    oldest: datetime | None = Field(None, description="when the oldest of them became runnable")
    broker: int | None = Field(None, description="messages in the broker's list (null: unknown)")
    blocked: int = Field(0, description="tasks otherwise runnable that no worker here can run "
                         "(definition missing, too old, or failing to migrate)")


class ErrorOut(Schema):
    detail: JSON
