"""Drafts and the commit builder (DESIGN §5, steps 2-3).

A :class:`Draft` collects what one commit should write. :class:`Builder` turns it
into a frozen :class:`~kernel.records.WriteSet` inside the storage transaction:
it checks fencing tokens, legal transitions, document versions and joins, and
derives the knock-on effects that must be written in the *same* commit - a terminal
task makes its satisfied waiters runnable and finishes its completing owner, a fail-fast
join cancels the remaining siblings, a cancel cascades to owned subtasks.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from datetime import datetime
from enum import StrEnum
from itertools import islice
from typing import Any

from .documents import (
    Open,
    apply_ops,
    check_op,
    copied,
    encoded_size,
    needs_baseline,
    opened,
    replacing,
    weight,
)
from .environment import ENVIRONMENT, offered
from .errors import (
    CommitRejected,
    DocumentConflict,
    IllegalTransition,
    NotRegistered,
    ReservedConversation,
    StaleLease,
    StaleStep,
    UnknownRecord,
    UnstorableValue,
    WaitCycle,
)
from .forks import RESTARTED, PhaseEntry, Restart, no_restart
from .records import (
    SUBMISSION_ID,
    TASK_ID,
    Commit,
    Conversation,
    Dispatch,
    DocumentHead,
    DocumentVersion,
    Entry,
    JoinPolicy,
    Outcome,
    Position,
    Status,
    Submission,
    SubmissionStatus,
    Task,
    WriteSet,
    dep_set,
    new_id,
    position,
)
from .registry import Blocked, Registry
from .storage import CommitReads, JoinState, Prefetch
from .tasks import (
    Finish,
    Next,
    Sleep,
    Transition,
    WaitSignal,
    WaitTasks,
    apply_transition,
    released,
    succeeded,
)
from .tracing import carrier as trace_carrier
from .values import storable, storable_name, storable_text

JSON = Any
ANY_OPEN_FIRST = 64
"""How many of a join's newest tasks an ending asks about first (:meth:`Builder.any_open`)."""

OPERATIONS = "@operations"
"""Stands for the session's operations log in a draft (see :meth:`Draft.record_operation`)."""


def operations_log_id(session_id: str) -> str:
    return f"conv_ops_{session_id}"


def refuse_operations_log(session_id: str, conversation_id: str | None, use: str) -> None:
    """:class:`ReservedConversation` if ``conversation_id`` is the session's operations
    log: ``use`` says what the draft tried (only :meth:`Draft.record_operation` writes it)."""
    if conversation_id == operations_log_id(session_id):
        raise ReservedConversation(
            f"{conversation_id} is the session's operations log: {use} is refused there "
            "(it records operators' actions only)"
        )


class DuplicateCommit(CommitRejected):
    """A commit with this draft's key was already committed; ``existing`` is it."""

    def __init__(self, existing: Commit) -> None:
        super().__init__(f"commit key {existing.key!r} already used by #{existing.seq}")
        self.existing = existing


class DuplicateRequest(CommitRejected):
    """A submission's ``request_id`` was seen before; ``existing`` is the original."""

    def __init__(self, existing: Submission) -> None:
        super().__init__(f"request {existing.request_id!r} was already submitted")
        self.existing = existing


@dataclass
class _NewTask:
    id: str
    kind: str
    input: JSON
    version: int | None
    parent_id: str | None
    owned: bool
    trace: JSON | None = None


@dataclass
class _Fenced:
    task_id: str
    epoch: int
    transition: Transition
    version: int | None = None
    input: JSON = None
    checkpoint: JSON = None
    owner: str | None = None


class CommitKind(StrEnum):
    """The shapes of commit a storage may write in fewer round trips than the general
    one, each by a method of its own (:class:`~kernel.storage.Storage`). Every kind means
    exactly what the general commit of the same draft means: a storage that cannot take
    the short way (the task changed since the caller's copy, say) takes the general one.
    """

    GENERAL = "general"
    """Reads what the draft announced under the session's lock, then writes; the only
    kind of a draft that expects a version of a document it does not write
    (:meth:`Draft.expect_document`) or a conversation's newest entry
    (:meth:`Draft.expect_newest_entry`), which only a read under that lock can check."""
    NEXT_ALONE = "next alone"
    """One phase's ``Next`` that keeps the lease and nothing else: built from the lease
    holder's copy of its task."""
    ENDS_ALONE = "ends alone"
    """One phase's ``Finish`` and nothing else: built from the copy, for a task with no
    owned child and no waiter (otherwise the general commit reads them)."""
    CREATES_ONLY = "creates only"
    """New tasks with no parent and nothing else: reads nothing."""
    DOCUMENTS_ONLY = "documents only"
    """Writes to documents and nothing else, no version expected: reads nothing but each
    document's head, which numbers its next version and says whether it needs a
    baseline (ops are total: :mod:`kernel.documents`)."""
    NEXT_WRITING = "next writing"
    """One phase's ``Next`` that keeps the lease, with entries and document ops and
    nothing else (a step of an agent's run): built from the lease holder's copies of its
    task and of the documents its commits wrote, the conversations it appends to known
    to the storage; a document without a copy (or due a baseline) takes the general one."""


