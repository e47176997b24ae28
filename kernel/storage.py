"""The Storage protocol: what the kernel needs from a Session Store.

Storage is deliberately dumb. It persists frozen write sets, answers reads, and
runs the two statements where concurrency lives: the commit transaction (which
takes the session's commit order) and the claim (one conditional update that
hands out a lease and bumps the fencing epoch). Every rule about *what* may be
written lives in :mod:`kernel.commit`, so the in-memory implementation and the
Postgres one cannot drift apart in meaning: the conformance suite checks both.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, NamedTuple, Protocol

from .records import (
    LAST_POSITION,
    Commit,
    Conversation,
    Dispatch,
    DocumentHead,
    DocumentVersion,
    Entry,
    Position,
    SessionRecord,
    Submission,
    Task,
    WriteSet,
)
from .retention import Progress, PruneReport, RetentionPolicy, TrimReport, quiet

JSON = Any
FaultHook = Callable[[str], None]
"""Called by storage at named points of a commit (``before_write``, ``after_write``,
``after_commit``); tests raise from it to simulate crashes and storage failures.
A failure at either of the first two writes nothing. Every commit that gets as far as
its build meets both, the ones it refuses too (:func:`refused_at_build`)."""


def refused_at_build(fault: FaultHook) -> None:
    """The points before COMMIT, met by a commit its build refused, just before the
    refusal is raised. A fast path (``CommitKind``) builds from its caller's copy, which
    does not refuse, and only the one statement it sends after both points checks the
    copy: a commit the other paths refuse at build meets them there all the same, so
    every storage meets them at the same commits, and a loss or crash there is what the
    committer sees, whatever the check would have said."""
    fault("before_write")
    fault("after_write")


class JoinState(NamedTuple):
    """Where a join over some tasks stands: how many are still open, and the first one
    found that ended without succeeding (what ``fail_fast`` acts on)."""

    open: int
    failed: str | None


class CommitReads(Protocol):
    """Reads inside a commit transaction that holds the session's commit order.

    Task reads lock the rows they return, so that a concurrent claim cannot slip
    between the fencing check and the write.
    """

    session: SessionRecord

    def tasks(self, ids: Iterable[str], lock: bool = True) -> dict[str, Task]:
        """The tasks with these ids; locked against claims unless ``lock`` is False."""
        ...

    def join_state(self, ids: Sequence[str]) -> JoinState:
        """How many of these tasks are not terminal, and one that ended without
        succeeding, if any; unlocked. All that a join needs to know."""
        ...

    def any_open(self, ids: Sequence[str]) -> bool:
        """Whether one of these tasks is not terminal; unlocked. Looks in the order
        given and stops at the first open one: a join that waits for all asks this each
        time one of its tasks ends, so it names the ones most likely still open first."""
        ...

    def children(self, task_id: str) -> list[Task]: ...

    def waiters(self, task_id: str) -> list[Task]: ...

    def document(self, kind: str, key: str) -> DocumentHead | None: ...

    def document_versions(self, document_id: str, upto: int) -> list[DocumentVersion]: ...

    def conversation(self, conversation_id: str) -> Conversation | None: ...

    def entry(self, entry_id: str) -> Entry | None: ...

    def newest_entry(self, conversation_id: str) -> Entry | None:
        """The conversation's own newest entry (greatest seq and ordinal), if it has one."""
        ...

    def submission(self, submission_id: str) -> Submission | None: ...

    def submission_by_request(self, request_id: str) -> Submission | None: ...

    def commit_by_key(self, key: str) -> Commit | None: ...


Build = Callable[[CommitReads], WriteSet]


