"""The change feed's reads: the commit log after a cursor, one session's or every session's.

Each read is one autocommit statement (a worker thread runs it for the async callers);
no transaction or lock spans a wait. The REST feed (:mod:`controlplane.api.feed`) and
the websocket feeds (:mod:`controlplane.sockets.feed`) share them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.core.serializers.json import DjangoJSONEncoder

from controlplane import models
from controlplane.reads.replica import prefer_replica
from controlplane.reads.snapshot import rows as _all
from controlplane.reads.snapshot import snapshot
from controlplane.storage.schema import (
    COMMIT,
    CONVERSATION,
    DOCUMENT_HEAD,
    SESSION,
    SUBMISSION,
    TASK,
)
from kernel import UnknownRecord

log = logging.getLogger(__name__)

MAX_CURSOR = 2**63 - 1  # a bigint
SETTLE_SECONDS = 1.0
"""How long a global read waits for in-flight commit transactions (see settled_global)."""

T = TypeVar("T")
Runner = Callable[[Callable[..., T]], Callable[..., Awaitable[T]]]

CHANGE_COLUMNS = "c.id, c.session_id, c.seq, c.at, c.actor, c.summary"
FRAME_COLUMNS = "c.id, c.session_id, c.seq, to_json(c.at)::text, c.actor, c.summary"
"""What a websocket frame is made of; ``at`` comes as a JSON string and ``summary`` as
JSON text, so that :func:`frame` only pieces text together (a replay sends thousands:
``json_build_object`` in Postgres or ``json.dumps`` here would cost several times more)."""


def change(row: Any) -> dict[str, Any]:
    """A commit read with :data:`CHANGE_COLUMNS`, as the REST feed shows it."""
    summary = row[5]
    return {
        "id": row[0],
        "session_id": row[1],
        "seq": row[2],
        "at": row[3],
        "actor": row[4],
        "summary": json.loads(summary) if isinstance(summary, str) else summary,
    }


def _after(columns: str) -> str:
    """The session's head and retention marker, and its commits after a cursor (``%s``,
    then the limit, then the session id), from one statement: a prune sets the marker
    and deletes the commits in one transaction, so these rows are the whole log after
    the cursor unless the marker is past it."""
    return (
        f"SELECT s.head_seq, s.pruned_seq, {columns} FROM {SESSION.name} s LEFT JOIN LATERAL "
        f"(SELECT * FROM {COMMIT.name} WHERE session_id = s.id AND seq > %s "
        "ORDER BY seq LIMIT %s) c ON true WHERE s.id = %s ORDER BY c.seq"
    )


@dataclass(frozen=True)
class SessionPage:
    """What the REST feed answers: the head, and the commits after the cursor; or, when
    retention removed commits after the cursor, the :func:`session_state` of the session
    and the commits after its seq (the API names it ``snapshot``)."""

    head_seq: int
    changes: list[dict[str, Any]]
    state: dict[str, Any] | None = None


def session_page(session_id: str, after: int, limit: int) -> SessionPage:
    """The page after ``after`` (see :class:`SessionPage`); UnknownRecord if no session."""
    rows = _all(_after(CHANGE_COLUMNS), [after, limit, session_id])
    if not rows:
        raise UnknownRecord(f"no session {session_id}")
    if rows[0][1] > after:
        state = session_state(session_id)
        rest = session_page(session_id, state["seq"], limit)  # no deeper: the marker <= head
        return SessionPage(rest.head_seq, rest.changes, rest.state or state)
    return SessionPage(rows[0][0], [change(r[2:]) for r in rows if r[2] is not None])


SNAPSHOT_TYPE = "snapshot"
SNAPSHOT_FRAME = '{"type": "snapshot"'
"""How a ``snapshot`` frame's text begins (``type`` is its first key), so that a socket can
tell it from a commit frame without parsing it."""


def session_state(session_id: str) -> dict[str, Any]:
    """The session's current state at its head ``seq``, read in one snapshot: what a
    reader whose cursor is below the session's ``pruned_seq`` is sent instead of the
    commits retention removed (kernel.retention). Its records, as stored: the session,
    its conversations, tasks and submissions, and its documents' versions (a value is
    read with ``GET /api/sessions/{id}/documents/{kind}/{key}``)."""
    with snapshot():
        session = models.Session.objects.filter(id=session_id).values(*SESSION.columns).first()
        if session is None:
            raise UnknownRecord(f"no session {session_id}")
        record = SESSION.record(session)

        def of(table: Any, order: str) -> list[dict[str, Any]]:
            found = table.model.objects.filter(session_id=session_id).order_by(order, "id")
            return [asdict(table.record(v)) for v in found.values(*table.columns)]

        return {
            "type": SNAPSHOT_TYPE,
            "session_id": session_id,
            "seq": record.head_seq,
            "pruned_seq": record.pruned_seq,
            "session": asdict(record),
            "conversations": of(CONVERSATION, "created_seq"),
            "tasks": of(TASK, "created_seq"),
            "submissions": of(SUBMISSION, "created_seq"),
            "documents": [
                {"kind": d.kind, "key": d.key, "version": d.version, "updated_seq": d.updated_seq}
                for d in (DOCUMENT_HEAD.record(v) for v in models.Document.objects.filter(
                    session_id=session_id).order_by("kind", "key").values(*DOCUMENT_HEAD.columns))
            ],
        }


def session_exists(session_id: str) -> bool:
    return bool(_all("SELECT 1 FROM kernel_session WHERE id = %s", [session_id]))


def session_head(session_id: str) -> int | None:
    """The session's newest seq (None if there is no such session)."""
    found = _all("SELECT head_seq FROM kernel_session WHERE id = %s", [session_id])
    return int(found[0][0]) if found else None


