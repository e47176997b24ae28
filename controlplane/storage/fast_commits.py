"""The commits that take one round trip instead of two: built before anything is read.

A general commit (:meth:`PostgresStorage.commit`) reads first (BEGIN, the session head,
everything the draft announced) and then writes. Three kinds of draft
(:class:`kernel.commit.CommitKind`) read nothing the caller does not already know, so
they are built from what it knows and written at once, each by its one writer here:

- **next alone** (:func:`next_alone`): a lease holder's phase that returns ``Next``
  keeping the lease. Built from the holder's copy of its task; written as one statement
  (``statements.inline_commit``) that commits only if the task is still as copied.
- **ends alone** (:func:`ending`): a lease holder's phase that ends its task. Built from
  the copy, on the assumption that the task has no owned child and no waiter (what
  ``kernel.commit.Builder`` would otherwise read); written as BEGIN, the head and the
  ending in one pipeline (``statements.inline_end``) that commits only if the task is still
  as copied and that assumption holds once the session's lock is held.
- **creates only** (:func:`creating`): tasks with no parent, nothing else. Built on a
  guessed head; written with its BEGIN in one pipeline in which the database advances
  the head and gives every seq (``statements.COMMIT_INSERT_AT_HEAD``).
- **documents only** (:func:`documents`): writes to documents, no version expected,
  nothing else. Built as if every document were new, on a guessed head; written as one
  statement (``statements.DOCUMENTS_COMMIT``) in which the database advances the head,
  and numbers each existing document's next version and continues it as the build
  would have, or refuses when that would need its value read (an upgrade, a baseline).
- **next writing** (:func:`next_writing`): a lease holder's ``Next`` keeping the lease,
  with entries and document ops (a step of an agent's run). Built from the holder's
  copies of its task and of the document heads its lease's commits wrote or it read
  (a document it found not yet written is created), and from the conversations the
  storage knows (they never change); written as one statement
  (``statements.inline_writing``) that commits only if the task and every document are
  still as copied.

Each returns ``None`` when it cannot be taken: the build wanted a read the copies do not
answer (:class:`UnexpectedRead`), the write set is not of the kind after all, the task
changed since the copy (:class:`TaskChanged`; for documents: one needs its value read),
or the database refused the write. Nothing has been written then, and the caller commits
the general way, whose build decides from what it reads.
``tests/property`` holds every kind equal to the general path and to the in-memory
reference.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, NoReturn, cast

import psycopg
from psycopg.types.json import Jsonb

from controlplane.storage import due
from controlplane.storage import statements as sql
from controlplane.storage.connection import (
    HotCursor,
    announced,
    execute_rows,
    inline_announcement,
    pipelined,
    queue_dispatches,
    without,
)
from controlplane.storage.schema import (
    COMMIT,
    DISPATCH,
    DOCUMENT_HEAD,
    DOCUMENT_VERSION,
    ENTRY,
    TASK,
)
from kernel.documents import encoded_size, replacing
from kernel.errors import CommitUncertain
from kernel.records import (
    Conversation,
    DocumentHead,
    DocumentVersion,
    SessionRecord,
    Status,
    Task,
    WriteSet,
)
from kernel.storage import Build, CommitReads, as_stored

Write = Callable[[Callable[[], None]], WriteSet]
"""Writes a built commit, given the fault hook to call just before COMMIT is sent."""


class UnexpectedRead(Exception):
    """A build from the caller's copies asked for a read they do not answer."""


class TaskChanged(Exception):
    """A known task changed since the caller's copy (or, for an ending, is not alone
    after all): the database refused the commit (``statements.TASK_CHANGED``), nothing
    was written."""


# -- the builds -----------------------------------------------------------------------


