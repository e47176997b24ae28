"""In-memory Storage: the reference semantics.

Everything the Postgres storage does, this does with dicts under one lock. A
commit is staged, then applied at once, which is what makes it atomic; the fault
hook lets tests fail it before, during or after that point.
"""

from __future__ import annotations

import bisect
import copy
import itertools
import threading
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TypeVar

from .artifacts import references, task_values
from .errors import CommitRejected, CommitUncertain, UnknownRecord
from .records import (
    LAST_POSITION,
    SUMMARY,
    UNDISPATCHED,
    Commit,
    Conversation,
    Dispatch,
    DocumentHead,
    DocumentVersion,
    Entry,
    Position,
    SessionRecord,
    Status,
    Submission,
    Task,
    WriteSet,
    covered_last,
    position,
)
from .retention import (
    Progress,
    PruneReport,
    RetentionPolicy,
    TrimReport,
    finished_status,
    quiet,
)
from .storage import (
    CLAIM_WINDOW,
    NO_PREFETCH,
    Build,
    FaultHook,
    JoinState,
    Prefetch,
    as_stored,
    emptied,
    expiry,
    redelivery_wait,
    refused_at_build,
)
from .tasks import succeeded

R = TypeVar("R")


def _no_fault(point: str) -> None:
    return None


def _own(record: R) -> R:
    """A copy of a stored record (or of a list of them) for a reader: what a database
    read gives, so that a caller changing a value it read in place (a phase its input
    or checkpoint, a reader an entry's payload) changes nothing stored."""
    return copy.deepcopy(record)


