"""Connection and transaction handling: the cursor the commit path uses, the builder's
reads inside the open commit transaction, and the pipelined write + COMMIT.

A general commit is two round trips: :meth:`TransactionReads.load` (BEGIN, the session's
head, which orders commits, plus every read the draft announced, pipelined) and
:func:`write` (every write and the COMMIT, pipelined). Everything else is Python. The
kinds of commit that take one round trip are in :mod:`.fast_commits`.
"""

from __future__ import annotations

import functools
import logging
import select
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

import psycopg

from controlplane.storage import due
from controlplane.storage import statements as sql
from controlplane.storage.schema import (
    COMMIT,
    CONVERSATION,
    DISPATCH,
    DOCUMENT_HEAD,
    DOCUMENT_VERSION,
    ENTRY,
    SESSION,
    SUBMISSION,
    TASK,
)
from kernel.errors import CommitUncertain, UnknownRecord
from kernel.records import (
    Commit,
    Conversation,
    Dispatch,
    DocumentHead,
    DocumentVersion,
    Entry,
    SessionRecord,
    Submission,
    Task,
    WriteSet,
)
from kernel.storage import JoinState, Prefetch, as_stored

log = logging.getLogger(__name__)

Observer = Callable[[str, float], None]
"""Receives ``(stage, seconds)`` for each timed stage of a commit (see PostgresStorage)."""


def id_list(ids: Iterable[str]) -> str:
    """Ids as the array literal ``statements.IDS`` takes. Every id the kernel makes is
    ``prefix_hex``; anything else names no record, so it is left out (found: none)."""
    return "{" + ",".join(i for i in ids if i.replace("_", "").isalnum()) + "}"


class HotCursor:
    """A server-side-binding psycopg cursor on Django's connection, for the commit path.

    Django's own cursors bind client-side and cannot prepare statements; the commit
    path runs the same few statements all day, so it prepares them once per
    connection and pipelines what does not need an answer in between. Statements
    still show in Django's query log when it is recording (tests count them).
    """

    def __init__(self, db: Any) -> None:
        self.db = db
        self.raw = psycopg.Cursor(db.connection)

    def _log(self, sql: str) -> None:
        if self.db.queries_logged:
            self.db.queries_log.append({"sql": sql, "time": "0.000"})

    def _wrapped(self, run: Callable[..., Any], sql: str, params: Any, many: bool) -> None:
        """Run through Django's execute wrappers, as its own cursors do, so that query
        instrumentation (tracing, profiling, tests) sees these statements too."""
        executor = run
        for wrapper in reversed(self.db.execute_wrappers):
            executor = functools.partial(wrapper, executor)
        executor(sql, params, many, {"connection": self.db, "cursor": self})

    def execute(self, sql: str, params: Any = None, prepare: bool = True) -> HotCursor:
        self._log(sql)
        self._wrapped(
            lambda q, p, many, context: self.raw.execute(q, p, prepare=prepare), sql, params, False
        )
        return self

    def executemany(self, sql: str, rows: list[Any]) -> None:
        self._log(f"{len(rows)} times: {sql}")
        self._wrapped(lambda q, p, many, context: self.raw.executemany(q, p), sql, rows, True)

    def fetchone(self) -> Any:
        return self.raw.fetchone()

    def fetchall(self) -> list[Any]:
        return self.raw.fetchall()


# -- reads shared by the storage and the commit transaction -----------------------------


def read_head(cur: Any, session_id: str, kind: str, key: str) -> DocumentHead | None:
    cur.execute(sql.DOCUMENT_HEAD_BY_KEY, [session_id, kind, key])
    row = cur.fetchone()
    return DOCUMENT_HEAD.from_sql(row) if row else None


def read_versions(cur: Any, document_id: str, upto: int) -> list[DocumentVersion]:
    cur.execute(sql.DOCUMENT_VERSIONS, {"doc": document_id, "upto": upto})
    return [DOCUMENT_VERSION.from_sql(r) for r in cur.fetchall()]


def read_submission_by_request(cur: Any, session_id: str, request_id: str) -> Submission | None:
    cur.execute(sql.SUBMISSION_BY_REQUEST, [session_id, request_id])
    row = cur.fetchone()
    return SUBMISSION.from_sql(row) if row else None


Version = tuple[str, str, int, int]
"""A task row's version: its id, ``xmin`` (the transaction that wrote it), updated_seq
and epoch. Every update of a row writes a version with another ``xmin``."""