class KnownReads:
    """The builder's reads for a commit built from the lease holder's copy of its task,
    before anything is sent: the session head is a guess that the writer replaces with
    the one the database gives, and any other read raises :class:`UnexpectedRead`."""

    def __init__(self, session_id: str, known: Task, *, ending: bool) -> None:
        self.known = known
        self.ending = ending
        self.session = SessionRecord(session_id, known.updated_seq,
                                     datetime.fromtimestamp(0, UTC))

    def tasks(self, ids: Iterable[str], lock: bool = True) -> dict[str, Task]:
        wanted = list(ids)
        if any(i != self.known.id for i in wanted):
            raise UnexpectedRead(f"tasks {wanted}")
        return {i: self.known for i in wanted}

    def children(self, task_id: str) -> list[Task]:
        return self._alone(task_id)

    def waiters(self, task_id: str) -> list[Task]:
        return self._alone(task_id)

    def _alone(self, task_id: str) -> list[Task]:
        """For an ending, the known task has no owned child and no waiter: an assumption
        that ``statements.inline_end`` checks under the session's lock."""
        if not self.ending or task_id != self.known.id:
            raise UnexpectedRead(f"children or waiters of {task_id}")
        return []

    def __getattr__(self, name: str) -> Any:
        raise UnexpectedRead(name)


class KnownWrites(KnownReads):
    """:class:`KnownReads` for a step that also appends entries and writes documents:
    the heads are the lease holder's copies, ``None`` for a document it found not yet
    written (a document it has no word of, or whose baseline must be read, raises
    :class:`UnexpectedRead`), the conversations those the storage has seen."""

    def __init__(self, session_id: str, known: Task,
                 documents: Mapping[tuple[str, str], DocumentHead | None],
                 conversations: Mapping[str, Conversation]) -> None:
        super().__init__(session_id, known, ending=False)
        self.documents = documents
        self.conversations = conversations

    def document(self, kind: str, key: str) -> DocumentHead | None:
        if (kind, key) not in self.documents:
            raise UnexpectedRead(f"document {kind}/{key}")
        head = self.documents[(kind, key)]
        if head is not None and head.session_id != self.session.id:
            raise UnexpectedRead(f"document {kind}/{key}")
        return head  # None: the holder found it not yet written; the statement creates it

    def conversation(self, conversation_id: str) -> Conversation | None:
        found = self.conversations.get(conversation_id)
        if found is None:
            raise UnexpectedRead(f"conversation {conversation_id}")
        return found


class NoReads:
    """The builder's reads for a commit that only creates tasks, before anything is
    sent: the session head is a guess that the database replaces, and any read raises
    :class:`UnexpectedRead`."""

    def __init__(self, session_id: str) -> None:
        self.session = SessionRecord(session_id, 0, datetime.fromtimestamp(0, UTC))

    def __getattr__(self, name: str) -> Any:
        raise UnexpectedRead(name)


class AbsentDocuments(NoReads):
    """The builder's reads for a commit that only writes documents, before anything is
    sent: every document reads as absent (the database continues those that exist,
    :func:`documents`), the session head is a guess, and any other read raises
    :class:`UnexpectedRead`."""

    def document(self, kind: str, key: str) -> None:
        return None


def _built(build: Build, tx: object) -> WriteSet | None:
    try:
        return build(cast(CommitReads, tx))
    except Exception:  # UnexpectedRead, or a rule broken by the copy: the general path decides
        return None


def fits_known(ws: WriteSet, known: Task, *, ending: bool) -> bool:
    """Whether a write set built from ``known`` is one :func:`next_alone` or
    :func:`ending` writes: the commit row and that task, nothing else; the task still
    running, or ended."""
    status = Status.TERMINAL if ending else Status.RUNNING
    return (
        not (ws.conversations or ws.entries or ws.document_heads or ws.document_versions)
        and not (ws.new_tasks or ws.new_submissions or ws.updated_submissions)
        and not ws.dispatches
        and len(ws.updated_tasks) == 1
        and all(t.id == known.id and t.status is status for t in ws.updated_tasks)
        and all(t.updated_seq == ws.commit.seq for t in ws.updated_tasks)
    )