class InMemoryStorage:
    def __init__(self, fault: FaultHook = _no_fault) -> None:
        self.fault = fault
        self._lock = threading.RLock()
        self._sessions: dict[str, SessionRecord] = {}
        self._tasks: dict[str, Task] = {}
        self._session_tasks: dict[str, list[str]] = defaultdict(list)
        self._children: dict[str, list[str]] = defaultdict(list)
        self._conversations: dict[str, Conversation] = {}
        self._entries: dict[str, Entry] = {}
        self._conversation_entries: dict[str, list[str]] = defaultdict(list)
        self._heads: dict[tuple[str, str, str], DocumentHead] = {}
        self._versions: dict[str, list[DocumentVersion]] = defaultdict(list)
        self._submissions: dict[str, Submission] = {}
        self._requests: dict[tuple[str, str], str] = {}
        self._commits: dict[str, list[Commit]] = defaultdict(list)
        self._dispatches: dict[int, Dispatch] = {}
        self._commit_ids = itertools.count(1)
        self._dispatch_ids = itertools.count(1)

    # -- sessions and commits ---------------------------------------------

    def create_session(self, session: SessionRecord) -> None:
        with self._lock:
            if session.id in self._sessions:
                raise ValueError(f"session {session.id} exists")
            self._sessions[session.id] = session

    def session(self, session_id: str) -> SessionRecord | None:
        with self._lock:
            return _own(self._sessions.get(session_id))

    def commit(self, session_id: str, build: Build, prefetch: Prefetch = NO_PREFETCH) -> WriteSet:
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None:
                raise UnknownRecord(f"no session {session_id}")
            try:
                write_set = build(_CommitReads(self, session))
            except CommitRejected:
                refused_at_build(self.fault)
                raise
            self.fault("before_write")
            staged = self._stage(write_set)
            self.fault("after_write")
            self._apply(session, staged)
            written = _own(staged)  # the committer's: its task's next phase changes it
        try:
            self.fault("after_commit")
        except Exception as exc:
            raise CommitUncertain(f"commit {session_id}#{write_set.commit.seq}: {exc}") from exc
        return written

    # The reference has one way to commit: every kind is the general commit.

    def commit_next_alone(
        self, session_id: str, build: Build, prefetch: Prefetch, known: Task
    ) -> WriteSet:
        return self.commit(session_id, build, prefetch)

    def commit_ending(
        self, session_id: str, build: Build, prefetch: Prefetch, known: Task
    ) -> WriteSet:
        return self.commit(session_id, build, prefetch)

    def commit_creating(self, session_id: str, build: Build, prefetch: Prefetch) -> WriteSet:
        return self.commit(session_id, build, prefetch)

    def commit_documents(self, session_id: str, build: Build, prefetch: Prefetch) -> WriteSet:
        return self.commit(session_id, build, prefetch)

    def commit_next_writing(
        self, session_id: str, build: Build, prefetch: Prefetch, known: Task,
        documents: Mapping[tuple[str, str], DocumentHead | None],
    ) -> WriteSet:
        return self.commit(session_id, build, prefetch)

    def _stage(self, ws: WriteSet) -> WriteSet:
        ws = copy.deepcopy(ws)
        return replace(
            ws,
            commit=replace(ws.commit, id=next(self._commit_ids)),
            dispatches=[replace(d, id=next(self._dispatch_ids)) for d in ws.dispatches],
        )

    def _apply(self, session: SessionRecord, ws: WriteSet) -> None:
        self._sessions[session.id] = replace(
            session, head_seq=ws.commit.seq, last_commit_at=ws.commit.at)
        self._commits[session.id].append(ws.commit)
        for conv in ws.conversations:
            self._conversations[conv.id] = conv
        for entry in ws.entries:
            self._entries[entry.id] = entry
            self._conversation_entries[entry.conversation_id].append(entry.id)
        for head in ws.document_heads:
            self._heads[(head.session_id, head.kind, head.key)] = head
        for version in ws.document_versions:
            self._versions[version.document_id].append(as_stored(version))
        for task in ws.new_tasks:
            self._session_tasks[task.session_id].append(task.id)
            if task.owned and task.parent_id:
                self._children[task.parent_id].append(task.id)
        for task in [*ws.new_tasks, *ws.updated_tasks]:
            self._tasks[task.id] = task
        for sub in ws.new_submissions:
            self._requests[(sub.session_id, sub.request_id)] = sub.id
        for sub in [*ws.new_submissions, *ws.updated_submissions]:
            self._submissions[sub.id] = sub
        self._forget_rows(set(ws.undispatched()))
        for dispatch in ws.dispatches:
            self._dispatches[dispatch.id] = dispatch

    def commits_after(self, session_id: str, after_seq: int, limit: int) -> list[Commit]:
        with self._lock:
            commits = self._commits.get(session_id, [])
            session = self._sessions.get(session_id)
            after = max(after_seq, session.pruned_seq if session else 0)
            # In seq order; gapless above pruned_seq (below it, only keyed rows a trim kept).
            start = bisect.bisect_right(commits, after, key=lambda c: c.seq)
            return _own(commits[start : start + limit])

    def prune(
        self, policy: RetentionPolicy, now: datetime, *, dry_run: bool = False,
        progress: Progress = quiet,
    ) -> PruneReport:
        report = PruneReport(dry_run=dry_run)
        with self._lock:
            for session in list(self._sessions.values()):
                commits = self._commits.get(session.id, [])
                conversations = [
                    c for c in self._conversations.values() if c.session_id == session.id
                ]
                # A trim up to the head leaves the marker there, and keyed commit rows
                # and entries behind it: history still, until a prune removes it.
                if session.last_commit_at is None or (
                    session.head_seq <= session.pruned_seq and not commits and not any(
                        self._conversation_entries.get(c.id) for c in conversations)
                ):
                    continue
                tasks = self._stored_session_tasks(session.id)
                if not all(t.terminal for t in tasks) or not all(
                    s.status.settled for s in self._submissions.values()
                    if s.session_id == session.id
                ):
                    continue
                status = finished_status(
                    (t.outcome or {}).get("kind") for t in tasks if t.parent_id is None
                )
                if not policy.due(session.metadata, status, session.last_commit_at, now):
                    continue
                heads = [h for h in self._heads.values() if h.session_id == session.id]
                report.sessions += 1
                report.commits += len(commits)
                report.entries += sum(
                    len(self._conversation_entries.get(c.id, [])) for c in conversations
                )
                report.document_versions += sum(
                    1 for h in heads for v in self._versions.get(h.id, [])
                    if v.version < h.baseline_version
                )
                if dry_run:
                    continue
                self._sessions[session.id] = replace(session, pruned_seq=session.head_seq)
                self._commits[session.id] = []
                for conversation in conversations:
                    for entry_id in self._conversation_entries.pop(conversation.id, []):
                        del self._entries[entry_id]
                for head in heads:
                    self._versions[head.id] = [
                        v for v in self._versions.get(head.id, [])
                        if v.version >= head.baseline_version
                    ]
        progress(report.summary())
        return report

    def trim(
        self, session_id: str, upto_seq: int, forget: Mapping[str, int] | None = None
    ) -> TrimReport:
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None:
                raise UnknownRecord(f"no session {session_id}")
            upto = min(upto_seq, session.head_seq)
            report = TrimReport(pruned_seq=max(session.pruned_seq, upto))
            commits = self._commits.get(session_id, [])
            kept = [c for c in commits if c.seq > upto or c.key is not None]
            report.commits = len(commits) - len(kept)
            self._commits[session_id] = kept
            self._sessions[session_id] = replace(session, pruned_seq=report.pruned_seq)
            forget = forget or {}
            for place, head in list(self._heads.items()):
                if head.session_id != session_id:
                    continue
                versions = self._versions.get(head.id, [])
                if (
                    forget.get(head.kind) == head.kind_version
                    and head.updated_seq <= upto
                    and emptied(head, versions[-1] if versions else None)
                ):
                    del self._heads[place]
                    self._versions.pop(head.id, None)
                    report.documents += 1
                    continue
                baseline = max(
                    (v.version for v in versions if v.has_baseline and v.seq <= upto),
                    default=0,
                )
                left = [v for v in versions if v.version >= baseline]
                report.document_versions += len(versions) - len(left)
                self._versions[head.id] = left
            return report

    # -- reads ---------------------------------------------------------------

    def task(self, task_id: str) -> Task | None:
        with self._lock:
            return _own(self._tasks.get(task_id))

    def session_tasks(self, session_id: str) -> list[Task]:
        with self._lock:
            return _own(self._stored_session_tasks(session_id))

    def _stored_session_tasks(self, session_id: str) -> list[Task]:
        return [self._tasks[i] for i in self._session_tasks.get(session_id, [])]

    def conversation(self, conversation_id: str) -> Conversation | None:
        with self._lock:
            return self._conversations.get(conversation_id)

    def conversation_entries(self, conversation_id: str) -> list[Entry]:
        with self._lock:
            return _own(self._stored_entries(conversation_id))

    def _stored_entries(self, conversation_id: str) -> list[Entry]:
        return [self._entries[i] for i in self._conversation_entries.get(conversation_id, [])]

    def context_entries(
        self, conversation_id: str, upto: Position = LAST_POSITION,
        after: Position | None = None,
    ) -> list[Entry]:
        with self._lock:
            entries = self._stored_entries(conversation_id)
        summary = None
        if after is None:
            summary = max(
                (e for e in entries if e.kind == SUMMARY and covered_last(e) <= upto),
                key=position, default=None,
            )
            after = covered_last(summary) if summary is not None else (-1, -1)
        kept = [e for e in entries if e.kind != SUMMARY and after < position(e) <= upto]
        return _own([summary, *kept] if summary is not None else kept)

    def entry(self, entry_id: str) -> Entry | None:
        with self._lock:
            return _own(self._entries.get(entry_id))

    def referenced_artifacts(self, digests: Iterable[str]) -> set[str]:
        wanted = set(digests)
        found: set[str] = set()
        with self._lock:
            values = [e.payload for e in self._entries.values()]
            values += [[v.ops, v.baseline] for vs in self._versions.values() for v in vs]
            values += task_values(self._tasks.values())
        for value in values:
            found.update(d for d in references(value) if d in wanted)
        return found

    def document_head(self, session_id: str, kind: str, key: str) -> DocumentHead | None:
        with self._lock:
            return self._heads.get((session_id, kind, key))

    def document_versions(self, document_id: str, upto: int) -> list[DocumentVersion]:
        with self._lock:
            history = [v for v in self._versions.get(document_id, []) if v.version <= upto]
            start = max((i for i, v in enumerate(history) if v.has_baseline), default=0)
            return _own(history[start:])

    def document_now(
        self, session_id: str, kind: str, key: str
    ) -> tuple[DocumentHead, list[DocumentVersion]] | None:
        with self._lock:
            head = self.document_head(session_id, kind, key)
            return None if head is None else (head, self.document_versions(head.id, head.version))

    def newest_document(
        self, session_id: str, kind: str, prefix: str
    ) -> tuple[DocumentHead, list[DocumentVersion]] | None:
        with self._lock:
            found = sorted(
                (
                    head for (session, of_kind, key), head in self._heads.items()
                    if session == session_id and of_kind == kind and key.startswith(prefix)
                ),
                key=lambda head: head.key, reverse=True,
            )
            for head in found:
                versions = self._versions.get(head.id, [])
                if not emptied(head, versions[-1] if versions else None):
                    return head, self.document_versions(head.id, head.version)
            return None

    def submission(self, submission_id: str) -> Submission | None:
        with self._lock:
            return _own(self._submissions.get(submission_id))

    def submission_by_request(self, session_id: str, request_id: str) -> Submission | None:
        with self._lock:
            found = self._requests.get((session_id, request_id))
            return _own(self._submissions[found]) if found else None

    # -- leases ----------------------------------------------------------------

    def claim(
        self, task_id: str, owner: str, now: datetime, until: datetime,
        versions: Collection[tuple[str, int]] | None = None,
    ) -> Task | None:
        with self._lock:
            task = self._tasks.get(task_id)
            if task is None or not task.runnable_at(now):
                if self._dead(task_id):
                    self._forget_rows({task_id})  # rows that outlived their task's runs
                return None
            if versions is not None and (task.kind, task.version) not in versions:
                return None
            claimed = replace(
                task,
                status=Status.RUNNING,
                restarts=task.restarts + (1 if task.status is Status.RUNNING else 0),
                epoch=task.epoch + 1,
                lease_owner=owner,
                lease_until=until,
                wake_at=None,
            )
            self._tasks[task_id] = claimed
            self._forget_rows({task_id})
            return _own(claimed)

    def _forget_rows(self, task_ids: set[str]) -> None:
        if task_ids and self._dispatches:
            for row in [d for d in self._dispatches.values() if d.task_id in task_ids]:
                del self._dispatches[row.id]

    def claim_batch(
        self, owner: str, now: datetime, until: datetime, limit: int, kinds: Sequence[str]
    ) -> list[Task]:
        with self._lock:
            wanted = set(kinds)
            candidates = [t.id for t in self._runnable(now) if t.kind in wanted]
            claimed = (self.claim(i, owner, now, until) for i in candidates[:limit])
            return [t for t in claimed if t is not None]

    def claim_burst(self, queue: str, owner: str, now: datetime, until: datetime) -> Task | None:
        with self._lock:
            while True:
                window = sorted(
                    (
                        d
                        for d in self._dispatches.values()
                        if d.woken and not d.blocked and d.queue == queue and d.not_before <= now
                    ),
                    key=lambda d: (d.not_before, d.id),
                )[:CLAIM_WINDOW]
                for row in window:
                    if not self._dead(row.task_id):
                        claimed = self.claim(row.task_id, owner, now, until)
                        if claimed is not None:
                            return claimed
                # Nothing claimable: the window's rows that outlived their tasks' runs
                # go, and the claim looks again (as the Postgres storage does).
                dead = [row.id for row in window if self._dead(row.task_id)]
                if not dead:
                    return None
                for row_id in dead:
                    del self._dispatches[row_id]

    def _dead(self, task_id: str) -> bool:
        """Whether a row of ``task_id`` can only have outlived its task's last run."""
        task = self._tasks.get(task_id)
        return task is None or task.status in UNDISPATCHED - {Status.RUNNING}

    def renew(self, task_id: str, owner: str, epoch: int, until: datetime) -> bool:
        with self._lock:
            task = self._tasks.get(task_id)
            if task is None or task.epoch != epoch or task.lease_owner != owner:
                return False
            if task.status is not Status.RUNNING:
                return False
            kept = until if task.lease_until is None else max(task.lease_until, until)
            self._tasks[task_id] = replace(task, lease_until=kept)
            return True

    def release(
        self, task_id: str, owner: str, epoch: int, now: datetime, *, interrupted: bool = False
    ) -> Task | None:
        with self._lock:
            task = self._tasks.get(task_id)
            if (
                task is None
                or task.status is not Status.RUNNING
                or task.epoch != epoch
                or task.lease_owner != owner
            ):
                return None
            if interrupted:
                released = replace(task, epoch=epoch + 1, lease_until=now)
            else:
                released = replace(
                    task, status=Status.PENDING, epoch=epoch + 1, lease_owner=None,
                    lease_until=None,
                )
            self._tasks[task_id] = released
            if not any(d.task_id == task_id for d in self._dispatches.values()):
                row_id = next(self._dispatch_ids)
                self._dispatches[row_id] = Dispatch(
                    task_id, task.session_id, now, task.queue, 0, id=row_id)
            return _own(released)

    def end_leases(self, owners: Collection[str], now: datetime) -> list[Task]:
        with self._lock:
            wanted = set(owners)
            ended = []
            for task in self._tasks.values():
                if (
                    task.status is Status.RUNNING
                    and task.lease_owner in wanted
                    and task.lease_until is not None
                    and task.lease_until > now
                ):
                    ended.append(replace(task, epoch=task.epoch + 1, lease_until=now))
            for task in ended:
                self._tasks[task.id] = task
            return _own(sorted(ended, key=lambda t: t.id))

    def runnable(self, now: datetime, limit: int) -> list[Task]:
        with self._lock:
            return _own(self._runnable(now)[:limit])

    def _runnable(self, now: datetime) -> list[Task]:
        return [t for t in self._tasks.values() if t.runnable_at(now)]

    def expired_leases(self, now: datetime, limit: int) -> list[Task]:
        with self._lock:
            found = [
                t
                for t in self._tasks.values()
                if t.status is Status.RUNNING and t.lease_until is not None and t.lease_until < now
            ]
            return _own(sorted(found, key=lambda t: (t.lease_until, t.id))[:limit])

    def next_wake(self) -> datetime | None:
        with self._lock:
            moments = [
                t.wake_at if t.status is Status.SLEEPING else t.lease_until
                for t in self._tasks.values()
                if t.status in (Status.SLEEPING, Status.RUNNING)
            ]
            return min((m for m in moments if m is not None), default=None)

    # -- outbox ------------------------------------------------------------------

    def take_due_dispatches(
        self, now: datetime, redeliver_after: timedelta, limit: int
    ) -> list[Dispatch]:
        with self._lock:
            due = [
                d
                for d in sorted(self._dispatches.values(), key=lambda d: d.id)
                if d.not_before <= now
                and (
                    d.delivered_at is None
                    or now - d.delivered_at > redelivery_wait(redeliver_after, d.attempts)
                )
            ][:limit]
            taken = [replace(row, delivered_at=now, attempts=row.attempts + 1) for row in due]
            for row in taken:
                self._dispatches[row.id] = row
            return taken

    def release_dispatches(self, ids: Iterable[int]) -> None:
        with self._lock:
            for dispatch_id in ids:
                row = self._dispatches.get(dispatch_id)
                if row is not None:
                    self._dispatches[dispatch_id] = replace(
                        row, delivered_at=None, attempts=max(row.attempts - 1, 0)
                    )

    def thread_exit(self) -> None:
        return None

    def take_dispatches(self, ids: Iterable[int], now: datetime) -> set[int]:
        taken = set()
        with self._lock:
            for dispatch_id in ids:
                row = self._dispatches.get(dispatch_id)
                if row is not None and row.delivered_at is None:
                    self._dispatches[dispatch_id] = replace(
                        row, delivered_at=now, attempts=row.attempts + 1
                    )
                    taken.add(dispatch_id)
        return taken

    def existing_dispatches(self, ids: Iterable[int]) -> set[int]:
        with self._lock:
            return {i for i in ids if i in self._dispatches}

    def mark_burst(self, ids: Iterable[int]) -> None:
        with self._lock:
            for dispatch_id in ids:
                row = self._dispatches.get(dispatch_id)
                if row is not None:
                    self._dispatches[dispatch_id] = replace(row, woken=True)

    def ensure_dispatches(self, tasks: Iterable[Task], now: datetime) -> None:
        with self._lock:
            for task in tasks:
                at = expiry(task, now)
                stored = self._tasks.get(task.id)
                if stored is None or stored.status is not Status.RUNNING or (
                    stored.lease_until is not None and stored.lease_until > at
                ):
                    continue  # it moved on since it was read: its holder lives
                rows = [d for d in self._dispatches.values() if d.task_id == task.id]
                for row in rows:
                    if row.not_before < at:
                        self._dispatches[row.id] = replace(
                            row, not_before=at, delivered_at=None, attempts=0, blocked=False
                        )
                if not rows:
                    dispatch_id = next(self._dispatch_ids)
                    row = Dispatch(task.id, task.session_id, at, task.queue, 0, id=dispatch_id)
                    self._dispatches[dispatch_id] = row

    def block_dispatches(
        self, task_id: str, *, delivered_at: datetime | None = None, attempts: int = 0
    ) -> None:
        with self._lock:
            for row in list(self._dispatches.values()):
                if row.task_id == task_id and not row.blocked:
                    self._dispatches[row.id] = replace(
                        row, blocked=True,
                        delivered_at=row.delivered_at if delivered_at is None else delivered_at,
                        attempts=max(row.attempts, attempts))

    def blocked_tasks(self, limit: int) -> list[Task]:
        with self._lock:
            blocked: dict[str, bool] = {}
            for d in self._dispatches.values():
                blocked[d.task_id] = blocked.get(d.task_id, True) and d.blocked
            ids = [i for i, all_blocked in blocked.items() if all_blocked]
            return _own([self._tasks[i] for i in ids if i in self._tasks][:limit])

    def retry_dispatches(self, task_ids: Iterable[str]) -> None:
        wanted = set(task_ids)
        with self._lock:
            for row in list(self._dispatches.values()):
                if row.task_id in wanted and row.blocked:
                    self._dispatches[row.id] = replace(
                        row, blocked=False, delivered_at=None, attempts=0
                    )