class RowVersions:
    """Task records by row version, the few most recently used (a process's waiters).

    A waiter's record does not change while it waits for its join, yet each of its
    dependencies' endings reads it; this keeps the decoded record of each version seen,
    so that a join over n tasks is read and decoded once per version, not n times. A
    version never changes, so an entry is never stale; records are immutable, so one
    record can be handed to every commit that reads that version.
    """

    def __init__(self, size: int = 16) -> None:
        self.size = size
        self._tasks: OrderedDict[Version, Task] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, version: Version) -> Task | None:
        with self._lock:
            task = self._tasks.get(version)
            if task is not None:
                self._tasks.move_to_end(version)
            return task

    def put(self, version: Version, task: Task) -> None:
        with self._lock:
            self._tasks[version] = task
            self._tasks.move_to_end(version)
            while len(self._tasks) > self.size:
                self._tasks.popitem(last=False)


class TransactionReads:
    """The builder's reads, inside the open commit transaction.

    :meth:`load` takes the session's commit order and fetches everything the draft
    announced in one pipelined round trip; later reads hit that cache, and reads
    it did not foresee go to the database one by one.
    """

    def __init__(
        self,
        db: Any,
        session_id: str,
        conversations: dict[str, Conversation],
        versions: RowVersions | None = None,
    ) -> None:
        self.db = db
        self.session_id = session_id
        self.cur = HotCursor(db)
        self._task_cache: dict[str, Task] = {}
        self._children: dict[str, list[Task]] = {}
        self._waiters: dict[str, list[Any]] = {}  # their versions, as read
        self._versions = versions if versions is not None else RowVersions()
        self._heads: dict[tuple[str, str], DocumentHead | None] = {}
        self._conversations = conversations
        self._submissions: dict[str, Submission | None] = {}
        self._newest: dict[str, Entry | None] = {}

    def load(self, prefetch: Prefetch, *, begin: bool = False) -> None:
        """``begin``: open the transaction here, with BEGIN in the same pipeline (the
        connection is in autocommit mode, so psycopg sends no BEGIN of its own)."""
        wanted_conversations = [c for c in prefetch.conversations if c not in self._conversations]
        with self.db.connection.pipeline():
            if begin:
                HotCursor(self.db).execute("BEGIN", prepare=False)
            session = HotCursor(self.db).execute(sql.SESSION_ADVANCE, [self.session_id])
            tasks = (
                HotCursor(self.db).execute(sql.TASKS_BY_ID_LOCKED, [id_list(prefetch.tasks)])
                if prefetch.tasks
                else None
            )
            heads = (
                HotCursor(self.db).execute(
                    sql.DOCUMENT_HEADS_BY_KEY,
                    [
                        self.session_id,
                        [kind for kind, _ in prefetch.documents],
                        [key for _, key in prefetch.documents],
                    ],
                )
                if prefetch.documents
                else None
            )
            conversations = (
                HotCursor(self.db).execute(sql.CONVERSATIONS_BY_ID, [wanted_conversations])
                if wanted_conversations
                else None
            )
            related = {
                task_id: (self._query_children(task_id), self._query_waiters(task_id))
                for task_id in prefetch.finishing
            }
            submissions = (
                HotCursor(self.db).execute(sql.SUBMISSIONS_BY_ID, [list(prefetch.submissions)])
                if prefetch.submissions
                else None
            )
            newest = {
                conversation_id: HotCursor(self.db).execute(sql.NEWEST_ENTRY, [conversation_id])
                for conversation_id in prefetch.newest_entries
            }
        row = session.fetchone()
        if row is None:
            raise UnknownRecord(f"no session {self.session_id}")
        for conversation_id, found in newest.items():
            # Read after the session's lock is taken, as the submissions below: an entry
            # is only written through that lock.
            entry = found.fetchone()
            self._newest[conversation_id] = ENTRY.from_sql(entry) if entry else None
        self.session: SessionRecord = SESSION.from_sql(row)
        if tasks is not None:
            self._task_cache.update({t.id: t for t in map(TASK.from_sql, tasks.fetchall())})
        if heads is not None:
            self._heads.update(dict.fromkeys(prefetch.documents))
            self._heads.update(
                {(h.kind, h.key): h for h in map(DOCUMENT_HEAD.from_sql, heads.fetchall())}
            )
        if conversations is not None:
            self._remember(map(CONVERSATION.from_sql, conversations.fetchall()))
        for task_id, (children, waiters) in related.items():
            self._children[task_id] = [TASK.from_sql(r) for r in children.fetchall()]
            self._waiters[task_id] = waiters.fetchall()
        if submissions is not None:
            # Read after the session's lock is taken (the statement before them in the
            # pipeline): every write to them goes through that lock, so they stay as read.
            self._submissions.update(dict.fromkeys(prefetch.submissions))
            self._submissions.update(
                {s.id: s for s in map(SUBMISSION.from_sql, submissions.fetchall())})

    def _remember(self, found: Iterable[Conversation]) -> None:
        if len(self._conversations) > 10_000:
            self._conversations.clear()
        self._conversations.update({c.id: c for c in found})

    def tasks(self, ids: Iterable[str], lock: bool = True) -> dict[str, Task]:
        wanted = list(ids)
        if not lock:
            self.cur.execute(sql.TASKS_BY_ID, [id_list(wanted)])
            return {t.id: t for t in map(TASK.from_sql, self.cur.fetchall())}
        missing = [i for i in wanted if i not in self._task_cache]
        if missing:
            self.cur.execute(sql.TASKS_BY_ID_LOCKED, [id_list(missing)])
            self._task_cache.update({t.id: t for t in map(TASK.from_sql, self.cur.fetchall())})
        return {i: self._task_cache[i] for i in wanted if i in self._task_cache}

    def join_state(self, ids: Sequence[str]) -> JoinState:
        if not ids:
            return JoinState(0, None)
        self.cur.execute(sql.JOIN_STATE, [id_list(ids)])
        open_, failed = self.cur.fetchone()
        return JoinState(open_, failed)

    def any_open(self, ids: Sequence[str]) -> bool:
        if not ids:
            return False
        self.cur.execute(sql.ANY_OPEN, [id_list(ids)])
        return self.cur.fetchone() is not None

    def _query_children(self, task_id: str) -> HotCursor:
        return HotCursor(self.db).execute(sql.CHILDREN_LOCKED, [task_id])

    def _query_waiters(self, task_id: str) -> HotCursor:
        return HotCursor(self.db).execute(sql.WAITERS_LOCKED, [self.session_id, task_id])

    def children(self, task_id: str) -> list[Task]:
        if task_id in self._children:
            return self._children.pop(task_id)  # prefetched; a second ask reads again
        return [TASK.from_sql(r) for r in self._query_children(task_id).fetchall()]

    def waiters(self, task_id: str) -> list[Task]:
        """The tasks waiting for ``task_id``, locked. Read as row versions (see
        ``statements.WAITERS_LOCKED``); only a version not seen before is read whole."""
        if task_id in self._waiters:
            rows = self._waiters.pop(task_id)  # prefetched; a second ask reads again
        else:
            rows = self._query_waiters(task_id).fetchall()
        versions: list[Version] = [(r[0], r[1], r[2], r[3]) for r in rows]
        known = {v[0]: task for v in versions if (task := self._versions.get(v)) is not None}
        missing = [v[0] for v in versions if v[0] not in known]
        if missing:  # already locked by the query above: these are the same versions
            self.cur.execute(sql.TASKS_WITH_VERSION, [id_list(missing)])
            for row in self.cur.fetchall():
                task = TASK.from_sql(row[:-1])
                self._versions.put((task.id, row[-1], task.updated_seq, task.epoch), task)
                known[task.id] = task
        return [t for v in versions if (t := known.get(v[0])) and t.waits_on_task(task_id)]

    def document(self, kind: str, key: str) -> DocumentHead | None:
        if (kind, key) not in self._heads:
            self._heads[(kind, key)] = read_head(self.cur, self.session.id, kind, key)
        return self._heads[(kind, key)]

    def document_versions(self, document_id: str, upto: int) -> list[DocumentVersion]:
        return read_versions(self.cur, document_id, upto)

    def conversation(self, conversation_id: str) -> Conversation | None:
        if conversation_id not in self._conversations:
            self.cur.execute(sql.CONVERSATION_BY_ID, [conversation_id])
            row = self.cur.fetchone()
            if row is None:
                return None
            self._remember([CONVERSATION.from_sql(row)])
        return self._conversations[conversation_id]

    def entry(self, entry_id: str) -> Entry | None:
        self.cur.execute(sql.ENTRY_BY_ID, [entry_id])
        row = self.cur.fetchone()
        return ENTRY.from_sql(row) if row else None

    def newest_entry(self, conversation_id: str) -> Entry | None:
        if conversation_id not in self._newest:
            self.cur.execute(sql.NEWEST_ENTRY, [conversation_id])
            row = self.cur.fetchone()
            self._newest[conversation_id] = ENTRY.from_sql(row) if row else None
        return self._newest[conversation_id]

    def submission(self, submission_id: str) -> Submission | None:
        if submission_id in self._submissions:
            return self._submissions[submission_id]
        self.cur.execute(sql.SUBMISSION_BY_ID, [submission_id])
        row = self.cur.fetchone()
        return SUBMISSION.from_sql(row) if row else None

    def submission_by_request(self, request_id: str) -> Submission | None:
        return read_submission_by_request(self.cur, self.session.id, request_id)

    def commit_by_key(self, key: str) -> Commit | None:
        self.cur.execute(sql.COMMIT_BY_KEY, [self.session.id, key])
        row = self.cur.fetchone()
        return COMMIT.from_sql(row) if row else None