def newest_commit_id() -> int:
    """The highest commit id drawn so far (committed or not): no commit has a higher one."""
    return int(_all("SELECT CASE WHEN is_called THEN last_value ELSE 0 END "
                    "FROM kernel_commit_id_seq")[0][0])


def frame(row: Any) -> str:
    """The websocket frame of a commit read with :data:`FRAME_COLUMNS`."""
    commit_id, session_id, seq, at, actor, summary = row
    if not isinstance(summary, str):
        summary = json.dumps(summary)
    return (
        f'{{"type": "commit", "session_id": {json.dumps(session_id)}, "seq": {seq:d}, '
        f'"id": {commit_id:d}, "at": {at}, "actor": {json.dumps(actor)}, "summary": {summary}}}'
    )


def session_frames(session_id: str, after: int, limit: int) -> list[tuple[int, str]]:
    """``(seq, frame)`` of the session's commits after ``after``, in seq order; or, when
    retention removed commits after ``after``, the one ``snapshot`` frame (the
    :func:`session_state`) at its seq
    (the reader goes on after it)."""
    rows = _all(_after(FRAME_COLUMNS), [after, limit, session_id])
    if rows and rows[0][1] > after:
        state = session_state(session_id)
        return [(state["seq"], json.dumps(state, cls=DjangoJSONEncoder))]
    return [(row[4], frame(row[2:])) for row in rows if row[2] is not None]


def catch_up_frames(session_id: str, after: int, limit: int) -> list[tuple[int, str]]:
    """:func:`session_frames` for a socket: from the replica while it returns full batches
    (a replay of a long log), else from the primary (live reads, and the tail the replica
    has not replayed yet): every commit after ``after``, in order, whatever the lag."""
    return prefer_replica(lambda: session_frames(session_id, after, limit),
                          fresh_enough=lambda rows: len(rows) == limit)


# Transactions holding the lock that every INSERT into kernel_commit takes, from its
# parse until the transaction ends, i.e. from before its id is drawn until it is visible.
_WRITERS = (
    "SELECT virtualtransaction FROM pg_locks WHERE locktype = 'relation' AND granted "
    "AND mode = 'RowExclusiveLock' AND relation = 'kernel_commit'::regclass "
    "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
    "AND pid <> pg_backend_pid()"
)


# A trim keeps a session's keyed commit rows below its ``pruned_seq`` (so that a retried
# action is still refused as a duplicate) but they are no longer part of its log: the
# session feed never returns them (kernel.storage.Storage.commits_after), nor may the
# global feed. Only keyed rows can be there (a trim or a prune deletes every other), so
# the session is looked up for those alone.
_KEPT_BY_TRIM_ONLY = (
    "(c.key IS NULL OR c.seq > (SELECT p.pruned_seq FROM kernel_session p "
    "WHERE p.id = c.session_id))"
)