def fits_writing(ws: WriteSet, known: Task) -> bool:
    """Whether a write set built by :class:`KnownWrites` is one :func:`next_writing`
    writes: the commit row, that task still running, entries and new versions of
    documents it has copies of, nothing else."""
    seq = ws.commit.seq
    return (
        not (ws.conversations or ws.new_tasks or ws.new_submissions or ws.updated_submissions)
        and not ws.dispatches
        and len(ws.updated_tasks) == 1
        and all(t.id == known.id and t.status is Status.RUNNING and t.updated_seq == seq
                for t in ws.updated_tasks)
        and all(e.seq == seq for e in ws.entries)
        and len(ws.document_heads) == len(ws.document_versions)
        and all(v.seq == seq and v.document_id == h.id and v.version == h.version
                for h, v in zip(ws.document_heads, ws.document_versions, strict=True))
    )


def only_creates(ws: WriteSet) -> bool:
    """Whether a write set built by :class:`NoReads` is one :func:`creating`
    writes: the commit row, new tasks with no parent, their dispatch rows, nothing else."""
    seq = ws.commit.seq
    return (
        bool(ws.new_tasks)
        and not (ws.conversations or ws.entries or ws.document_heads or ws.document_versions)
        and not (ws.updated_tasks or ws.new_submissions or ws.updated_submissions)
        and all(t.parent_id is None and t.created_seq == t.updated_seq == seq
                for t in ws.new_tasks)
        and all(d.seq == seq for d in ws.dispatches)
    )


def only_documents(ws: WriteSet) -> bool:
    """Whether a write set built by :class:`AbsentDocuments` is one :func:`documents`
    writes: the commit row (no key) and new documents, one version each, one summary
    item each, in the same order; nothing else."""
    heads, versions, summary = ws.document_heads, ws.document_versions, ws.commit.summary
    return (
        bool(heads) and ws.commit.key is None
        and not (ws.conversations or ws.entries or ws.dispatches)
        and not (ws.new_tasks or ws.updated_tasks or ws.new_submissions
                 or ws.updated_submissions)
        and len(versions) == len(summary) == len(heads)
        and all(
            h.version == h.baseline_version == v.version == 1 and v.has_baseline
            and v.document_id == h.id and item.get("type") == "document"
            and (item.get("kind"), item.get("key")) == (h.kind, h.key)
            for h, v, item in zip(heads, versions, summary, strict=True)
        )
    )


# -- the kinds: a build and its writer, or None ---------------------------------------


def next_alone(db: Any, session_id: str, build: Build, known: Task) -> Write | None:
    """A phase's ``Next`` that keeps the lease, as one statement; ``None`` if it is not
    one after all."""
    ws = _built(build, KnownReads(session_id, known, ending=False))
    if ws is None or not fits_known(ws, known, ending=False):
        return None
    return lambda before_commit: _write_known(db, ws, known, before_commit, ending=False)


def ending(db: Any, session_id: str, build: Build, known: Task) -> Write | None:
    """A phase's ending of a task with no owned child and no waiter, in one pipeline;
    ``None`` if it is not one after all."""
    ws = _built(build, KnownReads(session_id, known, ending=True))
    if ws is None or not fits_known(ws, known, ending=True):
        return None
    return lambda before_commit: _write_known(db, ws, known, before_commit, ending=True)


def creating(db: Any, session_id: str, build: Build) -> Write | None:
    """New tasks with no parent, with BEGIN in one pipeline; ``None`` if the build
    wants a read or writes more."""
    ws = _built(build, NoReads(session_id))
    if ws is None or not only_creates(ws):
        return None
    return lambda before_commit: _write_creates(db, ws, before_commit)