# -- the writes and COMMIT ---------------------------------------------------------------


def check_not_closed_while_idle(db: Any) -> None:
    """Raise :class:`psycopg.OperationalError` if the server closed ``db``'s connection
    while it sat idle (a restart, an administrator, an idle timeout), found without a
    round trip: what the server sent an idle connection is already in its socket. A
    commit that reads nothing before it writes checks this first, so that such a loss is
    "nothing was sent" rather than "sent, outcome unknown"."""
    pgconn = db.connection.pgconn
    if pgconn.status != psycopg.pq.ConnStatus.OK:
        raise psycopg.OperationalError("the connection is closed")
    for _ in range(4):  # the termination's message, then the end of the stream
        if not select.select([pgconn.socket], [], [], 0)[0]:
            return
        pgconn.consume_input()  # raises once it meets the end of the stream


def execute_rows(cur: Any, statement: str, rows: list[Any]) -> None:
    """One row: a plain execute (executemany costs a pipeline sync even for one)."""
    if len(rows) == 1:
        cur.execute(statement, rows[0])
    else:
        cur.executemany(statement, rows)


def write(db: Any, ws: WriteSet, before_commit: Callable[[], None]) -> WriteSet:
    """Persist one write set and COMMIT it, in one pipelined round trip (the second of a
    general commit: its transaction was opened by :meth:`TransactionReads.load`).

    A failing statement makes the server skip the rest up to the sync, COMMIT included,
    and the caller rolls the transaction back. ``before_commit`` runs once the writes
    are queued, just before COMMIT is: raising there means nothing can have been written."""
    head, rows = pipelined(db, ws, before_commit, queue_writes)
    ids = [r[0] for chunk in rows for r in chunk.fetchall()]
    commit = replace(ws.commit, id=head.fetchone()[0])
    dispatches = [replace(d, id=i) for d, i in zip(ws.dispatches, ids, strict=True)]
    return replace(ws, commit=commit, dispatches=dispatches)


