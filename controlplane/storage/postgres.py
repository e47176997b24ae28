"""The kernel's Storage protocol on Postgres, through Django's connection.

The hot paths are explicit SQL, reviewed here rather than generated:

- ``commit``: ``SELECT ... FOR UPDATE`` on the session row takes the session's
  commit order (DESIGN §5.1); task rows read by the builder are locked too, so a
  claim cannot change an epoch between the fencing check and the write; the
  write set is persisted in the same transaction, with the commit row and the
  dispatch rows.
- ``claim``: one conditional ``UPDATE ... RETURNING`` hands out the lease and
  bumps the epoch; ``claim_batch`` adds ``FOR UPDATE SKIP LOCKED``.
- ``commits_after``: the change feed, an index range scan on ``(session, seq)``.

An error raised while committing or after it leaves the outcome unknown and
becomes :class:`~kernel.errors.CommitUncertain`; an error before it rolls back.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import psycopg
from django.db import DatabaseError, connections, transaction
from psycopg.types.json import Jsonb

from kernel.errors import CommitUncertain, UnknownRecord
from kernel.records import (
    Commit,
    Conversation,
    Dispatch,
    DocumentHead,
    DocumentVersion,
    Entry,
    SessionRecord,
    Status,
    Submission,
    SubmissionStatus,
    Task,
    WriteSet,
)
from kernel.storage import NO_PREFETCH, Build, FaultHook, JoinState, Prefetch

JSON = Any

TASK_COLUMNS = (
    "id, session_id, kind, version, input, status, phase, checkpoint, created_seq, "
    "updated_seq, parent_id, owned, wait, wake_at, signals, cancel, outcome, restarts, "
    "epoch, lease_owner, lease_until, queue"
)
RUNNABLE = (
    "(status = 'pending' OR (status = 'sleeping' AND wake_at <= %(now)s)"
    " OR (status = 'running' AND lease_until < %(now)s))"
)
CLAIM_SET = (
    "restarts = CASE WHEN status = 'running' THEN restarts + 1 ELSE restarts END, "
    "status = 'running', epoch = epoch + 1, lease_owner = %(owner)s, "
    "lease_until = %(until)s, wake_at = NULL"
)
CLAIMED_COLUMNS = ", ".join(f"t.{c.strip()}" for c in TASK_COLUMNS.split(","))
# A claimed task's dispatch rows did their job; deleting them in the claim
# statement keeps the outbox to what is undelivered or unclaimed.
FORGET_DISPATCHES = (
    "forgotten AS (DELETE FROM kernel_dispatch d USING claimed WHERE d.task_id = claimed.id)"
)
HEAD_COLUMNS = (
    "id, session_id, kind, key, kind_version, version, baseline_version, "
    "ops_bytes_since_baseline, baseline_bytes, updated_seq"
)
SUBMISSION_COLUMNS = (
    "id, session_id, conversation_id, request_id, input, status, created_seq, updated_seq, "
    "answer_entry_id, reason, resubmit_of"
)
ENTRY_COLUMNS = "id, session_id, conversation_id, seq, ordinal, kind, payload, actor, created_at"


def _json(value: JSON) -> JSON:
    """Django registers a text loader for jsonb; decode here so rows hold real values."""
    return json.loads(value) if isinstance(value, str) else value


def _task(row: Sequence[Any]) -> Task:
    return Task(
        id=row[0],
        session_id=row[1],
        kind=row[2],
        version=row[3],
        input=_json(row[4]),
        status=Status(row[5]),
        phase=row[6],
        checkpoint=_json(row[7]),
        created_seq=row[8],
        updated_seq=row[9],
        parent_id=row[10],
        owned=row[11],
        wait=_json(row[12]),
        wake_at=row[13],
        signals=_json(row[14]),
        cancel=_json(row[15]),
        outcome=_json(row[16]),
        restarts=row[17],
        epoch=row[18],
        lease_owner=row[19],
        lease_until=row[20],
        queue=row[21],
    )


def _task_params(t: Task) -> list[Any]:
    return [
        t.id,
        t.session_id,
        t.kind,
        t.version,
        Jsonb(t.input),
        str(t.status),
        t.phase,
        Jsonb(t.checkpoint),
        t.created_seq,
        t.updated_seq,
        t.parent_id,
        t.owned,
        Jsonb(t.wait) if t.wait is not None else None,
        t.wait_deps,
        t.wake_at,
        Jsonb(t.signals),
        Jsonb(t.cancel) if t.cancel is not None else None,
        Jsonb(t.outcome) if t.outcome is not None else None,
        t.restarts,
        t.epoch,
        t.lease_owner,
        t.lease_until,
        t.queue,
    ]


COMMIT_COLUMNS = "session_id, seq, at, actor, summary, id, key"


def _commit(row: Sequence[Any]) -> Commit:
    return Commit(row[0], row[1], row[2], row[3], _json(row[4]), row[5], row[6])


def _head(row: Sequence[Any]) -> DocumentHead:
    return DocumentHead(*row)


def _version(row: Sequence[Any]) -> DocumentVersion:
    return DocumentVersion(row[0], row[1], row[2], _json(row[3]), _json(row[4]), row[5])


def _entry(row: Sequence[Any]) -> Entry:
    return Entry(row[0], row[1], row[2], row[3], row[4], row[5], _json(row[6]), row[7], row[8])


def _submission(row: Sequence[Any]) -> Submission:
    return Submission(
        row[0],
        row[1],
        row[2],
        row[3],
        _json(row[4]),
        SubmissionStatus(row[5]),
        row[6],
        row[7],
        row[8],
        row[9],
        row[10],
    )


def _no_fault(point: str) -> None:
    return None


class PostgresStorage:
    def __init__(self, using: str = "default", fault: FaultHook = _no_fault) -> None:
        self.using = using
        self.fault = fault
        # Conversations never change once created, so a cache of them is never stale.
        self._conversations: dict[str, Conversation] = {}

    def _cursor(self) -> Any:
        return connections[self.using].cursor()

    def _one(self, sql: str, params: Any) -> Any:
        with self._cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchone()

    def _all(self, sql: str, params: Any) -> list[Any]:
        with self._cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchall()

    # -- sessions and commits ---------------------------------------------

    def create_session(self, session: SessionRecord) -> None:
        with self._cursor() as cur:
            cur.execute(
                "INSERT INTO kernel_session (id, head_seq, created_at, metadata) "
                "VALUES (%s, %s, %s, %s)",
                [session.id, session.head_seq, session.created_at, Jsonb(session.metadata)],
            )

    def session(self, session_id: str) -> SessionRecord | None:
        row = self._one(
            "SELECT id, head_seq, created_at, metadata FROM kernel_session WHERE id = %s",
            [session_id],
        )
        return SessionRecord(row[0], row[1], row[2], _json(row[3])) if row else None

    def commit(self, session_id: str, build: Build, prefetch: Prefetch = NO_PREFETCH) -> WriteSet:
        db = connections[self.using]
        if db.in_atomic_block:
            # Inside someone else's transaction this would be a savepoint: "committed"
            # would not mean durable, and listeners would publish too early (invariant 2).
            raise RuntimeError("a kernel commit must own its transaction; call it outside atomic()")
        atomic = transaction.atomic(using=self.using)
        atomic.__enter__()
        try:
            db.ensure_connection()
            tx = _Transaction(db, session_id, self._conversations)
            tx.load(prefetch)
            write_set = build(tx)
            self.fault("before_write")
            written = _write(db, write_set, lambda: self.fault("after_write"))
        except BaseException as exc:
            atomic.__exit__(type(exc), exc, exc.__traceback__)
            raise
        try:
            atomic.__exit__(None, None, None)  # COMMIT already ran: this only tidies up
            self.fault("after_commit")
        except Exception as exc:
            raise CommitUncertain(f"commit {session_id}#{write_set.commit.seq}: {exc}") from exc
        return written

    def commits_after(self, session_id: str, after_seq: int, limit: int) -> list[Commit]:
        rows = self._all(
            f"SELECT {COMMIT_COLUMNS} FROM kernel_commit "
            "WHERE session_id = %s AND seq > %s ORDER BY seq LIMIT %s",
            [session_id, after_seq, limit],
        )
        return [_commit(r) for r in rows]

    # -- reads ---------------------------------------------------------------

    def task(self, task_id: str) -> Task | None:
        row = self._one(f"SELECT {TASK_COLUMNS} FROM kernel_task WHERE id = %s", [task_id])
        return _task(row) if row else None

    def session_tasks(self, session_id: str) -> list[Task]:
        rows = self._all(
            f"SELECT {TASK_COLUMNS} FROM kernel_task WHERE session_id = %s "
            "ORDER BY created_seq, id",
            [session_id],
        )
        return [_task(r) for r in rows]

    def conversation(self, conversation_id: str) -> Conversation | None:
        row = self._one(
            "SELECT id, session_id, created_seq, fork_of, fork_entry_id "
            "FROM kernel_conversation WHERE id = %s",
            [conversation_id],
        )
        return Conversation(*row) if row else None

    def conversation_entries(self, conversation_id: str) -> list[Entry]:
        rows = self._all(
            f"SELECT {ENTRY_COLUMNS} FROM kernel_entry WHERE conversation_id = %s "
            "ORDER BY seq, ordinal",
            [conversation_id],
        )
        return [_entry(r) for r in rows]

    def entry(self, entry_id: str) -> Entry | None:
        row = self._one(f"SELECT {ENTRY_COLUMNS} FROM kernel_entry WHERE id = %s", [entry_id])
        return _entry(row) if row else None

    def document_head(self, session_id: str, kind: str, key: str) -> DocumentHead | None:
        with self._cursor() as cur:
            return _read_head(cur, session_id, kind, key)

    def document_versions(self, document_id: str, upto: int) -> list[DocumentVersion]:
        with self._cursor() as cur:
            return _read_versions(cur, document_id, upto)

    def submission(self, submission_id: str) -> Submission | None:
        row = self._one(
            f"SELECT {SUBMISSION_COLUMNS} FROM kernel_submission WHERE id = %s", [submission_id]
        )
        return _submission(row) if row else None

    def submission_by_request(self, session_id: str, request_id: str) -> Submission | None:
        with self._cursor() as cur:
            return _read_submission_by_request(cur, session_id, request_id)

    # -- leases ----------------------------------------------------------------

    def claim(self, task_id: str, owner: str, now: datetime, until: datetime) -> Task | None:
        # SKIP LOCKED: a row locked by its holder's commit in progress is not claimable
        # now, whatever its lease says - queueing behind it would take the task from a
        # live worker the moment its commit lands.
        row = self._one(
            f"WITH picked AS (SELECT id FROM kernel_task WHERE id = %(id)s AND {RUNNABLE} "
            f"FOR UPDATE SKIP LOCKED), claimed AS (UPDATE kernel_task t SET {CLAIM_SET} "
            f"FROM picked WHERE t.id = picked.id RETURNING {CLAIMED_COLUMNS}), "
            f"{FORGET_DISPATCHES} SELECT * FROM claimed",
            {"id": task_id, "owner": owner, "now": now, "until": until},
        )
        return _task(row) if row else None

    def claim_batch(
        self, owner: str, now: datetime, until: datetime, limit: int, kinds: Sequence[str]
    ) -> list[Task]:
        rows = self._all(
            f"WITH picked AS (SELECT id FROM kernel_task WHERE kind = ANY(%(kinds)s) "
            f"AND {RUNNABLE} ORDER BY updated_seq LIMIT %(limit)s FOR UPDATE SKIP LOCKED), "
            f"claimed AS (UPDATE kernel_task t SET {CLAIM_SET} "
            f"FROM picked WHERE t.id = picked.id RETURNING {CLAIMED_COLUMNS}), {FORGET_DISPATCHES} "
            "SELECT * FROM claimed",
            {"kinds": list(kinds), "limit": limit, "owner": owner, "now": now, "until": until},
        )
        return [_task(r) for r in rows]

    def renew(self, task_id: str, owner: str, epoch: int, until: datetime) -> bool:
        # SKIP LOCKED: while the holder's own commit has the row, a renewal would queue
        # and then write a deadline computed before it waited. Skip it; the commit
        # extends the lease itself, and the next beat renews with a fresh deadline.
        try:
            with self._cursor() as cur:
                cur.execute(
                    "UPDATE kernel_task SET lease_until = %s WHERE id = (SELECT id FROM "
                    "kernel_task WHERE id = %s AND epoch = %s AND lease_owner = %s "
                    "AND status = 'running' FOR UPDATE SKIP LOCKED)",
                    [until, task_id, epoch, owner],
                )
                return bool(cur.rowcount == 1)
        except DatabaseError:
            # Renewals run on a heartbeat thread that no request cycle cleans up:
            # drop a broken connection here so that the next beat reconnects.
            connections[self.using].close()
            raise

    def runnable(self, now: datetime, limit: int) -> list[Task]:
        rows = self._all(
            f"SELECT {TASK_COLUMNS} FROM kernel_task WHERE {RUNNABLE} "
            "ORDER BY updated_seq LIMIT %(limit)s",
            {"now": now, "limit": limit},
        )
        return [_task(r) for r in rows]

    def expired_leases(self, now: datetime, limit: int) -> list[Task]:
        rows = self._all(
            f"SELECT {TASK_COLUMNS} FROM kernel_task WHERE status = 'running' "
            "AND lease_until < %s ORDER BY lease_until LIMIT %s",
            [now, limit],
        )
        return [_task(r) for r in rows]

    def next_wake(self) -> datetime | None:
        row = self._one(
            "SELECT min(CASE WHEN status = 'sleeping' THEN wake_at ELSE lease_until END) "
            "FROM kernel_task WHERE status IN ('sleeping', 'running')",
            [],
        )
        return row[0] if row else None

    # -- outbox ------------------------------------------------------------------

    def take_due_dispatches(
        self, now: datetime, redeliver_after: timedelta, limit: int
    ) -> list[Dispatch]:
        rows = self._all(
            "WITH due AS (SELECT id FROM kernel_dispatch WHERE not_before <= %(now)s AND "
            "(delivered_at IS NULL OR delivered_at < %(now)s - GREATEST(%(after)s, "
            "delivered_at - not_before)) ORDER BY id LIMIT %(limit)s FOR UPDATE SKIP LOCKED) "
            "UPDATE kernel_dispatch d SET delivered_at = %(now)s FROM due WHERE d.id = due.id "
            "RETURNING d.task_id, d.session_id, d.not_before, d.queue, d.seq, d.id, "
            "d.delivered_at",
            {"now": now, "after": redeliver_after, "limit": limit},
        )
        return sorted((Dispatch(*r) for r in rows), key=lambda d: d.id)

    def release_dispatches(self, ids: Iterable[int]) -> None:
        with self._cursor() as cur:
            cur.execute(
                "UPDATE kernel_dispatch SET delivered_at = NULL WHERE id = ANY(%s)", [list(ids)]
            )

    def thread_exit(self) -> None:
        connections[self.using].close()  # Django's connections are per thread

    def take_dispatches(self, ids: Iterable[int], now: datetime) -> set[int]:
        rows = self._all(
            "UPDATE kernel_dispatch SET delivered_at = %s "
            "WHERE id = ANY(%s) AND delivered_at IS NULL RETURNING id",
            [now, list(ids)],
        )
        return {row[0] for row in rows}

    def ensure_dispatches(self, tasks: Iterable[Task], now: datetime) -> None:
        with self._cursor() as cur:
            cur.executemany(
                "INSERT INTO kernel_dispatch (task_id, session_id, not_before, queue, seq) "
                "SELECT %s, %s, %s, %s, 0 WHERE NOT EXISTS "
                "(SELECT 1 FROM kernel_dispatch WHERE task_id = %s)",
                [[t.id, t.session_id, now, t.queue, t.id] for t in tasks],
            )


def _read_head(cur: Any, session_id: str, kind: str, key: str) -> DocumentHead | None:
    cur.execute(
        f"SELECT {HEAD_COLUMNS} FROM kernel_document "
        "WHERE session_id = %s AND kind = %s AND key = %s",
        [session_id, kind, key],
    )
    row = cur.fetchone()
    return _head(row) if row else None


def _read_versions(cur: Any, document_id: str, upto: int) -> list[DocumentVersion]:
    cur.execute(
        "SELECT document_id, version, seq, ops, baseline, has_baseline "
        "FROM kernel_document_version WHERE document_id = %(doc)s AND version <= %(upto)s "
        "AND version >= (SELECT coalesce(max(version), 0) FROM kernel_document_version "
        "WHERE document_id = %(doc)s AND has_baseline AND version <= %(upto)s) ORDER BY version",
        {"doc": document_id, "upto": upto},
    )
    return [_version(r) for r in cur.fetchall()]


def _read_submission_by_request(cur: Any, session_id: str, request_id: str) -> Submission | None:
    cur.execute(
        f"SELECT {SUBMISSION_COLUMNS} FROM kernel_submission "
        "WHERE session_id = %s AND request_id = %s",
        [session_id, request_id],
    )
    row = cur.fetchone()
    return _submission(row) if row else None


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


# Taking the session's commit order and advancing its head are one statement: the row
# lock that orders commits is the head update itself (a commit that fails rolls it back).
SESSION_ADVANCE = (
    "UPDATE kernel_session SET head_seq = head_seq + 1 WHERE id = %s "
    "RETURNING id, head_seq - 1, created_at, metadata"
)
CONVERSATION_COLUMNS = "id, session_id, created_seq, fork_of, fork_entry_id"


class _Transaction:
    """The builder's reads, inside the open commit transaction.

    :meth:`load` takes the session's commit order and fetches everything the draft
    announced in one pipelined round trip; later reads hit that cache, and reads
    it did not foresee go to the database one by one.
    """

    def __init__(self, db: Any, session_id: str, conversations: dict[str, Conversation]) -> None:
        self.db = db
        self.session_id = session_id
        self.cur = HotCursor(db)
        self._task_cache: dict[str, Task] = {}
        self._children: dict[str, list[Task]] = {}
        self._waiters: dict[str, list[Task]] = {}
        self._heads: dict[tuple[str, str], DocumentHead | None] = {}
        self._conversations = conversations

    def load(self, prefetch: Prefetch) -> None:
        wanted_conversations = [c for c in prefetch.conversations if c not in self._conversations]
        with self.db.connection.pipeline():
            session = HotCursor(self.db).execute(SESSION_ADVANCE, [self.session_id])
            tasks = (
                HotCursor(self.db).execute(
                    f"SELECT {TASK_COLUMNS} FROM kernel_task WHERE id = ANY(%s) FOR UPDATE",
                    [list(prefetch.tasks)],
                )
                if prefetch.tasks
                else None
            )
            heads = (
                HotCursor(self.db).execute(
                    f"SELECT {HEAD_COLUMNS} FROM kernel_document WHERE session_id = %s "
                    "AND (kind, key) IN (SELECT * FROM unnest(%s::text[], %s::text[]))",
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
                HotCursor(self.db).execute(
                    f"SELECT {CONVERSATION_COLUMNS} FROM kernel_conversation WHERE id = ANY(%s)",
                    [wanted_conversations],
                )
                if wanted_conversations
                else None
            )
            related = {
                task_id: (self._query_children(task_id), self._query_waiters(task_id))
                for task_id in prefetch.finishing
            }
        row = session.fetchone()
        if row is None:
            raise UnknownRecord(f"no session {self.session_id}")
        self.session = SessionRecord(row[0], row[1], row[2], _json(row[3]))
        if tasks is not None:
            self._task_cache.update({t.id: t for t in map(_task, tasks.fetchall())})
        if heads is not None:
            self._heads.update(dict.fromkeys(prefetch.documents))
            self._heads.update({(h.kind, h.key): h for h in map(_head, heads.fetchall())})
        if conversations is not None:
            self._remember(Conversation(*r) for r in conversations.fetchall())
        for task_id, (children, waiters) in related.items():
            self._children[task_id] = [_task(r) for r in children.fetchall()]
            self._waiters[task_id] = [_task(r) for r in waiters.fetchall()]

    def _remember(self, found: Iterable[Conversation]) -> None:
        if len(self._conversations) > 10_000:
            self._conversations.clear()
        self._conversations.update({c.id: c for c in found})

    def _tasks(self, where: str, params: Any) -> list[Task]:
        self.cur.execute(f"SELECT {TASK_COLUMNS} FROM kernel_task WHERE {where} FOR UPDATE", params)
        return [_task(r) for r in self.cur.fetchall()]

    def tasks(self, ids: Iterable[str], lock: bool = True) -> dict[str, Task]:
        wanted = list(ids)
        if not lock:
            self.cur.execute(f"SELECT {TASK_COLUMNS} FROM kernel_task WHERE id = ANY(%s)", [wanted])
            return {t.id: t for t in map(_task, self.cur.fetchall())}
        missing = [i for i in wanted if i not in self._task_cache]
        if missing:
            self._task_cache.update({t.id: t for t in self._tasks("id = ANY(%s)", [missing])})
        return {i: self._task_cache[i] for i in wanted if i in self._task_cache}

    def join_state(self, ids: Sequence[str]) -> JoinState:
        if not ids:
            return JoinState(0, None)
        self.cur.execute(
            "SELECT count(*) FILTER (WHERE status <> 'terminal'), min(id) FILTER "
            "(WHERE status = 'terminal' AND outcome->>'kind' <> 'succeeded') "
            "FROM kernel_task WHERE id = ANY(%s)",
            [list(ids)],
        )
        open_, failed = self.cur.fetchone()
        return JoinState(open_, failed)

    def _query_children(self, task_id: str) -> HotCursor:
        return HotCursor(self.db).execute(
            f"SELECT {TASK_COLUMNS} FROM kernel_task WHERE parent_id = %s AND owned "
            "ORDER BY created_seq, id FOR UPDATE",
            [task_id],
        )

    def _query_waiters(self, task_id: str) -> HotCursor:
        return HotCursor(self.db).execute(
            f"SELECT {TASK_COLUMNS} FROM kernel_task WHERE session_id = %s "
            "AND status = 'waiting' AND wait_deps @> ARRAY[%s]::text[] FOR UPDATE",
            [self.session_id, task_id],
        )

    def children(self, task_id: str) -> list[Task]:
        if task_id in self._children:
            return self._children.pop(task_id)  # prefetched; a second ask reads again
        return [_task(r) for r in self._query_children(task_id).fetchall()]

    def waiters(self, task_id: str) -> list[Task]:
        if task_id in self._waiters:
            return self._waiters.pop(task_id)
        return [_task(r) for r in self._query_waiters(task_id).fetchall()]

    def document(self, kind: str, key: str) -> DocumentHead | None:
        if (kind, key) not in self._heads:
            self._heads[(kind, key)] = _read_head(self.cur, self.session.id, kind, key)
        return self._heads[(kind, key)]

    def document_versions(self, document_id: str, upto: int) -> list[DocumentVersion]:
        return _read_versions(self.cur, document_id, upto)

    def conversation(self, conversation_id: str) -> Conversation | None:
        if conversation_id not in self._conversations:
            self.cur.execute(
                f"SELECT {CONVERSATION_COLUMNS} FROM kernel_conversation WHERE id = %s",
                [conversation_id],
            )
            row = self.cur.fetchone()
            if row is None:
                return None
            self._remember([Conversation(*row)])
        return self._conversations[conversation_id]

    def entry(self, entry_id: str) -> Entry | None:
        self.cur.execute(f"SELECT {ENTRY_COLUMNS} FROM kernel_entry WHERE id = %s", [entry_id])
        row = self.cur.fetchone()
        return _entry(row) if row else None

    def submission(self, submission_id: str) -> Submission | None:
        self.cur.execute(
            f"SELECT {SUBMISSION_COLUMNS} FROM kernel_submission WHERE id = %s", [submission_id]
        )
        row = self.cur.fetchone()
        return _submission(row) if row else None

    def submission_by_request(self, request_id: str) -> Submission | None:
        return _read_submission_by_request(self.cur, self.session.id, request_id)

    def commit_by_key(self, key: str) -> Commit | None:
        self.cur.execute(
            f"SELECT {COMMIT_COLUMNS} FROM kernel_commit WHERE session_id = %s AND key = %s",
            [self.session.id, key],
        )
        row = self.cur.fetchone()
        return _commit(row) if row else None


TASK_INSERT = (
    "INSERT INTO kernel_task (id, session_id, kind, version, input, status, phase, checkpoint, "
    "created_seq, updated_seq, parent_id, owned, wait, wait_deps, wake_at, signals, cancel, "
    "outcome, restarts, epoch, lease_owner, lease_until, queue) VALUES "
    "(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
)
# A lease kept by a commit is extended from when the commit was built; the time the
# transaction then spent waiting for locks is added here, measured by the database,
# so that a commit stuck behind a lock never lands with a lease that ran out
# meanwhile (a live worker would lose its task to the sweep).
TASK_UPDATE = (
    "UPDATE kernel_task SET version = %s, input = %s, status = %s, phase = %s, checkpoint = %s, "
    "updated_seq = %s, wait = %s, wait_deps = %s, wake_at = %s, signals = %s, cancel = %s, "
    "outcome = %s, restarts = %s, epoch = %s, lease_owner = %s, "
    "lease_until = %s::timestamptz + (clock_timestamp() - transaction_timestamp()) WHERE id = %s"
)


def _execute_rows(cur: Any, sql: str, rows: list[Any]) -> None:
    """One row: a plain execute (executemany costs a pipeline sync even for one)."""
    if len(rows) == 1:
        cur.execute(sql, rows[0])
    else:
        cur.executemany(sql, rows)


def _write(db: Any, ws: WriteSet, before_commit: Callable[[], None]) -> WriteSet:
    """Persist one write set and COMMIT it, in one pipelined round trip.

    A failing statement makes the server skip the rest up to the sync, COMMIT included,
    and the caller rolls the transaction back. ``before_commit`` runs once the writes
    are queued, just before COMMIT is: raising there means nothing can have landed.
    """
    sent = False
    try:
        with db.connection.pipeline():
            head, rows = _queue_writes(db, ws)
            before_commit()
            HotCursor(db).execute("COMMIT", prepare=False)
            sent = True  # handed to the connection: from here on the server may act on it
    except psycopg.Error as exc:
        # An error the server reported means COMMIT did not run or did not succeed; a
        # connection lost once COMMIT was on its way may have committed all the same.
        if sent and (db.connection.broken or db.connection.closed):
            raise CommitUncertain(f"commit {ws.commit.session_id}#{ws.commit.seq}: {exc}") from exc
        raise
    commit = replace(ws.commit, id=head.fetchone()[0])
    if rows is None:
        return replace(ws, commit=commit, dispatches=[])
    ids = [r[0] for r in rows.fetchall()]
    dispatches = [replace(d, id=i) for d, i in zip(ws.dispatches, ids, strict=True)]
    return replace(ws, commit=commit, dispatches=dispatches)


def _queue_writes(db: Any, ws: WriteSet) -> tuple[HotCursor, HotCursor | None]:
    c = ws.commit
    head = HotCursor(db).execute(
        "INSERT INTO kernel_commit (session_id, seq, at, actor, summary, key) "
        "VALUES (%s, %s, %s, %s, %s, %s) RETURNING id",
        [c.session_id, c.seq, c.at, c.actor, Jsonb(c.summary), c.key],
    )
    cur = HotCursor(db)
    if ws.conversations:
        _execute_rows(
            cur,
            "INSERT INTO kernel_conversation (id, session_id, created_seq, fork_of, fork_entry_id) "
            "VALUES (%s, %s, %s, %s, %s)",
            [
                [v.id, v.session_id, v.created_seq, v.fork_of, v.fork_entry_id]
                for v in ws.conversations
            ],
        )
    if ws.entries:
        _execute_rows(
            cur,
            f"INSERT INTO kernel_entry ({ENTRY_COLUMNS}) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
            [
                [
                    e.id,
                    e.session_id,
                    e.conversation_id,
                    e.seq,
                    e.ordinal,
                    e.kind,
                    Jsonb(e.payload),
                    e.actor,
                    e.created_at,
                ]
                for e in ws.entries
            ],
        )
    if ws.document_heads:
        _execute_rows(
            cur,
            f"INSERT INTO kernel_document ({HEAD_COLUMNS}) VALUES "
            "(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (id) DO UPDATE SET "
            "kind_version = EXCLUDED.kind_version, version = EXCLUDED.version, "
            "baseline_version = EXCLUDED.baseline_version, "
            "ops_bytes_since_baseline = EXCLUDED.ops_bytes_since_baseline, "
            "baseline_bytes = EXCLUDED.baseline_bytes, updated_seq = EXCLUDED.updated_seq",
            [
                [
                    h.id,
                    h.session_id,
                    h.kind,
                    h.key,
                    h.kind_version,
                    h.version,
                    h.baseline_version,
                    h.ops_bytes_since_baseline,
                    h.baseline_bytes,
                    h.updated_seq,
                ]
                for h in ws.document_heads
            ],
        )
        _execute_rows(
            cur,
            "INSERT INTO kernel_document_version "
            "(document_id, version, seq, ops, baseline, has_baseline) "
            "VALUES (%s, %s, %s, %s, %s, %s)",
            [
                [
                    v.document_id,
                    v.version,
                    v.seq,
                    Jsonb(v.ops),
                    Jsonb(v.baseline) if v.has_baseline else None,
                    v.has_baseline,
                ]
                for v in ws.document_versions
            ],
        )
    if ws.new_tasks:
        _execute_rows(cur, TASK_INSERT, [_task_params(t) for t in ws.new_tasks])
    if ws.updated_tasks:
        _execute_rows(
            cur,
            TASK_UPDATE,
            [
                [
                    p[3],
                    p[4],
                    p[5],
                    p[6],
                    p[7],
                    p[9],
                    p[12],
                    p[13],
                    p[14],
                    p[15],
                    p[16],
                    p[17],
                    p[18],
                    p[19],
                    p[20],
                    p[21],
                    p[0],
                ]
                for p in map(_task_params, ws.updated_tasks)
            ],
        )
    if ws.new_submissions:
        _execute_rows(
            cur,
            f"INSERT INTO kernel_submission ({SUBMISSION_COLUMNS}) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            [
                [
                    s.id,
                    s.session_id,
                    s.conversation_id,
                    s.request_id,
                    Jsonb(s.input),
                    str(s.status),
                    s.created_seq,
                    s.updated_seq,
                    s.answer_entry_id,
                    s.reason,
                    s.resubmit_of,
                ]
                for s in ws.new_submissions
            ],
        )
    if ws.updated_submissions:
        _execute_rows(
            cur,
            "UPDATE kernel_submission SET status = %s, updated_seq = %s, answer_entry_id = %s, "
            "reason = %s WHERE id = %s",
            [
                [str(s.status), s.updated_seq, s.answer_entry_id, s.reason, s.id]
                for s in ws.updated_submissions
            ],
        )
    if not ws.dispatches:
        return head, None
    values = ", ".join(["(%s, %s, %s, %s, %s)"] * len(ws.dispatches))
    rows = HotCursor(db).execute(
        f"INSERT INTO kernel_dispatch (task_id, session_id, not_before, queue, seq) "
        f"VALUES {values} RETURNING id",
        [x for d in ws.dispatches for x in (d.task_id, d.session_id, d.not_before, d.queue, d.seq)],
    )
    return head, rows
