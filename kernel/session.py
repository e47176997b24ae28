"""The Kernel and its session handles: where drafts become commits (DESIGN §5).

``SessionHandle.commit`` is the only way state changes. It asks storage to run
the builder inside a transaction holding the session's commit order, adopts the
new head only once storage says committed, and only then publishes to the
after-commit listeners (dispatch delivery, live views). A storage failure that
leaves the outcome unknown poisons the handle (invariant 6).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from .artifacts import DEFAULT_THRESHOLD, ArtifactStore, InMemoryArtifacts
from .clock import Clock, SystemClock
from .commit import Builder, CommitKind, Draft, DuplicateRequest, replay
from .documents import Open, opened
from .errors import CommitUncertain, SessionPoisoned, UnknownRecord
from .large_values import opened_entry, opener, prepare
from .records import (
    LAST_POSITION,
    SUMMARY,
    Commit,
    Conversation,
    Dispatch,
    DocumentHead,
    DocumentVersion,
    Entry,
    Position,
    Preview,
    SessionRecord,
    Submission,
    Task,
    WriteSet,
    covered_last,
    new_id,
    position,
)
from .registry import Blocked, Registry
from .retention import TrimReport
from .storage import CommitReads, Storage
from .tracing import span as traced

JSON = Any
Listener = Callable[[WriteSet], None]
log = logging.getLogger(__name__)


PreviewListener = Callable[[Preview], None]
Outbox = Callable[[list[Dispatch], datetime], list[Dispatch]]
"""``outbox(rows, now)``: a commit's dispatch rows as they are to be written."""


def check_session_id(session_id: str, what: str = "session id") -> None:
    """ValueError naming ``what`` unless ``session_id`` may name a session: a session is
    named by one segment of a path (its page, its API paths, its sockets), which a ``/``
    would end, leaving the session no page and failing every page that links to it."""
    if "/" in session_id:
        raise ValueError(f"{what} {session_id[:80]!r}: holds '/', and a session is named by "
                         "one segment of a path")