@dataclass
class Draft:
    """What one commit should write. Build it, then hand it to ``SessionHandle.commit``."""

    actor: str = "system"
    key: str | None = None
    """Idempotency key (an operator's action id, say): a second commit with the same key
    in the same session writes nothing and raises :class:`DuplicateCommit`."""
    conversations: list[Conversation] = field(default_factory=list)
    entries: list[tuple[str, str, str, JSON]] = field(default_factory=list)
    document_ops: dict[tuple[str, str], list[JSON]] = field(default_factory=dict)
    expected_versions: dict[tuple[str, str], int] = field(default_factory=dict)
    """The version each document must be at when the commit is built, or it is refused:
    of a document the draft writes (:meth:`update_document`) or only reads
    (:meth:`expect_document`)."""
    document_ids: dict[tuple[str, str], str] = field(default_factory=dict)
    """The id each document written gets if it is new, made with the draft (as a new
    task's is): the same whichever way the commit is built, and however often."""
    new_tasks: list[_NewTask] = field(default_factory=list)
    fenced: list[_Fenced] = field(default_factory=list)
    cancels: list[tuple[str, str, int | None]] = field(default_factory=list)
    signals: list[tuple[str, str, JSON, int | None]] = field(default_factory=list)
    wakes: list[tuple[str, int | None]] = field(default_factory=list)
    returned: list[tuple[str, int]] = field(default_factory=list)
    retries: list[tuple[str, int | None]] = field(default_factory=list)
    restarts: list[Restart] = field(default_factory=list)
    migrations: list[tuple[str, JSON, int]] = field(default_factory=list)
    submissions: list[tuple[str, str, str, JSON, str | None, int | None]] = field(
        default_factory=list)
    submission_updates: list[tuple[str, SubmissionStatus, str | None, str | None, bool]] = field(
        default_factory=list
    )
    newest_entries: list[tuple[str, str | None]] = field(default_factory=list)
    """The entry each conversation's transcript must end with when the commit is built
    (None: it holds none), or it is refused (:meth:`expect_newest_entry`)."""

    def absorb(self, other: Draft) -> None:
        """Add ``other``'s writes after this draft's own: one commit for what would
        otherwise be two in a row (a worker committing several tasks' results at once).
        Refused when they cannot be one: either has an idempotency key (its commit must
        stand alone), or one expects a version of a document the other writes (apart,
        the second would be checked against the first's version), or one expects the
        newest entry of a conversation the other appends to."""
        if self.key is not None or other.key is not None:
            raise CommitRejected("a draft with an idempotency key is a commit of its own")
        for mine, theirs in ((self, other), (other, self)):
            for document in mine.expected_versions:
                if document in theirs.document_ops or document in theirs.expected_versions:
                    raise DocumentConflict(f"both drafts depend on document {document}")
            for conversation, _ in mine.newest_entries:
                if any(named == conversation for _, named, _, _ in theirs.entries):
                    raise DocumentConflict(
                        f"one draft expects the newest entry of {conversation}, which the "
                        "other appends to")
        for document, ops in other.document_ops.items():
            self.document_ops.setdefault(document, []).extend(ops)
        for document, document_id in other.document_ids.items():
            self.document_ids.setdefault(document, document_id)
        self.expected_versions.update(other.expected_versions)
        for name in MERGED_LISTS:
            getattr(self, name).extend(getattr(other, name))

    def prefetch(self) -> Prefetch:
        """The records this draft will make the builder read (see :class:`Prefetch`)."""
        created = {t.id for t in self.new_tasks} | {c.id for c in self.conversations}
        made = {s[0] for s in self.submissions}
        updated = [u[0] for u in self.submission_updates]
        origins = [s[4] for s in self.submissions if s[4]]
        tasks = [f.task_id for f in self.fenced] + [c[0] for c in self.cancels]
        tasks += [s[0] for s in self.signals] + [w[0] for w in self.wakes]
        tasks += [t for t, _ in self.retries]
        tasks += [r.task_id for r in self.restarts] + [m[0] for m in self.migrations]
        tasks += [t for t, _ in self.returned]
        tasks += [t.parent_id for t in self.new_tasks if t.parent_id]
        conversations = [c for _, c, _, _ in self.entries] + [s[1] for s in self.submissions]
        conversations += [c.fork_of for c in self.conversations if c.fork_of]
        conversations += [c for c, _ in self.newest_entries]
        return Prefetch(
            tasks=tuple(dict.fromkeys(t for t in tasks if t not in created)),
            documents=tuple(dict.fromkeys([*self.document_ops, *self.expected_versions])),
            conversations=tuple(
                dict.fromkeys(c for c in conversations if c not in created and c != OPERATIONS)
            ),
            finishing=tuple(f.task_id for f in self.fenced if isinstance(f.transition, Finish)),
            submissions=tuple(dict.fromkeys(i for i in updated + origins if i not in made)),
            newest_entries=tuple(dict.fromkeys(
                c for c, _ in self.newest_entries if c not in created)),
        )

    def kind(self) -> CommitKind:
        """What shape of commit this draft makes (see :class:`CommitKind`): decided here
        once, for every storage."""
        transition = self._lone_transition()
        if isinstance(transition, Next) and transition.keep_lease:
            return CommitKind.NEXT_ALONE
        if isinstance(transition, Finish):
            return CommitKind.ENDS_ALONE
        if self._next_writing():
            return CommitKind.NEXT_WRITING
        if (
            self.new_tasks and self.key is None and not self.document_ops
            and not self.expected_versions
            and all(t.parent_id is None for t in self.new_tasks)
            and not any(getattr(self, name) for name in MERGED_LISTS if name != "new_tasks")
        ):
            return CommitKind.CREATES_ONLY
        if (
            self.document_ops and self.key is None and not self.expected_versions
            and not any(getattr(self, name) for name in MERGED_LISTS)
        ):
            return CommitKind.DOCUMENTS_ONLY
        return CommitKind.GENERAL

    def _next_writing(self) -> bool:
        """Whether this draft is one phase's ``Next`` keeping the lease with entries or
        document ops beside it, and nothing else (no key, no migration, no version expected:
        the one statement checks the heads it writes, not the others a draft may expect)."""
        if len(self.fenced) != 1 or self.key is not None or self.fenced[0].version is not None:
            return False
        if self.expected_versions:
            return False
        if not (self.entries or self.document_ops):
            return False
        if any(getattr(self, name) for name in MERGED_LISTS
               if name not in ("fenced", "entries")):
            return False
        transition = self.fenced[0].transition
        return isinstance(transition, Next) and transition.keep_lease

    def _lone_transition(self) -> Transition | None:
        """The transition of the one phase this draft carries, if it carries nothing
        else (no key, no other write, no version expected, no migration of the task's
        version)."""
        if (len(self.fenced) != 1 or self.key is not None or self.document_ops
                or self.expected_versions):
            return None
        fenced = self.fenced[0]
        if fenced.version is not None:
            return None
        if any(getattr(self, name) for name in MERGED_LISTS if name != "fenced"):
            return None
        return fenced.transition

    def create_conversation(
        self, *, fork_of: str | None = None, fork_entry_id: str | None = None
    ) -> str:
        if (fork_of is None) != (fork_entry_id is None):
            raise CommitRejected("a fork names both the conversation and the entry it forks at")
        conversation_id = new_id("conv")
        self.conversations.append(
            Conversation(conversation_id, "", 0, fork_of=fork_of, fork_entry_id=fork_entry_id)
        )
        return conversation_id

    def append(self, conversation_id: str, kind: str, payload: JSON) -> str:
        storable_text(kind, "entry kind")
        payload = storable(payload, f"entry payload ({kind})")
        entry_id = new_id("entry")
        self.entries.append((entry_id, conversation_id, kind, payload))
        return entry_id

    def record_operation(self, kind: str, payload: JSON) -> str:
        """Append to the session's operations log: who did what to which record, and why.

        The log is a conversation of its own, created with its first entry.
        """
        return self.append(OPERATIONS, kind, payload)

    def update_document(
        self, kind: str, key: str, *ops: JSON, expected_version: int | None = None
    ) -> None:
        storable_name(kind, "document kind")
        storable_name(key, f"document {kind} key")
        stored = [check_op(op, f"document {kind}/{key}") for op in ops]
        self.document_ops.setdefault((kind, key), []).extend(stored)
        if (kind, key) not in self.document_ids:
            self.document_ids[(kind, key)] = new_id("doc")
        if expected_version is not None:
            self.expected_versions[(kind, key)] = expected_version

    def expect_document(self, kind: str, key: str, version: int) -> None:
        """Refuse the commit (:class:`DocumentConflict`) unless document ``kind``/``key``
        is at ``version`` (0: never written) when it is built, under the session's lock;
        the document is not written. What a caller read (a report it acted on, say) is
        then what the commit acts on: a commit that changed it since refuses this one."""
        storable_name(kind, "document kind")
        storable_name(key, f"document {kind} key")
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise CommitRejected(f"document {kind}/{key}: a version is a count, not {version!r}")
        self.expected_versions[(kind, key)] = version

    def expect_newest_entry(self, conversation_id: str, entry_id: str | None) -> None:
        """Refuse the commit (:class:`StaleStep`) unless the newest entry of
        ``conversation_id``'s transcript (its own, or for a fork with none of its own the
        entry it forks at) is ``entry_id`` (None: the transcript holds none) when it is
        built, under the session's lock. What a caller saw of the conversation (the
        entries an operator's compaction will summarize, say) is then what the commit
        acts on: an entry appended since refuses it. Only the general commit checks it
        (:class:`CommitKind`)."""
        storable_name(conversation_id, "conversation id")
        if entry_id is not None:
            storable_name(entry_id, "entry id")
        self.newest_entries.append((conversation_id, entry_id))

    def set(self, kind: str, key: str, path: list[str], value: JSON) -> None:
        self.update_document(kind, key, {"op": "set", "path": path, "value": value})

    def create_task(
        self,
        kind: str,
        input: JSON,
        *,
        version: int | None = None,
        parent_id: str | None = None,
        owned: bool = False,
    ) -> str:
        input = storable(input, f"task input ({kind})")
        task_id = new_id(TASK_ID)
        # The span this is created in (a submission, the phase that spawns it) is the
        # parent of its phases' spans, on whichever worker runs them.
        self.new_tasks.append(
            _NewTask(task_id, kind, input, version, parent_id, owned, trace_carrier()))
        return task_id

    def transition(
        self,
        task_id: str,
        epoch: int,
        transition: Transition,
        *,
        version: int | None = None,
        input: JSON = None,
        checkpoint: JSON = None,
        owner: str | None = None,
    ) -> None:
        """A phase's result, fenced by the epoch the worker claimed with, and by its
        ``owner`` when given (a worker's lease gives it): a claim is not flushed to disk
        by itself (it needs no flush: whatever depends on it is), so a server crash can
        lose one, and the next claim then hands out the same epoch to another owner.

        ``version``/``input``/``checkpoint`` persist a migration done at claim time.
        """
        transition = _storable_transition(task_id, transition)
        self.fenced.append(
            _Fenced(task_id, epoch, transition, version, input, checkpoint, owner)
        )

    def cancel(self, task_id: str, reason: str, *, expected_run: int | None = None) -> None:
        """Cancel ``task_id`` and its owned subtasks. Refused (:class:`IllegalTransition`)
        if, when this commit is built (under the session's lock), the task has ended: a
        caller that saw it running lost the race to its ending, and nothing was cancelled.
        With ``expected_run`` (the task's :attr:`~kernel.records.Task.run` as the caller
        saw it) it is refused (:class:`StaleStep`) once the task was started again since
        (retried, restarted from a phase): that run is not the one the caller meant to
        stop. A task already cancelling is left as it is."""
        self.cancels.append((task_id, storable_text(reason, f"cancel reason of {task_id}") or "",
                             expected_run))

    def signal(
        self, task_id: str, name: str, payload: JSON, *, step_epoch: int | None = None
    ) -> None:
        """Send ``task_id`` the signal ``name``. With ``step_epoch`` it answers one step:
        it is written only if, when this commit is built (under the session's lock), the task
        waits on ``name`` still at that epoch and nobody answered it yet; otherwise the
        commit is refused (:class:`StaleStep`) and writes nothing."""
        storable_text(name, "signal name")
        payload = storable(payload, f"signal {name!r} payload")
        self.signals.append((task_id, name, payload, step_epoch))

    def wake(self, task_id: str, *, expected_seq: int | None = None) -> None:
        """End a sleep early. Refused for a task whose cancel waits for its revoked phase
        (nobody but that phase's worker knows it has stopped calling out), and with
        ``expected_seq`` (:class:`StaleStep`) when the task changed after that commit (it
        woke and slept again, say: not the sleep the caller meant to end)."""
        self.wakes.append((task_id, expected_seq))

    def phase_returned(self, task_id: str, epoch: int) -> None:
        """The worker that held ``epoch`` says its phase has returned: a cancel that
        revoked that lease need not wait for it to run out."""
        self.returned.append((task_id, epoch))

    def retry(self, task_id: str, *, expected_seq: int | None = None) -> None:
        """Run a failed or faulted task again from its last saved phase. With
        ``expected_seq`` (the task's ``updated_seq`` as the caller saw it), refused
        (:class:`StaleStep`) when the task changed since: retried by someone else and
        failed again, its phase would run once more than the caller meant."""
        self.retries.append((task_id, expected_seq))

    def migrate_environment(
        self, task_id: str, environment: JSON, *, expected_seq: int
    ) -> None:
        """Let ``task_id`` continue under ``environment`` (what a worker that found its
        recorded one different offers: :mod:`kernel.environment`), from where it stands.
        Refused (:class:`StaleStep`) when the task changed after ``expected_seq``, and
        (:class:`IllegalTransition`) while it is running."""
        if not isinstance(environment, dict):
            raise CommitRejected("an environment is a JSON object")
        environment = storable(environment, f"task {task_id} environment")
        self.migrations.append((task_id, environment, expected_seq))

    def restart(
        self, task_id: str, entry: PhaseEntry, *, expected_seq: int,
        environment: JSON = None,
    ) -> None:
        """Run ``task_id`` again from the phase it entered at ``entry`` (read from the
        commit log: :func:`kernel.forks.phase_entries`), with the checkpoint it entered
        that phase with. Refused (:class:`StaleStep`) when the task changed after
        ``expected_seq``, and (:class:`IllegalTransition`) while a phase of it may be
        running or winding down (running, completing, cancelling), while subtasks it owns
        are open, or when it is owned by a task that has ended. With ``environment`` it
        runs from there under that environment (:mod:`kernel.environment`), not the one
        it recorded."""
        if entry.task_id != task_id:
            raise CommitRejected(f"entry #{entry.seq} is of task {entry.task_id}, not {task_id}")
        checkpoint = storable(entry.checkpoint, f"task {task_id} checkpoint")
        if environment is not None:
            checkpoint = {**checkpoint, ENVIRONMENT: storable(environment, "environment")}
        self.restarts.append(Restart(task_id, replace(entry, checkpoint=checkpoint),
                                     expected_seq))

    def submit(
        self,
        conversation_id: str,
        request_id: str,
        input: JSON,
        *,
        resubmit_of: str | None = None,
        expected_seq: int | None = None,
    ) -> str:
        """Accept input under the caller's ``request_id``; ``resubmit_of`` links a retry
        of an earlier submission to it, and counts it in that submission's ``resubmits``.
        With ``expected_seq`` (the ``updated_seq`` of the ``resubmit_of`` submission as
        the caller saw it) a submission that changed since (resubmitted by someone else,
        say) refuses the commit (:class:`StaleStep`)."""
        if expected_seq is not None and resubmit_of is None:
            raise CommitRejected("expected_seq names what a resubmission saw of its original")
        storable_name(request_id, "submission request id")
        input = storable(input, "submission input")
        submission_id = new_id(SUBMISSION_ID)
        self.submissions.append(
            (submission_id, conversation_id, request_id, input, resubmit_of, expected_seq))
        return submission_id

    def update_submission(
        self,
        submission_id: str,
        status: SubmissionStatus,
        *,
        answer_entry_id: str | None = None,
        reason: str | None = None,
        unless_settled: bool = False,
    ) -> None:
        """``unless_settled``: a submission already settled when the commit is built
        (answered, failed or cancelled since the caller last saw it) is left as it is;
        otherwise that refuses the commit (:class:`IllegalTransition`)."""
        storable_text(reason, f"submission {submission_id} reason")
        self.submission_updates.append(
            (submission_id, status, answer_entry_id, reason, unless_settled))


