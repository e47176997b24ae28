"""The change feed over REST: the commit log, read after a cursor, with long-poll (DESIGN §9).

``GET /api/sessions/{id}/changes?after=N&limit=L&wait=S``
    One session's commits with ``seq > N``, in seq order, and the session's ``head_seq``.
    A session's seq is gapless and assigned under the session's row lock, so any snapshot
    that shows seq N also shows every seq below it: ``after`` = the last seq read is an
    exact cursor. When retention has removed commits after N (N below the session's
    ``pruned_seq``), the answer carries a ``snapshot`` of the session's current state at
    ``snapshot.seq`` and the commits after that instead.
``GET /api/changes?after_id=N&limit=L&wait=S``
    Every session's commits with ``id > N``, in id order: see
    :func:`~controlplane.reads.feed.settled_global` for why the global id needs more care
    than a session's seq.

A cursor past the newest position (one the feed never sent: another database's, or
made up) is refused with 409 naming it, as the websockets refuse it with 4400.

A query parameter other than these is refused with 422 naming it, as every API operation
refuses one (:func:`controlplane.api.refuse_unknown_parameters`): the websockets' other
spellings of the cursor, ``after_seq`` and ``after`` on the global feed, included, since
a cursor under a name that was ignored would replay the log from 0.

``wait`` (0-30 s) long-polls when nothing is after the cursor; such a request holds one of
its account's ``USER_LONG_POLL_LIMIT`` long-poll slots while it runs, and is answered 429
with ``Retry-After`` beyond them (:mod:`controlplane.sockets.slots`). The view is ``async``, reads
the log every ``FEED_LONG_POLL_SECONDS`` (0.2 s) and reads earlier on a channel-layer
hint from :mod:`controlplane.sockets.notify` (see :func:`long_poll`). The reads themselves are
:mod:`controlplane.reads.feed`, shared with the websocket consumers.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from contextlib import suppress
from datetime import datetime
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest
from ninja import Field, Query, Router, Schema

from controlplane.api.auth import caller
from controlplane.api.types import PathText
from controlplane.errors import Conflict
from controlplane.reads import feed as log
from controlplane.reads.feed import MAX_CURSOR
from controlplane.sockets import slots
from controlplane.sockets.notify import GLOBAL_GROUP, following, session_group
from controlplane.web import rates

router = Router(tags=["changes"])

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
MAX_WAIT = 30.0

T = TypeVar("T")

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
    :class:`~controlplane.sockets.notify.HintHub`. Under a WSGI server or Django's test client,
    an async view runs in an event loop of its own that ends with the request; a hub
    there would subscribe for one request and hold up the loop's shutdown (a Redis read
    in flight), so such a long-poll just polls.
    """
    if wait <= 0:
        return await read()
    deadline = time.monotonic() + wait
    async with contextlib.AsyncExitStack() as stack:
        # Refused (429) before any read when the account has its long-polls waiting.
        await stack.enter_async_context(slots.long_poll_slot(caller(request).pk, wait))
        result = await read()
        if found(result):
            return result
        hinted = asyncio.Event()  # never set without hints
        if isinstance(request, ASGIRequest):
            hinted = await stack.enter_async_context(following(group))
        while True:
            hinted.clear()
            result = await read()  # following now: a hint for a commit from here on is seen
            remaining = deadline - time.monotonic()
            if found(result) or remaining <= 0:
                return result
            with suppress(TimeoutError):  # the wait is not the server's time: not charged
                async with rates.waiting(request), asyncio.timeout(
                        min(settings.FEED_LONG_POLL_SECONDS, remaining)):
                    await hinted.wait()


# -- the API -------------------------------------------------------------------------------


def past_the_newest(name: str, after: int, newest: int) -> None:
    """Refuse (409, naming it) a cursor past the newest position: this feed never sent it
    (another database's, or one made up), and a long-poll on it would wait, and a read
    answer nothing, until the log passed it. Well-formed, it conflicts with the log."""
    if after > newest:
        raise Conflict(f"{name}: {after} is past the newest position ({newest}); send the "
                       "last one you received")


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
    snapshot: dict[str, Any] | None = Field(
        None,
        description="only when retention removed commits after `after`: the session's "
        "current state at `snapshot.seq` (records as stored); `changes` then follow "
        "`snapshot.seq`, and the next `after` is the last of them, or `snapshot.seq`",
    )


class GlobalChanges(Schema):
    after_id: int
    last_id: int = Field(..., description="pass as `after_id` to read on from here")
    changes: list[GlobalChange]


LONG_POLL_REFUSED = {"responses": {"409": {
    "description": "The cursor is past the newest position: send the last one you received",
    "content": {"application/json": {"schema": {
        "type": "object", "properties": {"detail": {"type": "string"}},
        "required": ["detail"]}}},
}, "429": {
    "description": "The account has USER_LONG_POLL_LIMIT long-polls waiting already "
                   "(only when `wait` > 0); try again after `Retry-After` seconds",
    "headers": {"Retry-After": {"schema": {"type": "integer"}}},
    "content": {"application/json": {"schema": {
        "type": "object", "properties": {"detail": {}}, "required": ["detail"]}}},
}}}
LIMIT_HELP = "at most this many changes"
WAIT_HELP = "seconds to wait for a change when none is there yet (long-poll)"


@router.get("/sessions/{session_id}/changes", response=SessionChanges,
            openapi_extra=LONG_POLL_REFUSED)
async def session_changes(
    request: HttpRequest,
    session_id: PathText,
    after: int = Query(
        0, ge=0, le=MAX_CURSOR, description="the last seq you have; 0 for everything"
    ),
    limit: int = Query(DEFAULT_LIMIT, ge=1, le=MAX_LIMIT, description=LIMIT_HELP),
    wait: float = Query(0.0, ge=0, le=MAX_WAIT, allow_inf_nan=False, description=WAIT_HELP),
) -> Any:
    """One session's commits after seq ``after``, in seq order (404 if no such session)."""
    async def read() -> log.SessionPage:
        page = await sync_to_async(log.session_page)(session_id, after, limit)
        past_the_newest("after", after, page.head_seq)
        return page

    page = await long_poll(
        request, read, lambda page: bool(page.changes or page.state),
        session_group(session_id), wait,
    )
    return {"session_id": session_id, "head_seq": page.head_seq, "changes": page.changes,
            "snapshot": page.state}


@router.get("/changes", response=GlobalChanges, openapi_extra=LONG_POLL_REFUSED)
async def global_changes(
    request: HttpRequest,
    after_id: int = Query(
        0, ge=0, le=MAX_CURSOR, description="the last commit id you have; 0 for everything"
    ),
    limit: int = Query(DEFAULT_LIMIT, ge=1, le=MAX_LIMIT, description=LIMIT_HELP),
    wait: float = Query(0.0, ge=0, le=MAX_WAIT, allow_inf_nan=False, description=WAIT_HELP),
) -> Any:
    """Every session's commits after commit id ``after_id``, in id order.

    Ids have gaps (a rolled-back commit uses one up); a commit is served only once
    every smaller id is either served or gone for good, so ``last_id`` is a safe cursor.
    """
    async def read() -> list[Any]:
        rows = await log.settled_global(after_id, limit)
        if not rows and after_id:
            past_the_newest("after_id", after_id, await sync_to_async(log.newest_commit_id)())
        return rows

    rows = await long_poll(request, read, bool, GLOBAL_GROUP, wait)
    changes = [log.change(r) for r in rows]
    return {
        "after_id": after_id,
        "last_id": changes[-1]["id"] if changes else after_id,
        "changes": changes,
    }
