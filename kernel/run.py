"""What a phase handler sees: committed state to read, a draft to add to, and the
transitions it may end with (DESIGN §12).

A handler reads its input, checkpoint, documents and the outcomes of tasks it
waited on; it may do external work; it returns the next durable state. Writes it
makes along the way (entries, document ops, new subtasks) are written in the same commit
as that state - or earlier, at an explicit ``run.commit(...)`` (an intent commit,
made before an external call so that recovery knows the call may have happened).

A :class:`Run` reads and writes through its :class:`Lease`: the claim a worker holds
on the task (its epoch, its pending draft and previews). The worker makes leases;
they live here, below it, because a run is made of one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Protocol

from .artifacts import offload
from .commit import CommitKind, Draft
from .errors import SessionPoisoned, UnknownRecord
from .forks import operation_id
from .records import (
    DocumentHead,
    Entry,
    JoinPolicy,
    Outcome,
    Position,
    Preview,
    Submission,
    Task,
    WriteSet,
)
from .registry import TaskDefinition
from .session import Kernel, SessionHandle
from .tasks import Finish, Next, Sleep, Transition, WaitSignal, WaitTasks

JSON = Any


@dataclass
class Carried:
    """Other tasks' endings that a lease's next commit carries (one commit instead of
    several in a row), and what to do once that commit was made or was not."""

    draft: Draft
    settle: Callable[[bool], None]


class Carrier(Protocol):
    """Gives a lease's next commit the endings held back for its session
    (:class:`~kernel.endings.HeldEndings`)."""

    def carry(self, session_id: str) -> Carried | None: ...


@dataclass
class Lease:
    """A claimed task, held by one worker at one epoch."""

    kernel: Kernel
    handles: Callable[[str], SessionHandle]
    """A handle on a session that is not poisoned: the worker's, reopened after an
    uncertain commit (which poisons only what that commit carried)."""
    owner: str
    duration: timedelta
    task: Task
    definition: TaskDefinition
    input: JSON
    checkpoint: JSON
    migrated: bool
    carrier: Carrier | None = None
    """Other tasks' endings that the worker holds back, to commit with this lease's next
    commit (see ``Worker.advance_queue``)."""
    draft: Draft = field(init=False)
    # Deferred document writes (previews): folded into the next commit, lost with the process.
    previews: dict[tuple[str, str, tuple[str, ...]], JSON] = field(default_factory=dict)
    documents: dict[tuple[str, str], DocumentHead | None] = field(default_factory=dict)
    """The heads of the documents this lease's commits wrote, as they left them, or as
    it read them before its first write to them (``None``: not yet written): what a
    phase's commit that writes them is built from (``CommitKind.NEXT_WRITING``; a head
    another commit moved or created since is read again)."""

    def __post_init__(self) -> None:
        self.draft = Draft(actor=f"task:{self.task.id}")
        self.key = (self.task.id, self.task.epoch)
        """What the worker holds this lease by: a later claim of the task is another."""
        self._spawned_owned = False
        self._renewing = threading.Lock()

    @property
    def handle(self) -> SessionHandle:
        return self.handles(self.task.session_id)

    def spawned_owned(self) -> bool:
        """Whether this lease committed, or its pending draft holds, an owned child."""
        return self._spawned_owned or any(t.owned for t in self.draft.new_tasks)

    def commit(self, transition: Transition) -> WriteSet:
        """Commit the pending writes and ``transition``, fenced by this lease's epoch."""
        draft, self.draft = self.draft, Draft(actor=f"task:{self.task.id}")
        self.add_transition(draft, transition)
        self.previews.clear()
        # A phase that returned and only continues its task inline is committed alone, in
        # one round trip from the lease's copy of the task (CommitKind): the endings
        # held back wait for their batch (Worker.advance_queue) rather than make it a
        # commit of two. An intent commit still carries them: an external call follows.
        intent = isinstance(transition, Next) and transition.intent
        kind = draft.kind()
        alone = kind is CommitKind.NEXT_ALONE and not intent
        carried = None if self.carrier is None or alone else self.carrier.carry(
            self.task.session_id)
        if not carried and kind is CommitKind.NEXT_WRITING:
            self._copy_heads(draft)
        written = (
            self._commit_carrying(carried, draft)
            if carried
            else self.handle.commit(draft, known=self.task, documents=self.documents)
        )
        for head in written.document_heads:
            self.documents[(head.kind, head.key)] = head
        self._spawned_owned = self._spawned_owned or any(t.owned for t in draft.new_tasks)
        self.migrated = False
        with self._renewing:
            self.task = next(t for t in written.updated_tasks if t.id == self.task.id)
        self.checkpoint = self.task.checkpoint
        return written

    def _copy_heads(self, draft: Draft) -> None:
        """Read the heads of the documents ``draft`` writes that this lease has no copy
        of: one read each, once per lease, so that the commit is built from copies (one
        statement) rather than read under the session's lock (two round trips). A head
        that moves, or a document that another commit creates, before the commit only
        sends it the general way."""
        for name in draft.document_ops:
            if name not in self.documents:
                self.documents[name] = self.kernel.storage.document_head(
                    self.task.session_id, *name)

    def _commit_carrying(self, carried: Carried, draft: Draft) -> WriteSet:
        """Commit ``draft`` with the carried endings before it, in one commit; if that
        fails in any way, the endings are committed on their own and ``draft`` alone, as
        if they had never met (an outcome unknown stops this lease: its own state is
        unknown, while the endings are fenced by their epochs)."""
        try:
            joint = Draft(actor=draft.actor)
            joint.absorb(carried.draft)
            joint.absorb(draft)
            written = self.handle.commit(joint)
        except Exception as exc:
            carried.settle(False)
            if isinstance(exc, SessionPoisoned):
                raise
            return self.handle.commit(draft)
        carried.settle(True)
        return written

    def add_transition(self, draft: Draft, transition: Transition) -> Draft:
        """Add to ``draft`` what committing ``transition`` through this lease writes
        besides the phase's own writes: the previews, and the transition fenced by this
        lease's epoch (with a migration done at claim time). The lease is left as it is."""
        for (kind, key, path), value in self.previews.items():
            draft.set(kind, key, list(path), value)
        if isinstance(transition, Next) and transition.keep_lease:
            transition = replace(transition, lease_until=self.kernel.clock.now() + self.duration)
        if self.migrated:
            draft.transition(
                self.task.id,
                self.task.epoch,
                transition,
                version=self.definition.version,
                input=self.input,
                checkpoint=self.checkpoint,
                owner=self.owner,
            )
        else:
            draft.transition(self.task.id, self.task.epoch, transition, owner=self.owner)
        return draft

    def renew(self) -> bool:
        """Extend the lease (from the heartbeat's thread or the phase's own). A renewal
        never moves the lease's end backwards, nor replaces a newer copy of the task
        that a commit made meanwhile: only the end is updated, and only if later."""
        until = self.kernel.clock.now() + self.duration
        renewed = self.kernel.storage.renew(self.task.id, self.owner, self.key[1], until)
        if renewed:
            with self._renewing:
                current = self.task
                if current.lease_until is None or current.lease_until < until:
                    self.task = replace(current, lease_until=until)
        return renewed