@dataclass
class Kernel:
    storage: Storage
    registry: Registry
    clock: Clock = field(default_factory=SystemClock)
    listeners: list[Listener] = field(default_factory=list)
    preview_listeners: list[PreviewListener] = field(default_factory=list)
    outbox: Outbox | None = None
    """Marks each commit's dispatch rows before they are written: the
    :class:`~kernel.dispatch.Dispatcher` that delivers after every commit takes the due
    ones in the commit itself (:meth:`~kernel.dispatch.Dispatcher.attach`)."""
    artifacts: ArtifactStore | None = None
    """Where large values are stored (:mod:`kernel.artifacts`); in memory if not given."""
    artifact_above: int | None = DEFAULT_THRESHOLD
    """Entry payloads and document op values whose JSON passes this many bytes are
    stored as artifacts, the records holding stand-ins that reads put back
    (:mod:`kernel.large_values`); None keeps every value in its record."""

    def __post_init__(self) -> None:
        if self.artifacts is None:
            self.artifacts = InMemoryArtifacts(self.clock.now)

    @property
    def store(self) -> ArtifactStore:
        assert self.artifacts is not None  # set by __post_init__
        return self.artifacts

    def opener(self, record: str) -> Open:
        """Reads back the values ``record`` (named in a refusal) holds apart."""
        return opener(self.store, record)

    def _entries(self, entries: list[Entry]) -> list[Entry]:
        return [opened_entry(e, self.store) for e in entries]

    def create_session(self, session_id: str | None = None, metadata: JSON = None) -> SessionHandle:
        if session_id:
            check_session_id(session_id)
        record = SessionRecord(session_id or new_id("sess"), 0, self.clock.now(), metadata or {})
        self.storage.create_session(record)
        return SessionHandle(self, record.id, 0)

    def open(self, session_id: str) -> SessionHandle:
        """A fresh handle from what storage holds: the only way back from a poisoned one."""
        record = self.storage.session(session_id)
        if record is None:
            raise UnknownRecord(f"no session {session_id}")
        return SessionHandle(self, session_id, record.head_seq)

    def after_commit(self, listener: Listener) -> None:
        self.listeners.append(listener)

    def publish(self, write_set: WriteSet) -> None:
        """Tell listeners about a durable commit. Losing one is harmless (DESIGN §5.6),
        so a failing listener is logged, never allowed to undo or hide the commit."""
        for listener in self.listeners:
            try:
                listener(write_set)
            except Exception:
                log.exception("after-commit listener failed for %s", write_set.commit.seq)

    def on_preview(self, listener: PreviewListener) -> None:
        self.preview_listeners.append(listener)

    def publish_preview(self, preview: Preview) -> None:
        """Push a preview to live viewers; like any publication, losing it is harmless."""
        for listener in self.preview_listeners:
            try:
                listener(preview)
            except Exception:
                log.exception("preview listener failed for task %s", preview.task_id)

    # -- reads of committed state --------------------------------------------

    def task(self, task_id: str) -> Task:
        task = self.storage.task(task_id)
        if task is None:
            raise UnknownRecord(f"no task {task_id}")
        return task

    def document(self, session_id: str, kind: str, key: str, version: int | None = None) -> JSON:
        """The value of a document now (migrated to the registered kind) or at ``version``
        (as it was stored then). A document never written reads as its kind's initial value."""
        if version is None:
            return self.versioned_document(session_id, kind, key)[0]
        head = self.storage.document_head(session_id, kind, key)
        if head is None:
            if version != 0:
                raise UnknownRecord(f"document {kind}/{key} has no version {version}")
            return self.registry.document_kind(kind).initial_value()
        if not 1 <= version <= head.version:
            raise UnknownRecord(f"document {kind}/{key} has no version {version}")
        versions = self.storage.document_versions(head.id, version)
        if not versions or not versions[0].has_baseline:
            # Retention removed the versions before the newest baseline (kernel.retention).
            raise UnknownRecord(f"document {kind}/{key}: version {version} was pruned")
        return self._replayed(versions, kind, key)

    def _replayed(self, versions: list[DocumentVersion], kind: str, key: str) -> JSON:
        """A document's value from its versions, every value stored apart put back."""
        open_one = self.opener(f"document {kind}/{key}")
        return opened(replay(versions, open_one), open_one)

    def versioned_document(self, session_id: str, kind: str, key: str) -> tuple[JSON, int]:
        """The value of a document now and the version it is at, from one read of its
        head: what a write with ``expected_version`` must be computed from (a value and
        a version read apart may straddle another commit, which the check then misses)."""
        document_kind = self.registry.document_kind(kind)
        found = self.storage.document_now(session_id, kind, key)
        if found is None:
            return document_kind.initial_value(), 0
        head, versions = found
        value = self._replayed(versions, kind, key)
        return document_kind.upgrade(head.kind_version, value), head.version

    def newest_document(self, session_id: str, kind: str, prefix: str) -> tuple[str, JSON] | None:
        """The key and value now of the session's document of ``kind`` with the greatest
        key that starts with ``prefix``, passing over emptied ones; one read
        (:meth:`~kernel.storage.Storage.newest_document`). None if there is none."""
        found = self.storage.newest_document(session_id, kind, prefix)
        if found is None:
            return None
        head, versions = found
        value = self.registry.document_kind(kind).upgrade(
            head.kind_version, self._replayed(versions, kind, head.key))
        return head.key, value

    def document_version(self, session_id: str, kind: str, key: str) -> int:
        head = self.storage.document_head(session_id, kind, key)
        return head.version if head else 0

    def entries(self, conversation_id: str) -> list[Entry]:
        """A conversation's transcript: for a fork, its origin's entries up to the fork point."""
        conversation = self.storage.conversation(conversation_id)
        if conversation is None:
            raise UnknownRecord(f"no conversation {conversation_id}")
        own = self._entries(self.storage.conversation_entries(conversation_id))
        if conversation.fork_of is None:
            return own
        inherited = self.entries(conversation.fork_of)
        cut = next((i for i, e in enumerate(inherited) if e.id == conversation.fork_entry_id), None)
        if cut is None:
            # Retention removed the fork point with everything before it: what the origin
            # holds now came after the fork.
            return own
        return inherited[: cut + 1] + own

    def entries_after(self, conversation_id: str, after: Position) -> list[Entry]:
        """A conversation's own entries after position ``after``, summaries left out:
        one read of that range, whatever the length of the history before it."""
        return self._entries(self.storage.context_entries(conversation_id, after=after))

    def context(self, conversation_id: str) -> list[Entry]:
        """What a model request is built from: the latest summary entry and the entries
        after what it covers, a fork's inherited part the same way (DESIGN §8). Its cost
        is a few reads of the recent range, whatever the length of the history; the
        transcript (:meth:`entries`) still holds every entry."""
        conversation = self.storage.conversation(conversation_id)
        if conversation is None:
            raise UnknownRecord(f"no conversation {conversation_id}")
        return self._context(conversation, LAST_POSITION, None)

    def _context(
        self, conversation: Conversation, upto: Position, after: Position | None
    ) -> list[Entry]:
        own = self._entries(self.storage.context_entries(conversation.id, upto, after))
        if conversation.fork_of is None:
            return own
        summary = own[0] if own and own[0].kind == SUMMARY else None
        fork_point = self.storage.entry(conversation.fork_entry_id or "")
        origin = self.storage.conversation(conversation.fork_of)
        if fork_point is None or origin is None:
            return own  # retention removed the fork point with everything before it
        floor = covered_last(summary) if summary is not None else after
        if floor is not None and floor >= position(fork_point):
            return own  # what it covers reaches past the fork point
        inherited = self._context(origin, min(position(fork_point), upto), floor)
        return [summary, *inherited, *own[1:]] if summary is not None else inherited + own

    def blocked(self, session_id: str) -> list[tuple[Task, str]]:
        """Unfinished tasks that no registered definition can run, with the reason."""
        found = []
        for task in self.storage.session_tasks(session_id):
            if task.terminal:
                continue
            resolved = self.registry.resolve(task)
            if isinstance(resolved, Blocked):
                found.append((task, resolved.reason))
        return found

    def commits_after(self, session_id: str, after_seq: int, limit: int = 1000) -> list[Commit]:
        return self.storage.commits_after(session_id, after_seq, limit)

    def trim(
        self, session_id: str, upto_seq: int, forget: Iterable[str] = ()
    ) -> TrimReport:
        """Remove ``session_id``'s history up to ``upto_seq`` while it lives on
        (:mod:`kernel.retention`): what recovery, keyed commits and the current state
        need stays. ``forget``: document kinds whose emptied documents go whole; each
        must read as ``{}`` when absent (its initial value), so that going changes no
        read."""
        kinds = {}
        for name in forget:
            kind = self.registry.document_kind(name)
            if kind.initial_value() != {}:
                raise ValueError(
                    f"document kind {name!r}: an emptied document cannot go, as an absent "
                    "one reads as its initial value, not {}")
            kinds[name] = kind.version
        return self.storage.trim(session_id, upto_seq, kinds)