Queue = Callable[[Any, WriteSet], tuple["HotCursor", list["HotCursor"]]]
"""Queues a write set's statements: the cursor of its commit row and those of its
dispatch rows."""


class Announcing:
    """Lets one of this process's commits at a time carry an announcement (``NOTIFY``).

    Postgres queues the commit of every notifying transaction, its log flush included,
    behind one lock for the whole database, so commits of separate sessions that would
    otherwise commit side by side wait for each other. A commit that finds another of
    this process's commits announcing goes without, and announces right after its commit
    instead, in a transaction that does not wait for the log flush
    (:data:`~controlplane.storage.due.NOTIFY_UNFLUSHED`): one more round trip for that
    commit, not a wait behind the others' flushes. Workers that hear of its tasks claim
    them, and the messages held for the grace are not sent."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._mine = threading.local()

    def claim(self) -> bool:
        """Whether this thread's commit may announce (it then holds the turn until
        :meth:`done`)."""
        if getattr(self._mine, "held", False) or self._lock.acquire(blocking=False):
            self._mine.held = True
            return True
        return False

    def after(self, announcement: str) -> None:
        """This thread's commit went without ``announcement``: sent once the commit is
        made (:func:`announced`)."""
        self._mine.after = announcement

    def take_after(self) -> str | None:
        after, self._mine.after = getattr(self._mine, "after", None), None
        return after

    def done(self) -> None:
        """This thread's commit has ended: its turn, if it held one, is free."""
        if getattr(self._mine, "held", False):
            self._mine.held = False
            self._lock.release()


announcing = Announcing()