def _storable_transition(task_id: str, transition: Transition) -> Transition:
    """``transition`` with its values as a storage holds them (:mod:`kernel.values`)."""
    if isinstance(transition, Finish):
        return replace(
            transition,
            result=storable(transition.result, f"task {task_id} result"),
            error=storable_text(transition.error, f"task {task_id} error"),
        )
    if isinstance(transition, Sleep) and (
        not isinstance(transition.until, datetime) or transition.until.utcoffset() is None
    ):
        # A time without a timezone names no moment: Postgres would read it in its
        # session's time zone, and the reference could not compare it with its clock's.
        raise UnstorableValue(
            f"task {task_id} sleeps until {transition.until!r}, a time without a timezone: "
            "give an aware datetime (Run.now plus a timedelta, or one with tzinfo)")
    if isinstance(transition, WaitSignal):
        storable_text(transition.name, f"task {task_id} signal name")
    if transition.checkpoint is None:
        return transition
    return replace(
        transition, checkpoint=storable(transition.checkpoint, f"task {task_id} checkpoint")
    )


MERGED_LISTS = tuple(
    f.name for f in fields(Draft) if f.name not in ("actor", "key", "document_ops",
                                                    "expected_versions", "document_ids")
)
"""The draft's fields that are lists of writes, in order (what :meth:`Draft.absorb`
concatenates)."""