class _CommitReads:
    """Reads for the builder; under the storage lock, so nothing moves meanwhile."""

    def __init__(self, storage: InMemoryStorage, session: SessionRecord) -> None:
        self.storage = storage
        self.session = session

    def tasks(self, ids: Iterable[str], lock: bool = True) -> dict[str, Task]:
        found = (self.storage._tasks.get(i) for i in ids)
        return {t.id: t for t in found if t is not None}

    def join_state(self, ids: Sequence[str]) -> JoinState:
        found = [t for i in ids if (t := self.storage._tasks.get(i)) is not None]
        failed = next((t.id for t in found if t.terminal and not succeeded(t)), None)
        return JoinState(sum(not t.terminal for t in found), failed)

    def any_open(self, ids: Sequence[str]) -> bool:
        return any(
            not t.terminal for i in ids if (t := self.storage._tasks.get(i)) is not None
        )

    def children(self, task_id: str) -> list[Task]:
        return [self.storage._tasks[i] for i in self.storage._children.get(task_id, [])]

    def waiters(self, task_id: str) -> list[Task]:
        return [
            t
            for t in self.storage._stored_session_tasks(self.session.id)
            if t.status is Status.WAITING and task_id in t.wait_deps
        ]

    def document(self, kind: str, key: str) -> DocumentHead | None:
        return self.storage.document_head(self.session.id, kind, key)

    def document_versions(self, document_id: str, upto: int) -> list[DocumentVersion]:
        return self.storage.document_versions(document_id, upto)

    def conversation(self, conversation_id: str) -> Conversation | None:
        return self.storage.conversation(conversation_id)

    def entry(self, entry_id: str) -> Entry | None:
        return self.storage.entry(entry_id)

    def newest_entry(self, conversation_id: str) -> Entry | None:
        return max(self.storage._stored_entries(conversation_id), key=position, default=None)

    def submission(self, submission_id: str) -> Submission | None:
        return self.storage.submission(submission_id)

    def submission_by_request(self, request_id: str) -> Submission | None:
        return self.storage.submission_by_request(self.session.id, request_id)

    def commit_by_key(self, key: str) -> Commit | None:
        commits = self.storage._commits.get(self.session.id, [])
        return next((c for c in commits if c.key == key), None)