def pipelined(
    db: Any, ws: WriteSet, before_commit: Callable[[], None], queue: Queue, *,
    begin: bool = False, guess: str = "",
) -> tuple[HotCursor, list[HotCursor]]:
    """Queue ``ws``'s writes and COMMIT in one pipeline (``begin``: BEGIN first, for a
    commit with no round trip before). An error the server reported means COMMIT did
    not run or did not succeed; a connection lost once COMMIT was on its way may have
    committed all the same (:class:`CommitUncertain`; ``guess`` says which seq that
    names)."""
    sent = False
    try:
        with db.connection.pipeline():
            if begin:
                HotCursor(db).execute("BEGIN", prepare=False)
            cursors = queue(db, ws)
            before_commit()
            HotCursor(db).execute("COMMIT", prepare=False)
            sent = True  # handed to the connection: from here on the server may act on it
    except psycopg.Error as exc:
        if sent and (db.connection.broken or db.connection.closed):
            seq = guess or ws.commit.seq
            raise CommitUncertain(f"commit {ws.commit.session_id}#{seq}: {exc}") from exc
        raise
    finally:
        after = announced(db)
    after()
    return cursors


def inline_announcement(dispatches: list[Dispatch]) -> str | None:
    """The announcement a commit of ``dispatches`` carries in its own transaction:
    ``None`` if it has none, or if another commit of this process is announcing (it is
    then sent after the commit: :func:`announced`)."""
    announcement = due.payload(dispatches)
    if announcement is None:
        return None
    if announcing.claim():
        return announcement
    announcing.after(announcement)
    return None


def announced(db: Any) -> Callable[[], None]:
    """Once this thread's commit has ended: the announcing turn given back, and what
    sends the announcement it went without, to call if it committed. The commit is
    made whatever that send meets: a failure only leaves the tasks to their messages."""
    announcing.done()
    after = announcing.take_after()

    def send() -> None:
        if after is None:
            return
        try:
            HotCursor(db).execute(due.NOTIFY_UNFLUSHED, [due.CHANNEL, after])
        except psycopg.Error:
            log.info("could not announce after a commit; its tasks' messages deliver them",
                     exc_info=True)

    return send


def queue_writes(db: Any, ws: WriteSet) -> tuple[HotCursor, list[HotCursor]]:
    """The statements of a general commit's write set."""
    head = HotCursor(db).execute(sql.COMMIT_INSERT, COMMIT.values(ws.commit))
    cur = HotCursor(db)
    if ws.conversations:
        execute_rows(
            cur, sql.CONVERSATION_INSERT, [CONVERSATION.values(v) for v in ws.conversations]
        )
    if ws.entries:
        execute_rows(cur, sql.ENTRY_INSERT, [ENTRY.values(e) for e in ws.entries])
    if ws.document_heads:
        execute_rows(
            cur, sql.DOCUMENT_HEAD_UPSERT, [DOCUMENT_HEAD.values(h) for h in ws.document_heads]
        )
        execute_rows(
            cur,
            sql.DOCUMENT_VERSION_INSERT,
            [DOCUMENT_VERSION.values(as_stored(v)) for v in ws.document_versions],
        )
    if ws.new_tasks:
        execute_rows(cur, sql.TASK_INSERT, [TASK.values(t) for t in ws.new_tasks])
    if ws.updated_tasks:
        execute_rows(cur, sql.TASK_UPDATE, [TASK.update_values(t) for t in ws.updated_tasks])
        undispatched = ws.undispatched()
        if undispatched:
            cur.execute(sql.FORGET_ROWS, [id_list(undispatched)])
    if ws.new_submissions:
        execute_rows(
            cur, sql.SUBMISSION_INSERT, [SUBMISSION.values(s) for s in ws.new_submissions]
        )
    if ws.updated_submissions:
        execute_rows(
            cur,
            sql.SUBMISSION_UPDATE,
            [SUBMISSION.update_values(s) for s in ws.updated_submissions],
        )
    return head, queue_dispatches(db, ws.dispatches, sql.dispatch_insert, DISPATCH.values)


def without(values: list[Any], *slots: int) -> list[Any]:
    for slot in sorted(slots, reverse=True):
        del values[slot]
    return values


def queue_dispatches(
    db: Any, dispatches: list[Dispatch], statement: Callable[[int], str],
    values: Callable[[Dispatch], list[Any]],
) -> list[HotCursor]:
    """The announcement for listening workers, then the rows, in chunks of at most a
    statement's parameters."""
    announcement = inline_announcement(dispatches)
    if announcement is not None:
        HotCursor(db).execute(due.NOTIFY, [due.CHANNEL, announcement])
    size = sql.DISPATCHES_PER_INSERT
    chunks = [dispatches[i : i + size] for i in range(0, len(dispatches), size)]
    return [
        HotCursor(db).execute(statement(len(chunk)), [v for d in chunk for v in values(d)])
        for chunk in chunks
    ]