class Run:
    def __init__(self, lease: Lease) -> None:
        self._lease = lease

    @property
    def draft(self) -> Draft:
        """Writes waiting for this phase's next commit."""
        return self._lease.draft

    # -- committed state ---------------------------------------------------

    @property
    def task(self) -> Task:
        return self._lease.task

    @property
    def task_id(self) -> str:
        return self._lease.task.id

    @property
    def session_id(self) -> str:
        return self._lease.task.session_id

    @property
    def phase(self) -> str:
        return self._lease.task.phase

    @property
    def input(self) -> JSON:
        return self._lease.input

    @property
    def checkpoint(self) -> JSON:
        return self._lease.checkpoint

    @property
    def restarts(self) -> int:
        """How often this phase was re-entered after an interrupted run."""
        return self._lease.task.restarts

    @property
    def now(self) -> datetime:
        return self._lease.kernel.clock.now()

    def operation_id(self, name: str = "") -> str:
        """The id an external call ``name`` of this task goes out under (the other side
        deduplicates by it): the same each time the phase is re-entered, another one
        once the task was restarted from a phase (:mod:`kernel.forks`), whose calls are
        new calls."""
        return operation_id(self.task_id, self.checkpoint, name)

    def deadline(self, margin: float = 1.0) -> datetime:
        """When an external call started now must have ended, or been refused by the
        other side: the end of the lease as last committed, less ``margin`` seconds.

        A cancel revokes the lease and its handler waits until the revoked lease's end
        (:attr:`revoked_until`), so a call bounded by this deadline - on both sides: the
        client gives up, and the server refuses what it would accept later - cannot reach it
        after the handler has looked. Commit the intent first: it extends the lease.
        """
        now = self.now
        until = self._lease.task.lease_until
        if until is not None and until - timedelta(seconds=margin) <= now:
            # The commit that extended the lease computed its end before it ran, and may
            # have waited past it (on a lock): extend it again, fenced by the epoch, so a
            # live holder's call is not refused for a lease it still holds. A lost lease
            # stays past: the call is refused.
            self._lease.renew()
            until = self._lease.task.lease_until
        return (until or now + self._lease.duration) - timedelta(seconds=margin)

    @property
    def revoked_until(self) -> datetime | None:
        """For a cancel handler: until when the phase the cancel interrupted could still
        be calling out (the end of its revoked lease); None if no phase was running."""
        until = (self.task.cancel or {}).get("revoked_until")
        return datetime.fromisoformat(until) if until else None

    def document(self, kind: str, key: str) -> JSON:
        return self._lease.kernel.document(self.session_id, kind, key)

    def document_version(self, kind: str, key: str) -> int:
        return self._lease.kernel.document_version(self.session_id, kind, key)

    def versioned_document(self, kind: str, key: str) -> tuple[JSON, int]:
        """A document's value and its version from one read (see
        :meth:`Kernel.versioned_document`): use it for a write with ``expected_version``."""
        return self._lease.kernel.versioned_document(self.session_id, kind, key)

    def entries(self, conversation_id: str) -> list[Entry]:
        return self._lease.kernel.entries(conversation_id)

    def entries_after(self, conversation_id: str, after: Position) -> list[Entry]:
        """The conversation's own entries after ``after`` (:meth:`Kernel.entries_after`)."""
        return self._lease.kernel.entries_after(conversation_id, after)

    def store_large(self, value: JSON, threshold: int, what: str) -> JSON:
        """``value``, or a reference to it stored as an artifact when its JSON passes
        ``threshold`` bytes (:func:`kernel.artifacts.offload`): stored completely before
        this returns, so the commit that holds the reference comes after it. A value no
        storage holds is refused naming ``what`` (the record and its field)."""
        store = self._lease.kernel.artifacts
        assert store is not None
        return offload(store, value, threshold, what)

    def context(self, conversation_id: str) -> list[Entry]:
        """The entries a model request is built from (:meth:`Kernel.context`)."""
        return self._lease.kernel.context(conversation_id)

    def submission(self, submission_id: str) -> Submission:
        found = self._lease.kernel.storage.submission(submission_id)
        if found is None:
            raise UnknownRecord(f"no submission {submission_id}")
        return found

    def signal(self, name: str) -> JSON:
        return self.task.signals.get(name)

    def outcomes(self, task_ids: list[str] | None = None) -> dict[str, JSON]:
        """Outcomes of ``task_ids`` (default: the tasks this one last waited on), by id.

        Unfinished tasks map to ``None``.
        """
        ids = task_ids if task_ids is not None else self.checkpoint.get("_joined", [])
        tasks = [self._lease.kernel.task(i) for i in ids]
        return {t.id: t.outcome if t.terminal else None for t in tasks}

    # -- writes that join the next commit ---------------------------------------

    def append(self, conversation_id: str, kind: str, payload: JSON) -> str:
        return self.draft.append(conversation_id, kind, payload)

    def update(self, kind: str, key: str, *ops: JSON, expected_version: int | None = None) -> None:
        self.draft.update_document(kind, key, *ops, expected_version=expected_version)

    def set(self, kind: str, key: str, path: list[str], value: JSON) -> None:
        self._lease.previews.pop((kind, key, tuple(path)), None)  # the durable value wins
        self.draft.set(kind, key, path, value)

    def preview(self, kind: str, key: str, path: list[str], value: JSON) -> None:
        """A deferred write for progress that may be lost (DESIGN §8): viewers see it now;
        it is written with this task's next commit, the latest value per path; a crash
        before that loses it, so recovery never depends on it."""
        self._lease.previews[(kind, key, tuple(path))] = value
        self._lease.kernel.publish_preview(
            Preview(self.task.session_id, self.task_id, kind, key, tuple(path), value,
                    self.task.updated_seq)
        )

    def spawn(self, kind: str, input: JSON, *, owned: bool = True) -> str:
        """Create a subtask in the next commit; owned ones are cancelled with this task."""
        return self.draft.create_task(kind, input, parent_id=self.task_id, owned=owned)

    def commit(self, phase: str | None = None, checkpoint: JSON = None) -> None:
        """Commit now, keeping the lease: from here on, recovery re-enters ``phase``.

        Use it to record an intent before an external call (DESIGN §8).
        """
        self._lease.commit(
            Next(phase or self.phase, self._merge(checkpoint), keep_lease=True, intent=True)
        )

    def heartbeat(self) -> bool:
        """Extend the lease during long external work; False means it was lost."""
        return self._lease.renew()

    # -- transitions to return ---------------------------------------------------

    def next(self, phase: str, checkpoint: JSON = None) -> Transition:
        return Next(phase, self._merge(checkpoint), keep_lease=True)

    def wait_all(
        self,
        task_ids: list[str],
        then: str,
        *,
        policy: JoinPolicy = JoinPolicy.ALL_SETTLED,
        checkpoint: JSON = None,
    ) -> Transition:
        merged = {**self._merge(checkpoint), "_joined": list(task_ids)}
        return WaitTasks(tuple(task_ids), then, policy, merged)

    def wait_for(self, signal: str, then: str | None = None, checkpoint: JSON = None) -> Transition:
        return WaitSignal(signal, then or self.phase, self._merge(checkpoint))

    def sleep(
        self,
        seconds: float | None = None,
        *,
        until: datetime | None = None,
        then: str | None = None,
        checkpoint: JSON = None,
    ) -> Transition:
        if (seconds is None) == (until is None):
            raise ValueError("sleep takes either seconds or until")
        wake = until if until is not None else self.now + timedelta(seconds=seconds or 0)
        return Sleep(wake, then or self.phase, self._merge(checkpoint))

    def succeed(self, result: JSON = None) -> Transition:
        return Finish(Outcome.SUCCEEDED, result)

    def fail(self, error: str, result: JSON = None) -> Transition:
        return Finish(Outcome.FAILED, result, error)

    def _merge(self, checkpoint: JSON) -> JSON:
        return {**self.checkpoint, **(checkpoint or {})}
