"""The change feed over REST: the commit log, read after a cursor, with long-poll (DESIGN §9).

``GET /api/sessions/{id}/changes?after=N&limit=L&wait=S``
    One session's commits with ``seq > N``, in seq order, and the session's ``head_seq``.
    A session's seq is gapless and assigned under the session's row lock, so any snapshot
    that shows seq N also shows every seq below it: ``after`` = the last seq read is an
    exact cursor.
``GET /api/changes?after_id=N&limit=L&wait=S``
    Every session's commits with ``id > N``, in id order: see :func:`settled_global` for
    why the global id needs more care than a session's seq.

``wait`` (0-30 s) long-polls when nothing is after the cursor: the view is ``async``, reads
the log every ``FEED_LONG_POLL_SECONDS`` (0.2 s) and wakes earlier on a channel-layer
hint from :mod:`controlplane.notify` (see :func:`long_poll`). Each read is one autocommit
statement run in a worker thread; no transaction or lock spans the wait. The reads here
are shared with the websocket consumers (:mod:`controlplane.consumers`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import suppress
from datetime import datetime
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.handlers.asgi import ASGIRequest
from django.db import connection
from django.http import HttpRequest
from ninja import Field, Query, Router, Schema

from controlplane.notify import GLOBAL_GROUP, following, session_group
from kernel import UnknownRecord

log = logging.getLogger(__name__)
router = Router(tags=["changes"])

MAX_CURSOR = 2**63 - 1  # a bigint
DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
MAX_WAIT = 30.0
SETTLE_SECONDS = 1.0
"""How long a global read waits for in-flight commit transactions (see settled_global)."""

T = TypeVar("T")
Runner = Callable[[Callable[..., T]], Callable[..., Awaitable[T]]]

# -- the reads (sync; one statement each, autocommit) -----------------------------------

CHANGE_COLUMNS = "c.id, c.session_id, c.seq, c.at, c.actor, c.summary"
FRAME_COLUMNS = "c.id, c.session_id, c.seq, to_json(c.at)::text, c.actor, c.summary"
"""What a websocket frame is made of; ``at`` comes as a JSON string and ``summary`` as
JSON text, so that :func:`frame` only pieces text together (a replay sends thousands:
``json_build_object`` in Postgres or ``json.dumps`` here would cost several times more)."""


def _change(row: Any) -> dict[str, Any]:
    summary = row[5]
    return {
        "id": row[0],
        "session_id": row[1],
        "seq": row[2],
        "at": row[3],
        "actor": row[4],
        "summary": json.loads(summary) if isinstance(summary, str) else summary,
    }


def _all(sql: str, params: Any) -> list[Any]:
    with connection.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchall()


def session_page(session_id: str, after: int, limit: int) -> tuple[int, list[dict[str, Any]]]:
    """``(head_seq, changes after seq)``, both from one snapshot; UnknownRecord if no session."""
    rows = _all(
        f"SELECT s.head_seq, {CHANGE_COLUMNS} FROM kernel_session s LEFT JOIN LATERAL "
        "(SELECT * FROM kernel_commit WHERE session_id = s.id AND seq > %s "
        "ORDER BY seq LIMIT %s) c ON true WHERE s.id = %s ORDER BY c.seq",
        [after, limit, session_id],
    )
    if not rows:
        raise UnknownRecord(f"no session {session_id}")
    return rows[0][0], [_change(r[1:]) for r in rows if r[1] is not None]


def session_exists(session_id: str) -> bool:
    return bool(_all("SELECT 1 FROM kernel_session WHERE id = %s", [session_id]))


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
    """``(seq, frame)`` of the session's commits after ``after``, in seq order."""
    rows = _all(
        f"SELECT {FRAME_COLUMNS} FROM kernel_commit c WHERE c.session_id = %s AND c.seq > %s "
        "ORDER BY c.seq LIMIT %s",
        [session_id, after, limit],
    )
    return [(row[2], frame(row)) for row in rows]


# Transactions holding the lock that every INSERT into kernel_commit takes, from its
# parse until the transaction ends, i.e. from before its id is drawn until it is visible.
_WRITERS = (
    "SELECT virtualtransaction FROM pg_locks WHERE locktype = 'relation' AND granted "
    "AND mode = 'RowExclusiveLock' AND relation = 'kernel_commit'::regclass "
    "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
    "AND pid <> pg_backend_pid()"
)


def _global_visible(select: str, after_id: int, limit: int) -> tuple[list[Any], list[str] | None]:
    """Commits after ``after_id`` visible now; and, only if some transaction was in flight
    when this statement's snapshot was taken, the commit writers seen after it."""
    rows = _all(
        f"SELECT {select}, s.writers FROM kernel_commit c, (SELECT CASE WHEN EXISTS "
        f"(SELECT FROM pg_snapshot_xip(pg_current_snapshot())) THEN ARRAY({_WRITERS}) END "
        "AS writers) s WHERE c.id > %s ORDER BY c.id LIMIT %s",
        [after_id, limit],
    )
    if not rows:
        return [], None
    return [r[:-1] for r in rows], rows[0][-1]


def _still_writing(writers: list[str]) -> list[str]:
    return [r[0] for r in _all(f"{_WRITERS} AND virtualtransaction = ANY(%s)", [writers])]