def documents(db: Any, session_id: str, build: Build) -> Write | None:
    """Writes to documents with no version expected, as one statement; ``None`` if the
    build wants another read or writes more."""
    ws = _built(build, AbsentDocuments(session_id))
    if ws is None or not only_documents(ws):
        return None
    return lambda before_commit: _write_documents(db, ws, before_commit)


def next_writing(
    db: Any, session_id: str, build: Build, known: Task,
    documents: Mapping[tuple[str, str], DocumentHead | None],
    conversations: Mapping[str, Conversation],
) -> Write | None:
    """A phase's ``Next`` that keeps the lease with entries and document ops, as one
    statement; ``None`` if it reads what the copies do not answer, or writes more."""
    ws = _built(build, KnownWrites(session_id, known, documents, conversations))
    if ws is None or not fits_writing(ws, known):
        return None
    copies = [documents[(h.kind, h.key)] for h in ws.document_heads]
    return lambda before_commit: _write_writing(db, ws, known, copies, before_commit)


# -- the writers -----------------------------------------------------------------------

_COMMIT_SEQ = COMMIT.inserted.index("seq")
_TASK_SEQS_AT = (TASK.inserted.index("created_seq"), TASK.inserted.index("updated_seq"))
_DISPATCH_SEQ_AT = DISPATCH.inserted.index("seq")


def _task_changes(known: Task, task: Task) -> tuple[tuple[str, ...], list[Any]]:
    """The task's columns a copy-guarded statement writes (what changed from ``known``)
    and their values but updated_seq's, the statement's own, then the task's id."""
    columns = TASK.changed(known, task, sql.TASK_ALWAYS_WRITTEN)
    return columns, without(TASK.update_values(task, columns), columns.index("updated_seq"))


def _write_known(
    db: Any, ws: WriteSet, known: Task, before_commit: Callable[[], None], *, ending: bool,
) -> WriteSet:
    """The task written only if it is still as ``known`` (its epoch, lease owner and
    updated_seq), its dispatch rows removed; :class:`TaskChanged` otherwise."""
    session_id = ws.commit.session_id
    [task] = ws.updated_tasks
    commit_values = without(COMMIT.values(ws.commit), _COMMIT_SEQ)
    columns, task_values = _task_changes(known, task)
    guards = [known.epoch, known.lease_owner, known.updated_seq]
    try:
        if ending:
            with db.connection.pipeline():
                HotCursor(db).execute("BEGIN", prepare=False)
                head = HotCursor(db).execute(sql.HEAD_ADVANCE, _head(ws))
                end = HotCursor(db).execute(
                    sql.inline_end(columns), [*commit_values, *task_values, *guards, task.id])
                before_commit()
                HotCursor(db).execute("COMMIT", prepare=False)
            [seq], (commit_id, _) = head.fetchone(), end.fetchone()
        else:
            before_commit()
            cur = HotCursor(db).execute(
                sql.inline_commit(columns),
                [*_head(ws), *commit_values, *task_values, *guards, task.id])
            seq, commit_id, _ = cur.fetchone()
    except psycopg.Error as exc:
        _sent_and_failed(exc, db, session_id)
    if seq == ws.commit.seq:
        return _guessed_right(ws, commit_id)
    commit = replace(ws.commit, id=commit_id, seq=seq)
    return replace(ws, commit=commit, updated_tasks=[replace(task, updated_seq=seq)])


def _head(ws: WriteSet) -> list[Any]:
    """The parameters of ``statements.HEAD``: the session, dated by this commit."""
    return [ws.commit.session_id, ws.commit.at]


def _guessed_right(ws: WriteSet, commit_id: int) -> WriteSet:
    """``ws`` as written when the database gave the seq it was built on (the session's
    last commit was the holder's own, as for a task's phases in a row): every record
    already carries it, and only the commit row's id is new."""
    return replace(ws, commit=replace(ws.commit, id=commit_id))