@dataclass(frozen=True)
class Prefetch:
    """What a commit's builder will read, as far as its draft tells.

    A storage may fetch it all with the session lock in one round trip; the
    in-memory one has nothing to gain and ignores it. Reads not foreseen here
    still work, one query at a time.
    """

    tasks: tuple[str, ...] = ()
    documents: tuple[tuple[str, str], ...] = ()
    conversations: tuple[str, ...] = ()
    finishing: tuple[str, ...] = ()
    """Tasks that end in this commit: their owned children and waiters will be read."""
    submissions: tuple[str, ...] = ()
    """Submissions the commit updates, or resubmits from."""
    newest_entries: tuple[str, ...] = ()
    """Conversations whose newest entry the commit expects (:meth:`CommitReads.newest_entry`)."""


NO_PREFETCH = Prefetch()

CLAIM_WINDOW = 64
"""How many of a queue's oldest due burst rows one burst claim looks at
(:meth:`Storage.claim_burst`): a claim's cost must not grow with the backlog. Both
storages look at this many, so that what a claim finds is the same on each."""

DOUBLINGS = 5
"""A dispatch row unclaimed after its delivery is sent again after ``redeliver_after``,
then after twice that, ... up to 2**DOUBLINGS times it (16 minutes at 30 s)."""


def redelivery_wait(redeliver_after: timedelta, attempts: int) -> timedelta:
    """How long a row delivered ``attempts`` times waits, unclaimed, before the next send."""
    doublings: int = min(max(attempts - 1, 0), DOUBLINGS)
    return redeliver_after * (1 << doublings)


def emptied(head: DocumentHead, newest: DocumentVersion | None) -> bool:
    """Whether a document was emptied: its current version (``newest``) is a baseline
    holding ``{}`` (a commit that replaced its whole value with it). What
    :meth:`Storage.trim` may forget and :meth:`Storage.newest_document` passes over."""
    return (
        newest is not None and head.baseline_version == head.version == newest.version
        and newest.has_baseline and newest.baseline == {}
    )


def as_stored(version: DocumentVersion) -> DocumentVersion:
    """``version`` as every storage keeps it. The version that starts a document keeps its
    value once, as its baseline, not also as the ops that made it from the kind's initial
    value: a replay starts from a baseline and applies only the ops of the versions after
    it, so those ops would never be read. (A document made whole by one ``set`` would
    otherwise be stored twice.) The one-statement document commits store the same in SQL
    (``controlplane.storage.statements.DOCUMENTS_COMMIT``)."""
    if version.version == 1 and version.has_baseline and version.ops:
        return replace(version, ops=[])
    return version


def expiry(task: Task, now: datetime) -> datetime:
    """When a running task's lease ran out (``now`` if it has none): its recovery's due time."""
    return task.lease_until or now