def _global_upto(select: str, after_id: int, upto: int, limit: int) -> list[Any]:
    return _all(
        f"SELECT {select} FROM kernel_commit c WHERE c.id > %s AND c.id <= %s "
        "ORDER BY c.id LIMIT %s",
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
    was committed before the snapshot). So:

    1. In one statement, read the page and whether the snapshot saw any transaction in
       flight. With none (or nothing to read), the page is final: serve it.
    2. Otherwise the same statement noted, after its snapshot, the transactions holding
       the row-exclusive lock on ``kernel_commit`` (an INSERT takes it before it draws
       its id and keeps it until commit or rollback). Wait until those have ended, at
       most ``settle`` seconds. A transaction without that lock then has drawn no id
       yet, so its id will be above ``M``: it needs no waiting; one that has ended
       since the snapshot is covered by the next step.
    3. Read ``(after_id, M]`` again: every id in it is now committed or gone for good.

    The price is a lag of about one commit transaction (milliseconds) while commits are
    being written, and none when idle; a page is never served with a hole that could
    fill later. A commit transaction stuck for more than ``settle`` seconds (blocked on
    a lock, say) makes this read return nothing new and the caller read again later:
    the global feed never overtakes the oldest commit still being written.
    """
    rows, writers = await run(_global_visible)(select, after_id, limit)
    if not rows or writers is None:
        return rows
    upto = rows[-1][0]
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


# -- long-poll ---------------------------------------------------------------------------


async def long_poll(
    request: HttpRequest,
    read: Callable[[], Awaitable[T]],
    found: Callable[[T], bool],
    group: str,
    wait: float,
) -> T:
    """``read()`` until ``found`` or ``wait`` seconds have passed, every
    ``FEED_LONG_POLL_SECONDS``; a hint from ``group`` cuts the sleep short.

    Hints are followed only when an ASGI server (Daphne) serves the request: its event
    loop lives as long as the process, and so does the process's
    :class:`~controlplane.notify.HintHub`. Under a WSGI server or Django's test client,
    an async view runs in an event loop of its own that ends with the request; a hub
    there would subscribe for one request and hold up the loop's shutdown (a Redis read
    in flight), so such a long-poll just polls.
    """
    deadline = time.monotonic() + wait
    result = await read()
    if found(result) or wait <= 0:
        return result
    hinted = asyncio.Event()  # never set without hints
    async with contextlib.AsyncExitStack() as stack:
        if isinstance(request, ASGIRequest):
            hinted = await stack.enter_async_context(following(group))
        while True:
            hinted.clear()
            result = await read()  # following now: a commit from here on wakes us
            remaining = deadline - time.monotonic()
            if found(result) or remaining <= 0:
                return result
            with suppress(TimeoutError):
                async with asyncio.timeout(min(settings.FEED_LONG_POLL_SECONDS, remaining)):
                    await hinted.wait()


# -- the API -------------------------------------------------------------------------------


class Change(Schema):
    seq: int = Field(..., description="the commit's position in its session (gapless)")
    id: int = Field(..., description="the commit's global id (increasing, with gaps)")
    at: datetime
    actor: str
    summary: list[Any] = Field(..., description='what changed: [{"type": ..., ...}]')


class GlobalChange(Change):
    session_id: str


class SessionChanges(Schema):
    session_id: str
    head_seq: int = Field(..., description="the session's latest seq when this was read")
    changes: list[Change]


class GlobalChanges(Schema):
    after_id: int
    last_id: int = Field(..., description="pass as `after_id` to read on from here")
    changes: list[GlobalChange]


LIMIT_HELP = "at most this many changes"
WAIT_HELP = "seconds to wait for a change when none is there yet (long-poll)"


@router.get("/sessions/{session_id}/changes", response=SessionChanges)
async def session_changes(
    request: HttpRequest,
    session_id: str,
    after: int = Query(
        0, ge=0, le=MAX_CURSOR, description="the last seq you have; 0 for everything"
    ),
    limit: int = Query(DEFAULT_LIMIT, ge=1, le=MAX_LIMIT, description=LIMIT_HELP),
    wait: float = Query(0.0, ge=0, le=MAX_WAIT, description=WAIT_HELP),
) -> Any:
    """One session's commits after seq ``after``, in seq order (404 if no such session)."""

    async def read() -> tuple[int, list[dict[str, Any]]]:
        return await sync_to_async(session_page)(session_id, after, limit)

    head_seq, changes = await long_poll(
        request, read, lambda page: bool(page[1]), session_group(session_id), wait
    )
    return {"session_id": session_id, "head_seq": head_seq, "changes": changes}


@router.get("/changes", response=GlobalChanges)
async def global_changes(
    request: HttpRequest,
    after_id: int = Query(
        0, ge=0, le=MAX_CURSOR, description="the last commit id you have; 0 for everything"
    ),
    limit: int = Query(DEFAULT_LIMIT, ge=1, le=MAX_LIMIT, description=LIMIT_HELP),
    wait: float = Query(0.0, ge=0, le=MAX_WAIT, description=WAIT_HELP),
) -> Any:
    """Every session's commits after commit id ``after_id``, in id order.

    Ids have gaps (a rolled-back commit uses one up); a commit is served only once
    every smaller id is either served or gone for good, so ``last_id`` is a safe cursor.
    """

    async def read() -> list[Any]:
        return await settled_global(after_id, limit)

    rows = await long_poll(request, read, bool, GLOBAL_GROUP, wait)
    changes = [_change(r) for r in rows]
    return {
        "after_id": after_id,
        "last_id": changes[-1]["id"] if changes else after_id,
        "changes": changes,
    }