def _sent_and_failed(exc: psycopg.Error, db: Any, session_id: str) -> NoReturn:
    """Raise what a copy-guarded statement's failure means: the task changed since the
    copy (nothing written), or, sent on a connection since lost, an outcome not known (the
    server may have committed it); else the error itself."""
    if exc.sqlstate == sql.TASK_CHANGED:
        raise TaskChanged(str(exc)) from exc
    if db.connection.broken or db.connection.closed:
        raise CommitUncertain(f"commit {session_id}: {exc}") from exc
    raise exc

_ENTRY_SEQ = ENTRY.inserted.index("seq")
_HEAD_UPDATED_SEQ = DOCUMENT_HEAD.updated.index("updated_seq")
_HEAD_INSERTED_SEQ = DOCUMENT_HEAD.inserted.index("updated_seq")
_VERSION_SEQ = DOCUMENT_VERSION.inserted.index("seq")


def _write_writing(
    db: Any, ws: WriteSet, known: Task, copies: list[DocumentHead | None],
    before_commit: Callable[[], None],
) -> WriteSet:
    """:func:`_write_known`'s statement with the entries and the document versions, each
    head written only if it is still at its copy's version (:class:`TaskChanged`
    otherwise), or created where the copy says it was not written (a refused statement
    if another commit created it meanwhile)."""
    session_id = ws.commit.session_id
    [task] = ws.updated_tasks
    params = [*_head(ws), *without(COMMIT.values(ws.commit), _COMMIT_SEQ)]
    for entry in ws.entries:
        params += without(ENTRY.values(entry), _ENTRY_SEQ)
    for head, copied in zip(ws.document_heads, copies, strict=True):
        if copied is None:
            params += without(DOCUMENT_HEAD.values(head), _HEAD_INSERTED_SEQ)
        else:
            params += [*without(DOCUMENT_HEAD.update_values(head), _HEAD_UPDATED_SEQ),
                       copied.version]
    for version in ws.document_versions:
        params += without(DOCUMENT_VERSION.values(as_stored(version)), _VERSION_SEQ)
    columns, task_values = _task_changes(known, task)
    params += [*task_values, known.epoch, known.lease_owner, known.updated_seq, task.id]
    statement = sql.inline_writing(len(ws.entries), tuple(c is None for c in copies), columns)
    try:
        before_commit()
        seq, commit_id, _ = HotCursor(db).execute(statement, params).fetchone()
    except psycopg.Error as exc:
        _sent_and_failed(exc, db, session_id)
    if seq == ws.commit.seq:
        return _guessed_right(ws, commit_id)
    return replace(
        ws,
        commit=replace(ws.commit, id=commit_id, seq=seq),
        updated_tasks=[replace(task, updated_seq=seq)],
        entries=[replace(e, seq=seq) for e in ws.entries],
        document_heads=[replace(h, updated_seq=seq) for h in ws.document_heads],
        document_versions=[replace(v, seq=seq) for v in ws.document_versions],
    )


def _queue_creates(db: Any, ws: WriteSet) -> tuple[HotCursor, list[HotCursor]]:
    """The statements of :func:`only_creates`'s commits, every seq taken at the head
    (``statements.AT_HEAD``: the statements have no parameter in a seq's place)."""
    head = HotCursor(db).execute(
        sql.COMMIT_INSERT_AT_HEAD,
        [*_head(ws), *without(COMMIT.values(ws.commit), _COMMIT_SEQ)])
    execute_rows(HotCursor(db), sql.TASK_INSERT_AT_HEAD,
                 [without(TASK.values(t), *_TASK_SEQS_AT) for t in ws.new_tasks])
    return head, queue_dispatches(
        db, ws.dispatches, sql.dispatch_insert_at_head,
        lambda d: without(DISPATCH.values(d), _DISPATCH_SEQ_AT))


