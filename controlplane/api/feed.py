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
the log every :data:`POLL_SECONDS` and wakes earlier on a channel-layer hint from
:mod:`controlplane.notify`. Each read is one autocommit statement run in a worker thread;
no transaction, lock or connection checkout spans the wait. The reads here are shared
with the websocket consumers (:mod:`controlplane.consumers`), which also take their
frames ready-made from Postgres (``json_build_object``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from datetime import datetime
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.db import connection
from django.http import HttpRequest
from ninja import Field, Query, Router, Schema

from controlplane.notify import GLOBAL_GROUP, session_group
from kernel import UnknownRecord

log = logging.getLogger(__name__)
router = Router(tags=["changes"])

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
MAX_WAIT = 30.0
POLL_SECONDS = 0.2
"""How often a long-poll reads the log; a hint wakes it earlier."""
SETTLE_SECONDS = 1.0
"""How long a global read waits for in-flight commit transactions (see settled_global)."""

T = TypeVar("T")
Runner = Callable[[Callable[..., T]], Callable[..., Awaitable[T]]]

# -- the reads (sync; one statement each, autocommit) -----------------------------------

CHANGE_COLUMNS = "c.id, c.session_id, c.seq, c.at, c.actor, c.summary"
FRAME = (
    "json_build_object('type', 'commit', 'session_id', c.session_id, 'seq', c.seq, "
    "'id', c.id, 'at', c.at, 'actor', c.actor, 'summary', c.summary)::text"
)
"""A websocket frame, built by Postgres: the consumer sends it as it comes."""


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


def session_frames(session_id: str, after: int, limit: int) -> list[tuple[int, str]]:
    """``(seq, frame)`` of the session's commits after ``after``, in seq order."""
    return _all(
        f"SELECT c.seq, {FRAME} FROM kernel_commit c WHERE c.session_id = %s AND c.seq > %s "
        "ORDER BY c.seq LIMIT %s",
        [session_id, after, limit],
    )


def _global_visible(select: str, after_id: int, limit: int) -> tuple[list[Any], bool]:
    """Commits after ``after_id`` visible now, and whether any transaction that writes
    was in flight when this snapshot was taken."""
    rows = _all(
        f"SELECT {select}, (SELECT count(*) FROM pg_snapshot_xip(pg_current_snapshot())) "
        "FROM kernel_commit c WHERE c.id > %s ORDER BY c.id LIMIT %s",
        [after_id, limit],
    )
    return [r[:-1] for r in rows], bool(rows and rows[0][-1])


# Transactions holding the lock that every INSERT into kernel_commit takes, from its
# parse until the transaction ends, i.e. from before its id is drawn until it is visible.
_WRITERS = (
    "SELECT virtualtransaction FROM pg_locks WHERE locktype = 'relation' AND granted "
    "AND mode = 'RowExclusiveLock' AND relation = 'kernel_commit'::regclass "
    "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
    "AND pid <> pg_backend_pid()"
)


def _commit_writers() -> list[str]:
    return [r[0] for r in _all(_WRITERS, [])]


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

    1. Read the page and the snapshot's in-flight transactions in one statement. With
       none in flight (or nothing to read), the page is final: serve it.
    2. Otherwise note the transactions that hold the row-exclusive lock on
       ``kernel_commit`` (an INSERT takes it before it draws its id and keeps it until
       commit or rollback); wait until those have ended, at most ``settle`` seconds.
       A transaction in flight without that lock has drawn no id yet, so its id will be
       above ``M``: it needs no waiting.
    3. Read ``(after_id, M]`` again: every id in it is now committed or gone for good.

    The price is a lag of about one commit transaction (milliseconds) while commits are
    being written, and none when idle; a page is never served with a hole that could
    fill later. A commit transaction stuck for more than ``settle`` seconds (blocked on
    a lock, say) makes this read return nothing new and the caller read again later:
    the global feed never overtakes the oldest commit still being written.
    """
    rows, in_flight = await run(_global_visible)(select, after_id, limit)
    if not rows or not in_flight:
        return rows
    upto = rows[-1][0]
    writers = await run(_commit_writers)()
    settle = SETTLE_SECONDS if settle is None else settle
    deadline = time.monotonic() + settle
    delay = 0.002
    while writers:
        writers = await run(_still_writing)(writers)
        if not writers:
            break
        if time.monotonic() >= deadline:
            log.info("global feed: commits still in flight after %.1fs; serving later", settle)
            return []
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.05)
    return await run(_global_upto)(select, after_id, upto, limit)


# -- hints ----------------------------------------------------------------------------


class HintWaiter:
    """A private channel in a Channels group: ``wait`` returns early when a hint lands.

    Only ever a shortcut: if the layer cannot be reached, ``wait`` just sleeps and the
    caller's poll does the work.
    """

    def __init__(self, layer: Any = None, channel: str | None = None) -> None:
        self.layer = layer
        self.channel = channel
        self._receiving: asyncio.Future[Any] | None = None

    async def wait(self, timeout: float) -> bool:
        """Sleep up to ``timeout`` seconds; True if a hint cut it short."""
        if self.layer is None:
            await asyncio.sleep(timeout)
            return False
        if self._receiving is None:
            self._receiving = asyncio.ensure_future(self.layer.receive(self.channel))
        done, _ = await asyncio.wait({self._receiving}, timeout=timeout)
        if not done:
            return False
        receiving, self._receiving = self._receiving, None
        if receiving.exception() is not None:
            log.info("feed hints unavailable: %r", receiving.exception())
            self.layer = None
            return False
        return True

    async def close(self) -> None:
        if self._receiving is not None:
            self._receiving.cancel()
            with suppress(BaseException):
                await self._receiving


@asynccontextmanager
async def hints(group: str) -> AsyncIterator[HintWaiter]:
    layer = get_channel_layer()
    waiter = HintWaiter()
    if layer is not None:
        try:
            channel = await layer.new_channel()
            await layer.group_add(group, channel)
            waiter = HintWaiter(layer, channel)
        except Exception as exc:
            log.info("feed hints unavailable, polling only: %r", exc)
    try:
        yield waiter
    finally:
        await waiter.close()
        if waiter.layer is not None and waiter.channel is not None:
            with suppress(Exception):
                await layer.group_discard(group, waiter.channel)


async def long_poll(
    read: Callable[[], Awaitable[T]], found: Callable[[T], bool], group: str, wait: float
) -> T:
    """``read()`` until ``found`` or ``wait`` seconds have passed; hints from ``group``
    cut the sleeps between reads short."""
    deadline = time.monotonic() + wait
    result = await read()
    if found(result) or wait <= 0:
        return result
    async with hints(group) as hint:
        while True:
            result = await read()  # subscribed now: a commit from here on wakes us
            remaining = deadline - time.monotonic()
            if found(result) or remaining <= 0:
                return result
            await hint.wait(min(POLL_SECONDS, remaining))


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
    after: int = Query(0, ge=0, description="the last seq you have; 0 for everything"),
    limit: int = Query(DEFAULT_LIMIT, ge=1, le=MAX_LIMIT, description=LIMIT_HELP),
    wait: float = Query(0.0, ge=0, le=MAX_WAIT, description=WAIT_HELP),
) -> Any:
    """One session's commits after seq ``after``, in seq order (404 if no such session)."""

    async def read() -> tuple[int, list[dict[str, Any]]]:
        return await sync_to_async(session_page)(session_id, after, limit)

    head_seq, changes = await long_poll(
        read, lambda page: bool(page[1]), session_group(session_id), wait
    )
    return {"session_id": session_id, "head_seq": head_seq, "changes": changes}


@router.get("/changes", response=GlobalChanges)
async def global_changes(
    request: HttpRequest,
    after_id: int = Query(0, ge=0, description="the last commit id you have; 0 for everything"),
    limit: int = Query(DEFAULT_LIMIT, ge=1, le=MAX_LIMIT, description=LIMIT_HELP),
    wait: float = Query(0.0, ge=0, le=MAX_WAIT, description=WAIT_HELP),
) -> Any:
    """Every session's commits after commit id ``after_id``, in id order.

    Ids have gaps (a rolled-back commit uses one up); a commit is served only once
    every smaller id is either served or gone for good, so ``last_id`` is a safe cursor.
    """

    async def read() -> list[Any]:
        return await settled_global(after_id, limit)

    rows = await long_poll(read, bool, GLOBAL_GROUP, wait)
    changes = [_change(r) for r in rows]
    return {
        "after_id": after_id,
        "last_id": changes[-1]["id"] if changes else after_id,
        "changes": changes,
    }