class Storage(Protocol):
    # -- sessions and commits ---------------------------------------------

    def create_session(self, session: SessionRecord) -> None: ...

    def session(self, session_id: str) -> SessionRecord | None: ...

    def commit(self, session_id: str, build: Build, prefetch: Prefetch = NO_PREFETCH) -> WriteSet:
        """Run ``build`` inside one transaction holding the session's commit order and
        persist the write set it returns, atomically.

        Raises what ``build`` raises (nothing written), or
        :class:`~kernel.errors.CommitUncertain` when it cannot tell whether the
        transaction committed. Returns the write set with storage-assigned ids.
        """
        ...

    # The named kinds of commit (kernel.commit.CommitKind): each means exactly what
    # ``commit`` means for the same draft. A storage may write one in fewer round trips;
    # when it cannot (the build wants a read, the task moved since ``known``), it
    # commits the general way. ``known``: the caller's copy of the task whose lease it
    # holds, as its last commit or claim left it.

    def commit_next_alone(
        self, session_id: str, build: Build, prefetch: Prefetch, known: Task
    ) -> WriteSet:
        """A phase's ``Next`` that keeps the lease, and nothing else."""
        ...

    def commit_ending(
        self, session_id: str, build: Build, prefetch: Prefetch, known: Task
    ) -> WriteSet:
        """A phase's ``Finish``, and nothing else."""
        ...

    def commit_creating(self, session_id: str, build: Build, prefetch: Prefetch) -> WriteSet:
        """New tasks with no parent, and nothing else."""
        ...

    def commit_documents(self, session_id: str, build: Build, prefetch: Prefetch) -> WriteSet:
        """Writes to documents with no version expected, and nothing else."""
        ...

    def commit_next_writing(
        self, session_id: str, build: Build, prefetch: Prefetch, known: Task,
        documents: Mapping[tuple[str, str], DocumentHead | None],
    ) -> WriteSet:
        """A phase's ``Next`` that keeps the lease, with entries and document ops.
        ``documents``: the caller's copies of document heads, by kind and key, as its
        lease's commits left them or it read them (``None``: not yet written)."""
        ...

    def commits_after(self, session_id: str, after_seq: int, limit: int) -> list[Commit]:
        """The session's commits after ``after_seq`` that are still in the log, in seq
        order: when ``after_seq`` is below the session's ``pruned_seq``, the first one
        returned is ``pruned_seq + 1`` (or none if the whole log was pruned). Rows kept
        at or below ``pruned_seq`` (keyed ones, by :meth:`trim`) are never returned."""
        ...

    def prune(
        self, policy: RetentionPolicy, now: datetime, *, dry_run: bool = False,
        progress: Progress = quiet,
    ) -> PruneReport:
        """Remove the history of every finished session that ``policy`` says is due at
        ``now`` (:mod:`kernel.retention`), and set its ``pruned_seq`` to its head; a
        session's marker and removals are written in one transaction, so a reader sees all of
        its history or the marker and none of it (a session that committed since it was
        found due is left alone).
        ``dry_run`` counts what would go and changes nothing."""
        ...

    def trim(
        self, session_id: str, upto_seq: int, forget: Mapping[str, int] | None = None
    ) -> TrimReport:
        """Remove a live (or any) session's history up to ``upto_seq`` (at most its head)
        as :mod:`kernel.retention` says: unkeyed commit rows at or below it, document
        versions before each document's newest baseline at or before it, and the
        documents of the kinds in ``forget`` (kind -> its registered version) whose
        current version, at that kind version, is a baseline holding ``{}`` written at
        or before it. ``pruned_seq`` becomes ``upto_seq`` if that is higher. It holds
        the session's commit order meanwhile, so no commit is made halfway through it.
        Raises :class:`~kernel.errors.UnknownRecord` for an unknown session."""
        ...

    # -- reads of committed state ------------------------------------------

    def task(self, task_id: str) -> Task | None: ...

    def session_tasks(self, session_id: str) -> list[Task]: ...

    def conversation(self, conversation_id: str) -> Conversation | None: ...

    def conversation_entries(self, conversation_id: str) -> list[Entry]: ...

    def context_entries(
        self, conversation_id: str, upto: Position = LAST_POSITION,
        after: Position | None = None,
    ) -> list[Entry]:
        """What a model's context is rebuilt from, within the conversation's own entries
        at or before ``upto``: the latest :data:`~kernel.records.SUMMARY` entry that
        covers nothing after ``upto``, then the entries (summaries left out) after the
        last one it covers, up to ``upto``; all of them when there is no such summary.
        ``after``: no summary, the entries after that position. Reads only that range,
        whatever the length of the history before it."""
        ...

    def entry(self, entry_id: str) -> Entry | None: ...

    def referenced_artifacts(self, digests: Iterable[str]) -> set[str]:
        """Which of ``digests`` (:mod:`kernel.artifacts`) some stored record references:
        an entry's payload, a document version's ops or baseline, the input, checkpoint
        or signals of a task that has not ended and the outcomes of its ended children
        (:data:`~kernel.artifacts.TASK_FIELDS`; a reference's ``holds`` too). What a
        sweep keeps
        (:meth:`~kernel.artifacts.ArtifactStore.sweep`)."""
        ...

    def document_head(self, session_id: str, kind: str, key: str) -> DocumentHead | None: ...

    def document_versions(self, document_id: str, upto: int) -> list[DocumentVersion]:
        """The versions needed to rebuild version ``upto``: from the newest baseline at
        or before it, in order."""
        ...

    def document_now(
        self, session_id: str, kind: str, key: str
    ) -> tuple[DocumentHead, list[DocumentVersion]] | None:
        """The document's head and the versions that rebuild its current value
        (:meth:`document_versions` up to the head's version), read together: what a read
        of a document's current value needs, in one round trip where the storage can."""
        ...

    def newest_document(
        self, session_id: str, kind: str, prefix: str
    ) -> tuple[DocumentHead, list[DocumentVersion]] | None:
        """Of the session's documents of ``kind`` whose key starts with ``prefix``, the
        one with the greatest key that is not emptied (:func:`emptied`), read as
        :meth:`document_now` reads it: one round trip where the storage can. ``None``
        when there is none. Keys compare by code point (the Postgres one, by the
        database's collation: the same for keys of one shape, such as fixed-length ids)."""
        ...

    def submission(self, submission_id: str) -> Submission | None: ...

    def submission_by_request(self, session_id: str, request_id: str) -> Submission | None: ...

    # -- leases ------------------------------------------------------------

    def claim(
        self, task_id: str, owner: str, now: datetime, until: datetime,
        versions: Collection[tuple[str, int]] | None = None,
    ) -> Task | None:
        """Take the lease of a runnable task in one conditional update.

        Runnable: pending; sleeping and due; running with an expired lease (a
        restart of its phase is counted). Sets owner and expiry, bumps the epoch
        and removes the task's dispatch rows: they did their job. Returns the
        claimed task, or ``None`` if it was not runnable, or if ``versions`` is given
        and the task's ``(kind, version)`` is not one of them (a task the claimer's
        registry may not run as stored: it is left as it was).
        """
        ...

    def claim_batch(
        self, owner: str, now: datetime, until: datetime, limit: int, kinds: Sequence[str]
    ) -> list[Task]:
        """Claim up to ``limit`` runnable tasks of ``kinds``, skipping locked rows."""
        ...

    def claim_burst(self, queue: str, owner: str, now: datetime, until: datetime) -> Task | None:
        """Claim, as :meth:`claim` does, the runnable task behind the oldest due,
        unblocked burst row of ``queue`` (:meth:`mark_burst`), skipping
        tasks another claimer holds; ``None`` if there is none. A row with a message of
        its own is left to that message's :meth:`claim`. It looks at the
        :data:`CLAIM_WINDOW` oldest such rows; when none of their tasks can be claimed,
        the window's rows whose tasks are not runnable and not running (ended, waiting,
        completing, or gone) are removed and it looks again, so that such rows cannot
        starve the queue, and a claim that finds work reads no other row's status."""
        ...

    def renew(self, task_id: str, owner: str, epoch: int, until: datetime) -> bool:
        """Extend a lease that ``owner`` still holds at ``epoch``.

        False when it was not extended now: lost, or the row is busy with the holder's
        own commit (which extends the lease itself). Never waits for a lock.
        """
        ...

    def release(
        self, task_id: str, owner: str, epoch: int, now: datetime, *, interrupted: bool = False
    ) -> Task | None:
        """Give back a lease that ``owner`` still holds at ``epoch`` (a draining worker),
        so that another worker may claim the task at once instead of after expiry.

        Between phases (nothing in flight): the task is pending again, its owner and
        expiry cleared, and no restart will be counted. ``interrupted`` (a phase is still
        in flight and its process is about to exit): the lease is expired at ``now``, as
        if it had run out, and the next claim counts a restart. Either way the epoch is
        bumped, so that the releaser can commit nothing more, and the task gets a dispatch
        row unless it has one. ``None`` if the lease was not held (lost, or the task
        moved on); nothing is changed then.
        """
        ...

    def end_leases(self, owners: Collection[str], now: datetime) -> list[Task]:
        """End at ``now`` the leases that ``owners`` hold and that have not run out: their
        processes are known to be dead (a worker whose registry heartbeat stopped).

        Each such running task's lease ends at ``now`` and its epoch is bumped, as an
        interrupted :meth:`release` does: the owner, were it alive after all, can renew
        and commit nothing more, and the next claim counts a restart. Returns the tasks
        as changed, for the sweep to dispatch as expired leases (:meth:`ensure_dispatches`).
        A lease that ran out already is left alone, so repeating this changes nothing."""
        ...

    def runnable(self, now: datetime, limit: int) -> list[Task]: ...

    def expired_leases(self, now: datetime, limit: int) -> list[Task]:
        """Running tasks whose lease has run out (their worker is presumably gone), the
        earliest end first and ties by id: the same order on every storage, since it
        decides which rows the sweep adds first, and so which task a claim meets first."""
        ...

    def next_wake(self) -> datetime | None:
        """The earliest time at which a sleeper wakes or a lease expires."""
        ...

    # -- outbox ------------------------------------------------------------

    def take_due_dispatches(
        self, now: datetime, redeliver_after: timedelta, limit: int
    ) -> list[Dispatch]:
        """Take rows due by ``now``, stamp them delivered at ``now`` and count the
        delivery, atomically.

        Due means never delivered, or delivered and still unclaimed after
        :func:`redelivery_wait` (``redeliver_after``, doubling with each delivery: by
        attempts, never by the row's age, so a row that waited long for another reason
        is not held back further). A lost message is sent again soon, yet a row that
        sits in a long but healthy queue is not re-sent every ``redeliver_after``.
        Rows another sweep is taking are skipped, so two sweeps never send the same row.
        """
        ...

    def release_dispatches(self, ids: Iterable[int]) -> None:
        """Taken rows that could not be delivered: due again at the next sweep (the
        failed delivery is not counted)."""
        ...

    def take_dispatches(self, ids: Iterable[int], now: datetime) -> set[int]:
        """Of these rows, take the ones nobody has delivered yet, stamping them delivered
        at ``now``; their ids. A committer takes its rows before sending them (or writes
        them taken, :meth:`~kernel.dispatch.Dispatcher.attach`), so a sweep running
        meanwhile does not send them too; if the committer dies between taking and
        sending, the sweep sends them once ``redeliver_after`` has passed."""
        ...

    def existing_dispatches(self, ids: Iterable[int]) -> set[int]:
        """Which of these rows are still stored: those whose task has not been claimed
        since (a claim removes its task's rows)."""
        ...

    def mark_burst(self, ids: Iterable[int]) -> None:
        """These rows are a burst's: delivered by queue messages, not by messages of their
        own, whose workers claim them (:meth:`claim_burst`); their ``woken`` is set."""
        ...

    def thread_exit(self) -> None:
        """A thread that used this storage is ending: release what it holds (connections)."""
        ...

    def ensure_dispatches(self, tasks: Iterable[Task], now: datetime) -> None:
        """Give each task (running, its lease expired) a row due at its :func:`expiry`,
        delivered never. A row it already has from before that expiry is reset so (an
        earlier run's row, backed off, must not delay this recovery); one from after it
        is left alone, so sweeps repeating this do not re-send."""
        ...

    def block_dispatches(
        self, task_id: str, *, delivered_at: datetime | None = None, attempts: int = 0
    ) -> None:
        """A worker found this task blocked: mark its rows not yet marked for
        :meth:`retry_dispatches`. With ``delivered_at``, those rows also count as delivered
        then, at least ``attempts`` times, so that the sweep backs off from them as from
        rows delivered that often: a worker that claimed the task to find it blocked
        (its claim removed the rows whose deliveries counted) says how often it did."""
        ...

    def blocked_tasks(self, limit: int) -> list[Task]:
        """Tasks whose dispatch rows are all marked blocked: a worker found each blocked
        and no commit has changed it since (a commit's row of its own is not marked)."""
        ...

    def retry_dispatches(self, task_ids: Iterable[str]) -> None:
        """These tasks' blocked rows: unmark, and make them due now as never delivered."""
        ...