def _write_creates(db: Any, ws: WriteSet, before_commit: Callable[[], None]) -> WriteSet:
    if len(ws.new_tasks) == len(ws.dispatches) == 1:
        return _write_one_create(db, ws, before_commit)
    head, rows = pipelined(db, ws, before_commit, _queue_creates, begin=True,
                           guess="(at its head)")
    ids = [r[0] for chunk in rows for r in chunk.fetchall()]
    commit_id, seq = head.fetchone()
    return replace(
        ws,
        commit=replace(ws.commit, id=commit_id, seq=seq),
        new_tasks=[replace(t, created_seq=seq, updated_seq=seq) for t in ws.new_tasks],
        dispatches=[replace(d, id=i, seq=seq) for d, i in zip(ws.dispatches, ids, strict=True)],
    )


def _write_one_create(db: Any, ws: WriteSet, before_commit: Callable[[], None]) -> WriteSet:
    """One task and its dispatch row, as one statement (``statements.CREATE_ONE``)."""
    [task], [row] = ws.new_tasks, ws.dispatches
    params = [*_head(ws), *without(COMMIT.values(ws.commit), _COMMIT_SEQ),
              *without(TASK.values(task), *_TASK_SEQS_AT),
              *without(DISPATCH.values(row), _DISPATCH_SEQ_AT)]
    try:
        announcement = inline_announcement(ws.dispatches)
        before_commit()
        statement = sql.CREATE_ONE
        if announcement is not None:
            statement = sql.CREATE_ONE_ANNOUNCED
            params += [due.CHANNEL, announcement]
        try:
            commit_id, seq, row_id = HotCursor(db).execute(statement, params).fetchone()[:3]
        except psycopg.Error as exc:
            _sent_and_failed(exc, db, ws.commit.session_id)
    finally:
        after = announced(db)
    after()  # committed: the announcement it went without, if it did
    return replace(
        ws,
        commit=replace(ws.commit, id=commit_id, seq=seq),
        new_tasks=[replace(task, created_seq=seq, updated_seq=seq)],
        dispatches=[replace(row, id=row_id, seq=seq)],
    )


def _write_documents(db: Any, ws: WriteSet, before_commit: Callable[[], None]) -> WriteSet:
    """:func:`only_documents`'s commit: each document as the database numbered it, its
    version a baseline where its head says so; :class:`TaskChanged` if one needed its
    value read (nothing was written)."""
    session_id = ws.commit.session_id
    wanted = [
        {"n": n, "id": h.id, "kind": h.kind, "key": h.key, "kind_version": h.kind_version,
         "ops": v.ops, "baseline": v.baseline, "baseline_bytes": h.baseline_bytes,
         "ops_bytes": encoded_size(v.ops), "replacing": replacing(v.ops) is not None}
        for n, (h, v) in enumerate(zip(ws.document_heads, ws.document_versions, strict=True),
                                   start=1)
    ]
    params = [*_head(ws), Jsonb(wanted), *without(COMMIT.values(ws.commit), _COMMIT_SEQ),
              len(wanted)]
    before_commit()
    try:
        rows = HotCursor(db).execute(sql.DOCUMENTS_COMMIT, params).fetchall()
    except psycopg.Error as exc:
        _sent_and_failed(exc, db, session_id)
    heads = [DOCUMENT_HEAD.from_sql(r[:-2]) for r in rows]
    seq, commit_id = heads[0].updated_seq, rows[0][-2]
    versions = [
        DocumentVersion(h.id, h.version, seq, v.ops, v.baseline if h.baseline_version ==
                        h.version else None, has_baseline=h.baseline_version == h.version)
        for h, v in zip(heads, ws.document_versions, strict=True)
    ]
    summary = [{**item, "version": h.version}
               for item, h in zip(ws.commit.summary, heads, strict=True)]
    commit = replace(ws.commit, id=commit_id, seq=seq, summary=summary)
    return replace(ws, commit=commit, document_heads=heads, document_versions=versions)