class Builder:
    """Turns one draft into a write set, inside one storage transaction. ``opener``
    gives what reads back a document's values stored apart, named by its record
    (:mod:`kernel.large_values`): needed only where an op reaches inside one."""

    def __init__(self, tx: CommitReads, draft: Draft, registry: Registry, now: datetime,
                 opener: Callable[[str], Open] | None = None) -> None:
        self.tx = tx
        self.draft = draft
        self.registry = registry
        self.now = now
        self.opener = opener
        self.session_id = tx.session.id
        self.seq = tx.session.head_seq + 1
        self.tasks: dict[str, Task] = {}
        self.seen: dict[str, Task] = {}
        self.created: dict[str, Task] = {}
        self.changed: set[str] = set()
        self.finished: list[str] = []
        self.summary: list[JSON] = []
        self.ran_by: dict[str, tuple[str | None, int]] = {}
        """Tasks whose phase commits here: the lease holder and epoch it came through."""
        self.phases_before: dict[str, str] = {}
        """The phase each task this commit changes was in before it."""
        self.restarted: dict[str, int] = {}
        """Tasks restarted here, with the seq of the phase entry they restart from."""

    # -- task working set ---------------------------------------------------

    def task(self, task_id: str) -> Task:
        if task_id not in self.tasks:
            found = self.tx.tasks([task_id]).get(task_id)
            if found is None or found.session_id != self.session_id:
                raise UnknownRecord(f"no task {task_id} in session {self.session_id}")
            self.tasks[task_id] = found
        return self.tasks[task_id]

    def load(self, ids: list[str]) -> None:
        """Lock and cache the tasks this commit may change, in one read."""
        missing = [i for i in dict.fromkeys(ids) if i not in self.tasks]
        if missing:
            self.tasks.update(self.tx.tasks(missing))
        unknown = [i for i in missing if i not in self.tasks]
        if unknown:
            raise UnknownRecord(f"no task {unknown[0]} in session {self.session_id}")

    def peek(self, ids: list[str]) -> list[Task]:
        """Tasks this commit only looks at (a join's dependencies), in one unlocked read.

        Safe without a lock because only commits make a task terminal, and this
        session's commits are serialized; what this commit changed itself wins.
        """
        missing = [i for i in dict.fromkeys(ids) if i not in self.tasks and i not in self.seen]
        if missing:
            self.seen.update(self.tx.tasks(missing, lock=False))
        found = []
        for task_id in ids:
            task = self.tasks.get(task_id) or self.seen.get(task_id)
            if task is None or task.session_id != self.session_id:
                raise UnknownRecord(f"no task {task_id} in session {self.session_id}")
            found.append(task)
        return found

    def join_state(self, ids: list[str]) -> JoinState:
        """Where a join over ``ids`` stands, in one unlocked read that returns one row.

        A join over n tasks is checked each time one of them ends: reading all n
        would make a batch of n emails read n*n task rows. Unlocked as in :meth:`peek`;
        what this commit changed itself wins.
        """
        local = [t for i in dict.fromkeys(ids) if (t := self.tasks.get(i) or self.seen.get(i))]
        known = {t.id for t in local}
        state = self.tx.join_state([i for i in ids if i not in known])
        failed = next((t.id for t in local if t.terminal and not succeeded(t)), state.failed)
        return JoinState(state.open + sum(not t.terminal for t in local), failed)

    def any_open(self, waiter: Task) -> bool:
        """Whether a task of ``waiter``'s join (one that waits for all) is still open;
        what this commit changed itself wins. The tasks this commit holds are looked at
        first (a few, and with a batch's next intent among them, usually an open one);
        then storage is asked, newest first: tasks are created in order and mostly run
        in order, so the newest is the one most likely still open."""
        deps = dep_set(waiter)
        for task_id in (*self.tasks, *self.seen):
            if task_id in deps:
                task = self.tasks.get(task_id) or self.seen[task_id]
                if not task.terminal:
                    return True
        ids: list[str] = waiter.wait["deps"] if waiter.wait else []
        # In chunks that grow from the newest: while a batch runs, its newest tasks are
        # open and the first chunk answers, so an ending costs the same at 10,000 tasks as
        # at 100 (sending every id each time would make each email O(n)).
        newest_first = (i for i in reversed(ids) if i not in self.tasks and i not in self.seen)
        size = ANY_OPEN_FIRST
        while chunk := list(islice(newest_first, size)):
            if self.tx.any_open(chunk):
                return True
            size *= 4
        return False

    def put(self, task: Task) -> None:
        previous = self.tasks.get(task.id)
        if previous is not None and task.id not in self.created:
            self.phases_before.setdefault(task.id, previous.phase)
        self.tasks[task.id] = task
        self.changed.add(task.id)
        if task.status is Status.TERMINAL and (previous is None or not previous.terminal):
            self.finished.append(task.id)

    def overlay(self, tasks: list[Task]) -> list[Task]:
        return [self.tasks.setdefault(t.id, t) for t in tasks]

    def children(self, task_id: str) -> list[Task]:
        stored = self.overlay(self.tx.children(task_id)) if task_id not in self.created else []
        fresh = [t for t in self.tasks.values() if t.id in self.created]
        kids = {t.id: t for t in stored}
        kids.update({t.id: self.tasks[t.id] for t in fresh if t.parent_id == task_id and t.owned})
        return list(kids.values())

    def waiters(self, task_id: str) -> list[Task]:
        stored = self.overlay(self.tx.waiters(task_id)) if task_id not in self.created else []
        ids = {t.id for t in stored} | {t.id for t in self.tasks.values()}
        return [self.tasks[i] for i in ids if self.tasks[i].waits_on_task(task_id)]

    # -- the build ------------------------------------------------------------

    def build(self) -> WriteSet:
        if self.draft.key is not None:
            storable_name(self.draft.key, "commit key")
            existing = self.tx.commit_by_key(self.draft.key)
            if existing is not None:
                raise DuplicateCommit(existing)
        conversations = self._conversations()
        self._newest_entries(conversations)
        entries = self._entries(conversations)
        heads, versions = self._documents()
        submissions, updated_submissions = self._submissions(conversations)
        for new in self.draft.new_tasks:
            self._create_task(new)
        for fenced in self.draft.fenced:
            self._apply_fenced(fenced)
        for task_id, name, payload, step_epoch in self.draft.signals:
            self._signal(task_id, name, payload, step_epoch)
        for task_id, expected_seq in self.draft.wakes:
            self._wake(task_id, expected_seq)
        for task_id, epoch in self.draft.returned:
            self._phase_returned(task_id, epoch)
        for task_id, expected_seq in self.draft.retries:
            self._retry(task_id, expected_seq)
        for restart in self.draft.restarts:
            self._restart(restart)
        for task_id, environment, expected_seq in self.draft.migrations:
            self._migrate(task_id, environment, expected_seq)
        for task_id, reason, expected_run in self.draft.cancels:
            asked = self.task(task_id)
            if expected_run is not None and asked.run != expected_run:
                raise StaleStep(
                    f"task {task_id} was started again since the run {expected_run} you saw "
                    f"(it is on run {asked.run}, {asked.shown_status}): look again"
                )
            if asked.terminal:
                raise IllegalTransition(
                    f"task {task_id} already ended {(asked.outcome or {}).get('kind')}"
                )
            self._cancel(task_id, reason, self.draft.actor)
        self._settle()
        new_tasks = [self.tasks[i] for i in self.created]
        updated = [self.tasks[i] for i in sorted(self.changed) if i not in self.created]
        for task in [*new_tasks, *updated]:
            item: JSON = {"type": "task", "id": task.id, "kind": task.kind}
            item["status"] = str(task.status)
            item["phase"] = task.phase
            if task.outcome and task.terminal:
                item["outcome"] = task.outcome["kind"]
            item.update(self._what_it_waits_for(task))
            if task.id in self.ran_by:  # the lease this commit came through
                item["holder"], item["epoch"] = self.ran_by[task.id]
            if task.restarts:
                item["restarts"] = task.restarts
            if self._entered(task):  # where it stood as the phase began (kernel.forks)
                item["checkpoint"] = task.checkpoint
                item["version"] = task.version
            if task.id in self.restarted:
                item["restart_of"] = self.restarted[task.id]
            self.summary.append(item)
        dispatches = [
            Dispatch(t.id, self.session_id, t.wake_at or self.now, t.queue, self.seq)
            for t in [*new_tasks, *updated]
            if t.status is Status.PENDING or t.status is Status.SLEEPING
        ]
        commit = Commit(
            self.session_id, self.seq, self.now, self.draft.actor, self.summary, key=self.draft.key
        )
        return WriteSet(
            commit=commit,
            conversations=conversations,
            entries=entries,
            document_heads=heads,
            document_versions=versions,
            new_tasks=new_tasks,
            updated_tasks=updated,
            new_submissions=submissions,
            updated_submissions=updated_submissions,
            dispatches=dispatches,
        )

    # -- conversations and entries ----------------------------------------------

    def _conversations(self) -> list[Conversation]:
        made = []
        for conv in self.draft.conversations:
            refuse_operations_log(self.session_id, conv.fork_of, "a fork")
            if conv.fork_of is not None:
                parent = self.tx.conversation(conv.fork_of)
                entry = self.tx.entry(conv.fork_entry_id or "")
                if parent is None or parent.session_id != self.session_id:
                    raise UnknownRecord(f"no conversation {conv.fork_of} to fork")
                if entry is None or not self._in_transcript(parent, entry):
                    raise UnknownRecord(f"no entry {conv.fork_entry_id} in the transcript "
                                        f"of {conv.fork_of} to fork at")
            made.append(replace(conv, session_id=self.session_id, created_seq=self.seq))
            self.summary.append({"type": "conversation", "id": conv.id})
        return made

    def _in_transcript(self, conversation: Conversation, entry: Entry) -> bool:
        """Whether ``entry`` is in ``conversation``'s transcript: its own, or for a fork
        its origin's up to the fork point (and so on). A fork at any other entry would
        have a transcript (:meth:`kernel.session.Kernel.entries`) and a model's context
        (:meth:`~kernel.session.Kernel.context`) that disagree."""
        bound: Position | None = None
        current: Conversation | None = conversation
        while current is not None and current.session_id == self.session_id:
            if entry.conversation_id == current.id:
                return bound is None or position(entry) <= bound
            point = self.tx.entry(current.fork_entry_id or "")
            if current.fork_of is None or point is None:
                return False
            bound = position(point) if bound is None else min(bound, position(point))
            current = self.tx.conversation(current.fork_of)
        return False

    def _entries(self, conversations: list[Conversation]) -> list[Entry]:
        fresh = {c.id for c in conversations}
        entries = []
        for ordinal, (entry_id, named, kind, payload) in enumerate(self.draft.entries):
            refuse_operations_log(self.session_id, named, f"an entry of kind {kind!r}")
            conversation_id = (
                self._operations_log(conversations, fresh) if named == OPERATIONS else named
            )
            self._require_conversation(conversation_id, fresh)
            entries.append(
                Entry(
                    entry_id,
                    self.session_id,
                    conversation_id,
                    self.seq,
                    ordinal,
                    kind,
                    payload,  # storable's own copy (Draft.append): nothing else holds it
                    self.draft.actor,
                    self.now,
                )
            )
            self.summary.append(
                {"type": "entry", "id": entry_id, "conversation": conversation_id, "kind": kind}
            )
        return entries

    def _newest_entries(self, conversations: list[Conversation]) -> None:
        """Each expected newest entry (:meth:`Draft.expect_newest_entry`), as stored
        before this commit's own entries."""
        fresh = {c.id: c for c in conversations}
        for conversation_id, expected in self.draft.newest_entries:
            conversation = fresh.get(conversation_id)
            if conversation is None:
                conversation = self.tx.conversation(conversation_id)
                if conversation is None or conversation.session_id != self.session_id:
                    raise UnknownRecord(
                        f"no conversation {conversation_id} in session {self.session_id}")
                own = self.tx.newest_entry(conversation_id)
            else:
                own = None
            # A fork with no entry of its own ends where it forks: its origin's later
            # entries are not in its transcript.
            current = own.id if own is not None else conversation.fork_entry_id
            if current != expected:
                raise StaleStep(
                    f"the newest entry of {conversation_id} is {current or 'none'}, "
                    f"not {expected or 'none'}"
                )

    def _operations_log(self, conversations: list[Conversation], fresh: set[str]) -> str:
        log_id = operations_log_id(self.session_id)
        if log_id not in fresh and self.tx.conversation(log_id) is None:
            conversations.append(Conversation(log_id, self.session_id, self.seq))
            fresh.add(log_id)
            self.summary.append({"type": "conversation", "id": log_id})
        return log_id

    def _require_conversation(self, conversation_id: str, fresh: set[str]) -> None:
        if conversation_id in fresh:
            return
        conv = self.tx.conversation(conversation_id)
        if conv is None or conv.session_id != self.session_id:
            raise UnknownRecord(f"no conversation {conversation_id} in session {self.session_id}")

    # -- documents ------------------------------------------------------------------

    def _documents(self) -> tuple[list[DocumentHead], list[DocumentVersion]]:
        heads, versions = [], []
        for (kind_name, key), ops in self.draft.document_ops.items():
            kind = self.registry.document_kind(kind_name)
            head = self.tx.document(kind_name, key)
            expected = self.draft.expected_versions.get((kind_name, key))
            current = head.version if head else 0
            if expected is not None and expected != current:
                raise DocumentConflict(
                    f"document {kind_name}/{key} is at version {current}, draft expected {expected}"
                )
            ops_bytes = encoded_size(ops)
            replaced = replacing(ops)
            open_one = self._open(kind_name, key)
            if head is None:
                value = apply_ops(kind.initial_value(), ops, open_one)
                head = DocumentHead(
                    self.draft.document_ids[(kind_name, key)], self.session_id, kind_name, key,
                    kind.version, 0, 0, 0, 0, 0,
                )
                baseline: JSON = value
            elif replaced is not None:
                # The value is known without a read: storing it lets retention drop what
                # came before (and an emptied document whole: kernel.retention).
                baseline = apply_ops({}, ops[replaced:], open_one)
            elif head.kind_version != kind.version or needs_baseline(
                head.ops_bytes_since_baseline + ops_bytes, head.baseline_bytes
            ):
                stored = replay(self.tx.document_versions(head.id, head.version), open_one)
                if head.kind_version != kind.version and open_one is not None:
                    stored = opened(stored, open_one)  # a migration reads the values
                upgraded = kind.upgrade(head.kind_version, stored)
                # replay's value is its own copy; a migration's may be anything
                baseline = apply_ops(upgraded, ops, open_one, owned=upgraded is stored)
            else:
                baseline = None
            version = head.version + 1
            if baseline is not None:
                size = weight(baseline)
                head = replace(
                    head,
                    version=version,
                    kind_version=kind.version,
                    baseline_version=version,
                    ops_bytes_since_baseline=0,
                    baseline_bytes=size,
                    updated_seq=self.seq,
                )
            else:
                head = replace(
                    head,
                    version=version,
                    ops_bytes_since_baseline=head.ops_bytes_since_baseline + ops_bytes,
                    updated_seq=self.seq,
                )
            heads.append(head)
            versions.append(
                DocumentVersion(
                    head.id,
                    version,
                    self.seq,
                    copied(ops),
                    baseline,
                    has_baseline=baseline is not None,
                )
            )
            self.summary.append(
                {"type": "document", "kind": kind_name, "key": key, "version": version}
            )
        for (kind_name, key), expected in self.draft.expected_versions.items():
            if (kind_name, key) in self.draft.document_ops:
                continue  # written: checked above
            self.registry.document_kind(kind_name)
            head = self.tx.document(kind_name, key)
            current = head.version if head else 0
            if expected != current:
                raise DocumentConflict(
                    f"document {kind_name}/{key} is at version {current}, draft expected {expected}"
                )
        return heads, versions

    def _open(self, kind: str, key: str) -> Open | None:
        return self.opener(f"document {kind}/{key}") if self.opener is not None else None

    # -- submissions ----------------------------------------------------------------

    def _submissions(
        self, conversations: list[Conversation]
    ) -> tuple[list[Submission], list[Submission]]:
        fresh = {c.id for c in conversations}
        created = []
        resubmitted: dict[str, Submission] = {}
        for (submission_id, conversation_id, request_id, payload, origin,
             expected_seq) in self.draft.submissions:
            refuse_operations_log(self.session_id, conversation_id, "a submission")
            existing = self.tx.submission_by_request(request_id)
            if existing is not None:
                raise DuplicateRequest(existing)
            self._require_conversation(conversation_id, fresh)
            if origin:
                resubmitted[origin] = self._resubmitted(
                    origin, resubmitted.get(origin) or self.tx.submission(origin), expected_seq)
            created.append(
                Submission(
                    submission_id,
                    self.session_id,
                    conversation_id,
                    request_id,
                    payload,  # storable's own copy (Draft.submit): nothing else holds it
                    SubmissionStatus.QUEUED,
                    self.seq,
                    self.seq,
                    resubmit_of=origin,
                )
            )
            self.summary.append({"type": "submission", "id": submission_id, "status": "queued"})
        by_id = {s.id: s for s in created} | resubmitted
        for submission_id, status, answer_entry_id, reason, unless_settled in \
                self.draft.submission_updates:
            current = by_id.get(submission_id) or self.tx.submission(submission_id)
            if current is None or current.session_id != self.session_id:
                raise UnknownRecord(f"no submission {submission_id} in session {self.session_id}")
            if current.status.settled:
                if unless_settled:
                    continue
                raise IllegalTransition(f"submission {submission_id} is already {current.status}")
            by_id[submission_id] = replace(
                current,
                status=status,
                answer_entry_id=answer_entry_id,
                reason=reason,
                updated_seq=self.seq,
            )
            self.summary.append({"type": "submission", "id": submission_id, "status": str(status)})
        created_ids = {s.id for s in created}
        return (
            [by_id[s.id] for s in created],
            [s for i, s in by_id.items() if i not in created_ids],
        )

    def _resubmitted(
        self, origin: str, original: Submission | None, expected_seq: int | None
    ) -> Submission:
        """``original`` counting one more resubmission in this commit, if it is still as
        the caller saw it (``expected_seq``, when given)."""
        if original is None or original.session_id != self.session_id:
            raise UnknownRecord(f"no submission {origin} to resubmit in {self.session_id}")
        if expected_seq is not None and original.updated_seq != expected_seq:
            raise StaleStep(
                f"submission {origin} changed at #{original.updated_seq} after the "
                f"#{expected_seq} you saw (it is {original.status}, resubmitted "
                f"{original.resubmits} times): look again"
            )
        self.summary.append({"type": "submission", "id": origin, "status": str(original.status),
                             "resubmits": original.resubmits + 1})
        return replace(original, resubmits=original.resubmits + 1, updated_seq=self.seq)

    # -- tasks --------------------------------------------------------------------------

    def _create_task(self, new: _NewTask) -> None:
        try:
            definition = self.registry.latest(new.kind)
        except NotRegistered as exc:
            raise CommitRejected(str(exc)) from exc
        if new.version is not None and new.version != definition.version:
            raise CommitRejected(
                f"task kind {new.kind!r}: can only create the registered version "
                f"{definition.version}, not {new.version}"
            )
        if new.parent_id is not None and new.parent_id not in self.created:
            self.task(new.parent_id)
        checkpoint = {}
        if definition.needs is not None:  # what it is started under (kernel.environment)
            checkpoint[ENVIRONMENT] = offered(new.kind, definition.version, definition.needs,
                                              new.input, {})
        task = Task(
            id=new.id,
            session_id=self.session_id,
            kind=new.kind,
            version=definition.version,
            input=new.input,  # storable's own copy (Draft.create_task)
            status=Status.PENDING,
            phase=definition.initial,
            checkpoint=checkpoint,
            created_seq=self.seq,
            updated_seq=self.seq,
            parent_id=new.parent_id,
            owned=new.owned and new.parent_id is not None,
            queue=definition.queue,
            trace=new.trace,
        )
        self.created[task.id] = task
        self.put(task)

    def _apply_fenced(self, fenced: _Fenced) -> None:
        task = self.task(fenced.task_id)
        if (
            task.epoch != fenced.epoch
            or task.status is not Status.RUNNING
            or (fenced.owner is not None and task.lease_owner != fenced.owner)
        ):
            raise StaleLease(fenced.task_id, fenced.epoch, task.epoch)
        self.ran_by[task.id] = (task.lease_owner, task.epoch)
        if fenced.version is not None:
            task = replace(
                task, version=fenced.version, input=fenced.input, checkpoint=fenced.checkpoint
            )
        phases = self._phases(task)
        transition = fenced.transition
        updated = apply_transition(task, transition, phases, updated_seq=self.seq)
        if isinstance(transition, WaitTasks):
            self._check_join(updated, transition)
        if isinstance(transition, Finish):
            self._finish(updated)
            return
        self.put(updated)
        self._settle_wait(updated)

    @staticmethod
    def _what_it_waits_for(task: Task) -> JSON:
        """For the commit's summary: the signal, the number of tasks or the time a
        waiting or sleeping task waits for (so a history can say so without the task)."""
        waits = task.waits_on
        if waits.kind == "signal":
            return {"signal": waits.signal}
        if waits.kind == "tasks":
            return {"deps": waits.count}
        if waits.until is not None:
            return {"until": waits.until.isoformat()}
        return {}

    def _phases(self, task: Task) -> frozenset[str]:
        resolved = self.registry.resolve(task)
        if isinstance(resolved, Blocked):
            raise IllegalTransition(f"task {task.id} is blocked: {resolved.reason}")
        return frozenset(resolved.definition.phases)

    def _check_join(self, waiter: Task, join: WaitTasks) -> None:
        if waiter.id in join.deps:
            raise WaitCycle(f"task {waiter.id} cannot wait on itself")
        for dep in self.peek(list(join.deps)):
            if join.policy is JoinPolicy.FAIL_FAST and not (
                dep.owned and dep.parent_id == waiter.id
            ):
                raise IllegalTransition(
                    f"fail_fast joins only tasks the waiter owns; {dep.id} is not owned by "
                    f"{waiter.id}"
                )
        # Walk the wait graph a level at a time: one read per level, not per task.
        seen: set[str] = set()
        level = [d for d in join.deps if d != waiter.id]
        while level:
            seen.update(level)
            following = []
            for current in self.peek(level):
                for next_id in current.wait_deps if current.status is Status.WAITING else []:
                    if next_id == waiter.id:
                        raise WaitCycle(
                            f"task {waiter.id} would wait on itself through {join.deps}"
                        )
                    if next_id not in seen:
                        following.append(next_id)
            level = list(dict.fromkeys(following))

    def _signal(self, task_id: str, name: str, payload: JSON, step_epoch: int | None) -> None:
        task = self.task(task_id)
        if step_epoch is not None:
            waits_on = task.waits_on.signal if task.status is Status.WAITING else None
            if waits_on != name or name in task.signals or task.epoch != step_epoch:
                now = (f"waits on {waits_on} at epoch {task.epoch}" if waits_on
                       else f"is {task.shown_status}")
                raise StaleStep(
                    f"task {task_id} no longer waits on {name} at epoch {step_epoch} (it "
                    f"{now}): answered already, or replaced by a later step"
                )
        if task.terminal:
            raise IllegalTransition(f"task {task_id} is terminal; signal {name!r} is refused")
        if name in task.signals:
            if task.signals[name] == payload:
                return
            raise IllegalTransition(f"task {task_id} already received signal {name!r}")
        task = replace(task, signals={**task.signals, name: copy.deepcopy(payload)})
        task = replace(task, updated_seq=self.seq)
        self.put(task)
        self._settle_wait(task)

    def _wake(self, task_id: str, expected_seq: int | None) -> None:
        task = self.task(task_id)
        if expected_seq is not None and task.updated_seq != expected_seq:
            raise StaleStep(f"task {task_id} changed at #{task.updated_seq} after the "
                            f"#{expected_seq} you saw (it is {task.shown_status}): look again")
        if task.status is not Status.SLEEPING:
            raise IllegalTransition(f"task {task_id} is {task.status}, not sleeping")
        if task.cancel is not None and task.wake_at is not None and task.wake_at > self.now:
            raise IllegalTransition(
                f"task {task_id} is cancelling: its handler runs once the revoked phase can no "
                f"longer call out (at {task.wake_at.isoformat()}, or when that phase returns)"
            )
        self.put(replace(task, status=Status.PENDING, wake_at=None, updated_seq=self.seq))

    def _phase_returned(self, task_id: str, epoch: int) -> None:
        task = self.task(task_id)
        if task.cancel is None or task.status is not Status.SLEEPING or task.epoch != epoch + 1:
            raise IllegalTransition(f"task {task_id} does not wait for the phase of epoch {epoch}")
        self.put(replace(task, status=Status.PENDING, wake_at=None, updated_seq=self.seq))

    def _retry(self, task_id: str, expected_seq: int | None) -> None:
        task = self.task(task_id)
        if expected_seq is not None and task.updated_seq != expected_seq:
            raise StaleStep(f"task {task_id} changed at #{task.updated_seq} after the "
                            f"#{expected_seq} you saw: look again")
        kind = task.outcome.get("kind") if task.terminal and task.outcome else None
        if kind not in (Outcome.FAILED, Outcome.FAULTED):
            raise IllegalTransition(f"task {task_id} did not fail; only failed tasks retry")
        retried = {"outcome": task.outcome, "seq": self.seq, "by": self.draft.actor}
        checkpoint = {
            **task.checkpoint,
            "_retried": [*task.checkpoint.get("_retried", []), retried],
        }
        self.put(
            replace(
                task,
                status=Status.PENDING,
                outcome=None,
                restarts=0,
                run=task.run + 1,
                checkpoint=checkpoint,
                updated_seq=self.seq,
            )
        )

    def _entered(self, task: Task) -> bool:
        """Whether this commit moved ``task`` into its phase (created it, moved it to
        another phase, restarted it), and is not ending it."""
        if task.status in (Status.TERMINAL, Status.COMPLETING):
            return False
        if task.id in self.created or task.id in self.restarted:
            return True
        return self.phases_before.get(task.id, task.phase) != task.phase

    def _migrate(self, task_id: str, environment: JSON, expected_seq: int) -> None:
        task = self.task(task_id)
        if task.updated_seq != expected_seq:
            raise StaleStep(f"task {task_id} changed at #{task.updated_seq} after the "
                            f"#{expected_seq} you saw: look again")
        if task.terminal or task.status is Status.RUNNING:
            raise IllegalTransition(f"task {task_id} is {task.shown_status}: only a task "
                                    "waiting to run again is migrated")
        checkpoint = {**task.checkpoint, ENVIRONMENT: environment}
        self.put(replace(task, checkpoint=checkpoint, updated_seq=self.seq))

    def _restart(self, restart: Restart) -> None:
        task = self.task(restart.task_id)
        entry = restart.entry
        if task.updated_seq != restart.expected_seq:
            raise StaleStep(
                f"task {task.id} changed at #{task.updated_seq} after the #"
                f"{restart.expected_seq} you saw: look again"
            )
        if task.status in (Status.RUNNING, Status.COMPLETING) or (
            task.cancel is not None and not task.terminal
        ):
            state = "cancelling" if task.cancel is not None else str(task.status)
            raise IllegalTransition(
                f"task {task.id} is {state}: a phase of it may be running; cancel it and "
                "wait for it to end first"
            )
        open_children = [c.id for c in self.children(task.id) if not c.terminal]
        if open_children:
            raise IllegalTransition(
                f"task {task.id} owns subtasks still open ({', '.join(open_children[:3])}): "
                "cancel it and wait for them to end first"
            )
        if task.owned and task.parent_id is not None:
            owner = self.task(task.parent_id)
            if owner.terminal or owner.status is Status.COMPLETING or owner.cancel is not None:
                raise IllegalTransition(
                    f"task {task.id} is owned by {owner.id}, which has ended or is ending: "
                    "start its owner again instead"
                )
        if entry.version is not None and entry.version != task.version:
            raise IllegalTransition(
                f"task {task.id} entered {entry.phase!r} at #{entry.seq} as version "
                f"{entry.version}; it is version {task.version} now"
            )
        record = {"from_seq": entry.seq, "phase": entry.phase, "seq": self.seq,
                  "by": self.draft.actor, "was": task.shown_status}
        checkpoint = dict(entry.checkpoint) if isinstance(entry.checkpoint, dict) else {}
        checkpoint[RESTARTED] = [*task.checkpoint.get(RESTARTED, []), record]
        candidate = replace(task, phase=entry.phase, checkpoint=checkpoint)
        resolved = self.registry.resolve(candidate)
        if isinstance(resolved, Blocked):
            raise IllegalTransition(f"task {task.id} is blocked: {resolved.reason}")
        refused = no_restart(task, resolved.definition)
        if refused is not None:
            raise IllegalTransition(refused)
        if entry.phase not in resolved.definition.phases:
            raise IllegalTransition(
                f"task {task.id} ({task.kind}) has no phase {entry.phase!r} any more"
            )
        # Signals it received are dropped: a phase that runs again waits for its answer
        # again (an approval given to the old run must not let the new one through).
        self.put(
            released(
                candidate,
                status=Status.PENDING,
                outcome=None,
                cancel=None,
                wait=None,
                wake_at=None,
                signals={},
                restarts=0,
                run=task.run + 1,
                epoch=task.epoch + 1,
                updated_seq=self.seq,
            )
        )
        self.restarted[task.id] = entry.seq

    def _cancel(self, task_id: str, reason: str, actor: str) -> None:
        """Record the intent and revoke the lease of ``task_id`` and its owned subtasks.

        A task already cancelling or terminal is left as it is, so cancel is idempotent.
        """
        task = self.task(task_id)
        if task.terminal or task.cancel is not None:
            return
        intent = {"by": actor, "reason": reason, "seq": self.seq}
        if task.status is Status.COMPLETING:
            updated = replace(task, cancel=intent, updated_seq=self.seq)
        else:
            # A running phase may be inside an external call right now. Its commits are
            # refused from here on, but the cancel handler must see what that call did,
            # so it waits until the phase has returned (its worker then wakes the task,
            # see Worker) or, if that worker died, until the revoked lease would have run out.
            in_flight = (
                task.status is Status.RUNNING
                and task.lease_until is not None
                and task.lease_until > self.now
            )
            if in_flight:
                # Its handler may still need this bound: a phase that returned early (its
                # worker wakes the task) may have left a call the provider takes later.
                assert task.lease_until is not None
                intent["revoked_until"] = task.lease_until.isoformat()
            updated = released(
                task,
                status=Status.SLEEPING if in_flight else Status.PENDING,
                cancel=intent,
                epoch=task.epoch + 1,
                wait=None,
                wake_at=task.lease_until if in_flight else None,
                updated_seq=self.seq,
            )
        self.put(updated)
        for child in self.children(task_id):
            self._cancel(child.id, f"owner {task_id} cancelled", actor)

    def _finish(self, task: Task) -> None:
        """Terminal now, or completing while owned subtasks wind down (they are cancelled)."""
        running_children = [c for c in self.children(task.id) if not c.terminal]
        if running_children:
            self.put(replace(task, status=Status.COMPLETING))
            for child in running_children:
                self._cancel(child.id, f"owner {task.id} finished", "kernel")
        else:
            self.put(replace(task, status=Status.TERMINAL))

    def _settle_wait(self, task: Task) -> None:
        """A waiter whose condition already holds becomes runnable in this commit."""
        if task.status is not Status.WAITING or task.wait is None:
            return
        if "signal" in task.wait:
            satisfied = task.wait["signal"] in task.signals
        else:
            if task.wait.get("policy") != JoinPolicy.FAIL_FAST:
                satisfied = not self.any_open(task)
            else:
                join = self.join_state(task.wait_deps)
                if join.failed is not None:
                    self.load(task.wait_deps)  # about to change them: now they must be locked
                    for dep in task.wait_deps:
                        self._cancel(
                            dep, f"fail_fast: sibling {join.failed} did not succeed", "kernel"
                        )
                    join = self.join_state(task.wait_deps)
                satisfied = join.open == 0
        if satisfied:
            self.put(replace(task, status=Status.PENDING, wait=None, updated_seq=self.seq))

    def _settle(self) -> None:
        """Propagate every task that became terminal in this commit, to a fixpoint."""
        done = 0
        while done < len(self.finished):
            task = self.tasks[self.finished[done]]
            done += 1
            for waiter in self.waiters(task.id):
                self._settle_wait(waiter)
            if task.owned and task.parent_id is not None:
                owner = self.task(task.parent_id)
                if owner.status is Status.COMPLETING and all(
                    c.terminal for c in self.children(owner.id)
                ):
                    self.put(replace(owner, status=Status.TERMINAL, updated_seq=self.seq))


def replay(versions: list[DocumentVersion], open_one: Open | None = None) -> JSON:
    """Rebuild a document value from its newest baseline and the ops after it; the
    stand-ins of values stored apart stay in it (:func:`kernel.large_values.opened` puts
    them back), ``open_one`` reads one an op reaches inside."""
    if not versions or not versions[0].has_baseline:
        raise DocumentConflict("document history has no baseline to replay from")
    value = versions[0].baseline
    return apply_ops(value, [op for v in versions[1:] for op in v.ops], open_one)
