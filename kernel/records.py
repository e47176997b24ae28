"""The records of the Session Store (DESIGN §3).

Records are frozen dataclasses: the kernel never mutates one in place, it builds
the next version with :func:`dataclasses.replace` inside a commit. JSON-valued
fields hold plain ``dict``/``list`` values that are treated as immutable too.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

JSON = Any


TASK_ID = "task"
SUBMISSION_ID = "sub"
"""The prefixes of task and submission ids: an id alone says what it names (an operations
log entry's target is either)."""


def new_id(prefix: str) -> str:
    """A fresh, never-reused id, sortable by creation time (invariant 4)."""
    return f"{prefix}_{time.time_ns():x}{os.urandom(6).hex()}"


def id_kind(record_id: str) -> str:
    """The prefix :func:`new_id` gave ``record_id``: :data:`TASK_ID`, :data:`SUBMISSION_ID`..."""
    return record_id.partition("_")[0]


class Status(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    WAITING = "waiting"
    SLEEPING = "sleeping"
    COMPLETING = "completing"
    TERMINAL = "terminal"


class Outcome(StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    FAULTED = "faulted"


SHOWN_STATUSES: tuple[str, ...] = tuple(
    [str(s) for s in Status if s is not Status.TERMINAL] + [str(o) for o in Outcome]
)
"""Every :attr:`Task.shown_status`, in lifecycle order: the statuses a task passes
through, then the outcomes it may end with in place of ``terminal``."""


class JoinPolicy(StrEnum):
    ALL_SETTLED = "all_settled"
    FAIL_FAST = "fail_fast"


class SubmissionStatus(StrEnum):
    QUEUED = "queued"
    PLACED = "placed"
    ANSWERED = "answered"
    UNANSWERED = "unanswered"  # the model could not answer (its reason says why)
    CANCELLED = "cancelled"  # its turn was cancelled by an operator
    FAILED = "failed"  # its turn failed: a phase raised, hit the restart limit, faulted

    @property
    def settled(self) -> bool:
        """No turn holds it any more: it changes no further."""
        return self in SETTLED_SUBMISSIONS


SETTLED_SUBMISSIONS = frozenset(
    {
        SubmissionStatus.ANSWERED,
        SubmissionStatus.UNANSWERED,
        SubmissionStatus.CANCELLED,
        SubmissionStatus.FAILED,
    }
)


@dataclass(frozen=True, slots=True)
class SessionRecord:
    id: str
    head_seq: int
    created_at: datetime
    metadata: JSON = field(default_factory=dict)
    pruned_seq: int = 0
    """Commits up to this seq may have been removed by retention (kernel.retention);
    everything after it is in the log. 0: nothing was ever removed."""
    last_commit_at: datetime | None = None
    """When its last commit was made (None: never): what dates it for retention, kept
    on the session because a trim may remove that commit's row."""


@dataclass(frozen=True, slots=True)
class Conversation:
    id: str
    session_id: str
    created_seq: int
    fork_of: str | None = None
    fork_entry_id: str | None = None


@dataclass(frozen=True, slots=True)
class Entry:
    """An immutable transcript record; ``(seq, ordinal)`` orders it within its session."""

    id: str
    session_id: str
    conversation_id: str
    seq: int
    ordinal: int
    kind: str
    payload: JSON
    actor: str
    created_at: datetime


SUMMARY = "summary"
"""The kind of entry that stands for the entries of its conversation up to one it names:
``payload["covers"]`` holds ``first`` and ``last``, each ``{"id", "seq", "ordinal"}``
of an entry. A model's context is the latest summary and the entries after what it
covers (:meth:`kernel.storage.Storage.context_entries`), never the whole history."""

Position = tuple[int, int]
"""Where an entry stands in its session: ``(seq, ordinal)``, the order of entries."""

LAST_POSITION: Position = (2**62, 0)
"""After every entry: a range that ends here is not bounded above."""


def position(entry: Entry) -> Position:
    return (entry.seq, entry.ordinal)


def covered_last(summary: Entry) -> Position:
    """The position of the last entry a summary entry covers."""
    last = summary.payload["covers"]["last"]
    return (int(last["seq"]), int(last["ordinal"]))


@dataclass(frozen=True, slots=True)
class DocumentHead:
    """Where a document stands; its value lives in its versions (ops + baselines)."""

    id: str
    session_id: str
    kind: str
    key: str
    kind_version: int
    version: int
    baseline_version: int
    ops_bytes_since_baseline: int
    baseline_bytes: int
    updated_seq: int


@dataclass(frozen=True, slots=True)
class DocumentVersion:
    """One step of a document: the ops that made it, and a full value now and then."""

    document_id: str
    version: int
    seq: int
    ops: list[JSON]
    baseline: JSON | None = None
    has_baseline: bool = False


@dataclass(frozen=True, slots=True)
class Task:
    id: str
    session_id: str
    kind: str
    version: int
    input: JSON
    status: Status
    phase: str
    checkpoint: JSON
    created_seq: int
    updated_seq: int
    parent_id: str | None = None
    owned: bool = False
    wait: JSON | None = None
    wake_at: datetime | None = None
    signals: JSON = field(default_factory=dict)
    cancel: JSON | None = None
    outcome: JSON | None = None
    restarts: int = 0
    epoch: int = 0
    lease_owner: str | None = None
    lease_until: datetime | None = None
    queue: str = "default"
    trace: JSON | None = None
    """The trace context it was created in (W3C ``traceparent``; :mod:`kernel.tracing`):
    its phases' spans are children of it, on whichever worker. Never changes."""
    run: int = 0
    """Which run of the task this is: 0 as created, one more each time an operator starts
    it again (a retry, a restart from a phase). Its own commits, claims and recoveries
    keep it: a cancel names the run the operator saw (:meth:`kernel.commit.Draft.cancel`)."""

    @property
    def terminal(self) -> bool:
        return self.status is Status.TERMINAL

    @property
    def wait_deps(self) -> list[str]:
        return list(self.wait.get("deps", [])) if self.wait else []

    def waits_on_task(self, task_id: str) -> bool:
        """Whether it waits for ``task_id`` to end (in O(1) for a large join: see
        :func:`dep_set`)."""
        return self.status is Status.WAITING and task_id in dep_set(self)

    @property
    def shown_status(self) -> str:
        """Its status, or once terminal its outcome's kind (one of :data:`SHOWN_STATUSES`)."""
        if self.status == Status.TERMINAL:
            return str((self.outcome or {}).get("kind", Status.TERMINAL))
        return str(self.status)

    @property
    def waits_on(self) -> WaitsOn:
        """What it waits on now (:class:`WaitsOn`; ``kind`` None when nothing)."""
        return WaitsOn.of(self)

    def runnable_at(self, now: datetime) -> bool:
        """Whether a worker may claim it now: the claim statement's predicate, in Python."""
        if self.status is Status.PENDING:
            return True
        if self.status is Status.SLEEPING:
            return self.wake_at is not None and self.wake_at <= now
        if self.status is Status.RUNNING:
            return self.lease_until is not None and self.lease_until < now
        return False


_DEP_SETS: dict[int, tuple[JSON, frozenset[str]]] = {}
_DEP_SETS_LOCK = threading.Lock()
DEP_SET_MIN = 64
"""Joins over at least this many tasks have their set of dependencies remembered."""


def dep_set(task: Task) -> frozenset[str]:
    """The ids ``task`` waits for (empty when it waits for none), as a set.

    A join over n tasks is looked at each time one of them ends; building the set each
    time would make every ending O(n) (a batch of n emails, O(n*n)). The set
    of a large join is remembered by the identity of the record's ``wait`` value, which
    is never changed in place (records are immutable), for as long as storage hands out
    the same record (the in-memory storage always, Postgres while the row is unchanged).
    """
    wait = task.wait
    deps = wait.get("deps") if isinstance(wait, dict) else None
    if not deps:
        return frozenset()
    if len(deps) < DEP_SET_MIN:
        return frozenset(deps)
    key = id(wait)
    with _DEP_SETS_LOCK:
        known = _DEP_SETS.get(key)
        if known is not None and known[0] is wait:
            return known[1]
    found = frozenset(deps)
    with _DEP_SETS_LOCK:
        if len(_DEP_SETS) >= 32:
            _DEP_SETS.clear()
        _DEP_SETS[key] = (wait, found)  # holding ``wait`` keeps its id from being reused
    return found


WaitKind = Literal["signal", "tasks", "interrupted_phase", "time"]


@dataclass(frozen=True, slots=True)
class WaitsOn:
    """What a task waits on, derived from its record, never stored.

    ``signal``: a named signal (an operator's answer); ``tasks``: ``count`` tasks to
    settle under ``policy``; ``interrupted_phase``: a cancelled task whose phase was in
    flight sleeps until that phase returns or its lease runs out at ``until`` (see
    :meth:`kernel.commit.Builder._cancel`); ``time``: a sleep until ``until``; None:
    nothing (runnable, running, completing or terminal).
    """

    kind: WaitKind | None = None
    signal: str | None = None
    count: int = 0
    policy: JoinPolicy | None = None
    until: datetime | None = None
    task_ids: tuple[str, ...] = ()

    @classmethod
    def of(cls, task: Task) -> WaitsOn:
        wait = task.wait or {}
        if "signal" in wait:
            return cls("signal", signal=wait["signal"])
        if "deps" in wait:
            deps = tuple(wait["deps"])
            policy = JoinPolicy(wait.get("policy", JoinPolicy.ALL_SETTLED))
            return cls("tasks", count=len(deps), policy=policy, task_ids=deps)
        if task.status == Status.SLEEPING and task.wake_at:
            kind: WaitKind = "interrupted_phase" if task.cancel else "time"
            return cls(kind, until=task.wake_at)
        return cls()

    def describe(self) -> str:
        """One line for people, e.g. "signal resolution (an operator)"; "" for nothing."""
        if self.kind == "signal":
            return f"signal {self.signal} (an operator)"
        if self.kind == "tasks":
            return f"{self.count} tasks ({self.policy})"
        if self.kind == "interrupted_phase" and self.until is not None:
            return f"the interrupted phase to return (at most until {self.until:%H:%M:%S})"
        if self.kind == "time" and self.until is not None:
            return f"until {self.until:%H:%M:%S}"
        return ""


@dataclass(frozen=True)
class Preview:
    """Progress that may be lost - streamed model text, a running tool's output.

    A *deferred commit* (DESIGN §8): pushed to live viewers at once, written only as
    part of the task's next normal commit, and never read for recovery. Listeners must
    show it as a preview (invariant 2): it may never become durable.
    """

    session_id: str
    task_id: str
    kind: str
    key: str
    path: tuple[str, ...]
    value: JSON
    after_seq: int = 0
    """The seq of the task's last commit before it: only a later commit holds its value,
    so a view that shows commits late must not let an earlier one take it away."""


@dataclass(frozen=True, slots=True)
class Submission:
    id: str
    session_id: str
    conversation_id: str
    request_id: str
    input: JSON
    status: SubmissionStatus
    created_seq: int
    updated_seq: int
    answer_entry_id: str | None = None
    reason: str | None = None
    resubmit_of: str | None = None
    resubmits: int = 0
    """How many submissions resubmit it: each resubmission counts itself here, in its own
    commit, so a resubmission from a view older than that commit is refused."""


@dataclass(frozen=True, slots=True)
class Commit:
    """One atomic write set; its row is the change-feed record (DESIGN §9)."""

    session_id: str
    seq: int
    at: datetime
    actor: str
    summary: list[JSON]
    id: int = 0
    key: str | None = None


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Outbox row: "task X is runnable, not before T", delivered after its commit."""

    task_id: str
    session_id: str
    not_before: datetime
    queue: str
    seq: int
    id: int = 0
    delivered_at: datetime | None = None
    attempts: int = 0
    """Deliveries so far; each unclaimed one doubles the wait before the next."""
    blocked: bool = False
    """A worker found the task blocked (no compatible definition): retried at once
    by a worker that starts with one (:meth:`~kernel.dispatch.Dispatcher.resume`)."""
    woken: bool = False
    """A burst row: delivered by a queue message, not by a message of its own; the worker
    of a queue message claims it (:meth:`~kernel.storage.Storage.claim_burst`)."""


UNDISPATCHED = frozenset({Status.RUNNING, Status.WAITING, Status.COMPLETING, Status.TERMINAL})
"""Statuses in which a task keeps no dispatch row: nothing will claim it from there
until a commit makes it runnable again, and that commit writes a row of its own (a
running task whose lease runs out gets one from the sweep)."""


@dataclass(frozen=True, slots=True)
class WriteSet:
    """Everything one commit writes, frozen before storage persists it in one transaction."""

    commit: Commit
    conversations: list[Conversation]
    entries: list[Entry]
    document_heads: list[DocumentHead]
    document_versions: list[DocumentVersion]
    new_tasks: list[Task]
    updated_tasks: list[Task]
    new_submissions: list[Submission]
    updated_submissions: list[Submission]
    dispatches: list[Dispatch]

    def undispatched(self) -> list[str]:
        """The tasks this commit leaves neither runnable nor due to be (running on a
        kept lease, waiting, completing, ended): their dispatch rows go in this commit.
        A row that outlived its task's last run would otherwise stay forever, and a
        window of them would hide a queue's live rows from its burst claims."""
        return [t.id for t in self.updated_tasks if t.status in UNDISPATCHED]