@dataclass
class SessionHandle:
    kernel: Kernel
    id: str
    head_seq: int
    poisoned: bool = False

    def commit(
        self, draft: Draft, known: Task | None = None,
        documents: Mapping[tuple[str, str], DocumentHead | None] | None = None,
    ) -> WriteSet:
        """Persist ``draft`` as the session's next commit, then publish it, by the
        storage's method for the draft's kind (:meth:`Draft.kind`).

        ``known``: the caller's copy of the task whose lease it holds, as its last commit
        or claim left it; the kinds that continue or end that task are built from it.
        ``documents``: the caller's copies of the document heads its lease's commits
        wrote or it read (by kind and key; ``None``: found not yet written), which a
        commit of :attr:`CommitKind.NEXT_WRITING` is built from."""
        if self.poisoned:
            raise SessionPoisoned(f"session handle {self.id} is poisoned; reopen it")
        # Large values stored apart, whole, before any kind of commit is built: no record
        # can name an artifact that is not stored completely.
        draft = prepare(draft, self.kernel.store, self.kernel.artifact_above)
        now = self.kernel.clock.now()
        registry = self.kernel.registry
        opens = self.kernel.opener

        outbox = self.kernel.outbox

        def build(tx: CommitReads) -> WriteSet:
            built = Builder(tx, draft, registry, now, opens).build()
            if outbox is None or not built.dispatches:
                return built
            return replace(built, dispatches=outbox(built.dispatches, now))

        storage, prefetch, kind = self.kernel.storage, draft.prefetch(), draft.kind()
        with traced("commit", {"kernel.session.id": self.id, "kernel.actor": draft.actor,
                                     "kernel.commit.kind": str(kind)}) as span:
            try:
                if kind is CommitKind.NEXT_ALONE and known is not None:
                    written = storage.commit_next_alone(self.id, build, prefetch, known)
                elif kind is CommitKind.ENDS_ALONE and known is not None:
                    written = storage.commit_ending(self.id, build, prefetch, known)
                elif kind is CommitKind.NEXT_WRITING and known is not None:
                    written = storage.commit_next_writing(
                        self.id, build, prefetch, known, documents or {})
                elif kind is CommitKind.CREATES_ONLY:
                    written = storage.commit_creating(self.id, build, prefetch)
                elif kind is CommitKind.DOCUMENTS_ONLY:
                    written = storage.commit_documents(self.id, build, prefetch)
                else:
                    written = storage.commit(self.id, build, prefetch)
            except CommitUncertain as exc:
                self.poisoned = True
                raise SessionPoisoned(
                    f"session {self.id}: commit outcome unknown ({exc})") from exc
            span.set({"kernel.commit.seq": written.commit.seq,
                      "kernel.commit.tasks_created": len(written.new_tasks)})
        self.head_seq = written.commit.seq
        self.kernel.publish(written)
        return written

    def submit(
        self, conversation_id: str, request_id: str, input: JSON, actor: str = "system"
    ) -> Submission:
        """Accept input once per ``request_id``.

        A repeat returns the original submission and writes nothing.
        """
        draft = Draft(actor=actor)
        submission_id = draft.submit(conversation_id, request_id, input)
        try:
            written = self.commit(draft)
        except DuplicateRequest as exc:
            return exc.existing
        return next(s for s in written.new_submissions if s.id == submission_id)