def _global_visible(select: str, after_id: int, limit: int) -> tuple[list[Any], list[str] | None]:
    """Commits after ``after_id`` visible now; and, only if some transaction was in flight
    when this statement's snapshot was taken, the commit writers seen after it."""
    rows = _all(
        f"SELECT {select}, s.writers FROM kernel_commit c, (SELECT CASE WHEN EXISTS "
        f"(SELECT FROM pg_snapshot_xip(pg_current_snapshot())) THEN ARRAY({_WRITERS}) END "
        f"AS writers) s WHERE c.id > %s AND {_KEPT_BY_TRIM_ONLY} ORDER BY c.id LIMIT %s",
        [after_id, limit],
    )
    if not rows:
        return [], None
    return [r[:-1] for r in rows], rows[0][-1]


def _writing() -> list[str]:
    return [r[0] for r in _all(_WRITERS)]


def _still_writing(writers: list[str]) -> list[str]:
    return [r[0] for r in _all(f"{_WRITERS} AND virtualtransaction = ANY(%s)", [writers])]


def _global_upto(select: str, after_id: int, upto: int, limit: int) -> list[Any]:
    return _all(
        f"SELECT {select} FROM kernel_commit c WHERE c.id > %s AND c.id <= %s "
        f"AND {_KEPT_BY_TRIM_ONLY} ORDER BY c.id LIMIT %s",
        [after_id, upto, limit],
    )


async def settled_global(
    after_id: int,
    limit: int,
    *,
    select: str = CHANGE_COLUMNS,
    run: Runner[Any] = sync_to_async,
    settle: float | None = None,
) -> list[Any]:
    """Global commits after ``after_id`` in id order, only once no smaller id can appear.

    The hazard: a commit's id comes from a bigserial drawn inside its transaction, and
    concurrent commits (of different sessions) become visible in the order they commit,
    not in id order. A reader can see id 7 while id 6 is still in flight; a client that
    then moved its cursor to 7 would never see 6. Ids also have gaps for good: a rolled
    back commit consumes its id.

    What is served: a page is cut at the highest id ``M`` the first read saw. Any id
    below ``M`` that the read did not see belongs to a transaction that was in flight
    when the read's snapshot was taken (it drew its id before ``M`` was drawn, and ``M``
    was committed before the snapshot), or is a gap for good. So:

    1. In one statement, read the page and, if the snapshot saw any transaction in
       flight, the transactions holding the row-exclusive lock on ``kernel_commit``
       after it (an INSERT takes it before it draws its id and keeps it until commit or
       rollback). A page holding every id of ``(after_id, M]`` (nothing was missed) is
       final: serve it.
    2. Otherwise, when the snapshot saw nothing in flight, read those lock holders now:
       a snapshot lists only transactions that have a transaction id, and a commit
       statement draws its commit id before its first write, which takes one (nextval
       takes none, most of the time), so a transaction can hold a missed id unlisted.
    3. Wait until the lock holders have ended, at most ``settle`` seconds. A
       transaction without that lock then has drawn no id yet, so its id will be above
       ``M``: it needs no waiting; one that has ended since the snapshot is covered by
       the next step.
    4. Read ``(after_id, M]`` again: every id in it is now committed or gone for good.

    The price is a lag of about one commit transaction (milliseconds) while commits are
    being written and the page misses an id, and none for a page that misses none (an
    idle log read from its last id); a page is never served with a hole that could
    fill later. A commit transaction stuck for more than ``settle`` seconds (blocked on
    a lock, say) makes this read return nothing new and the caller read again later:
    the global feed never overtakes the oldest commit still being written.
    """
    rows, writers = await run(_global_visible)(select, after_id, limit)
    if not rows:
        return rows
    upto = rows[-1][0]
    if upto - after_id == len(rows):  # ids are unique: every one of (after_id, upto] is here
        return rows
    if writers is None:
        writers = await run(_writing)()
    settle = SETTLE_SECONDS if settle is None else settle
    deadline = time.monotonic() + settle
    delay = 0.002
    while writers:
        if time.monotonic() >= deadline:
            log.info("global feed: commits still in flight after %.1fs; serving later", settle)
            return []
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.05)
        writers = await run(_still_writing)(writers)
    return await run(_global_upto)(select, after_id, upto, limit)
