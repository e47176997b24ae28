"""The change feed over websockets (DESIGN §9): replay from the commit log, then live.

Routes (:data:`controlplane.sockets.routes.websocket_urlpatterns`):

``ws/sessions/<session_id>/feed/``
    one session's commits, by ``seq`` (gapless, per session);
``ws/feed/``
    every session's commits, by global commit ``id`` (increasing, with gaps).

Protocol, JSON text frames both ways:

1. Authenticate: a browser's Django session (cookie), an ``Authorization: Bearer <api
   token>`` header on the handshake, or a first message ``{"token": "..."}``. Never in
   the URL, where proxies log it: ``?token=`` is refused with 4400. The account needs
   the viewer or the operator role; otherwise the socket is closed with code 4403.
   While the socket is open its credential is checked again every
   ``WEBSOCKET_RECHECK_SECONDS`` (5 s): a revoked or expired token, or a login session
   that ended (logout, expiry, password change), closes it with 4401; an account that
   lost its role (or was deactivated), with 4403.
2. Send the cursor in-band: ``{"after": N}`` (the last seq, or for ``ws/feed/`` the last
   commit id, you have; 0 for everything); it may share the first message with the
   token. ``?after=N`` in the URL is accepted too and starts the stream at once (or as
   soon as a first message authenticates, if the token comes that way); a later
   ``{"after": N}`` may move the cursor forward, never back. A socket that sends no
   cursor within :data:`OPENING_SECONDS` is closed with 4408.
3. Receive ``{"type": "commit", "session_id", "seq", "id", "at", "actor", "summary"}`` for
   every commit after the cursor, in order, each exactly once on this socket; and
   ``{"type": "heartbeat", "seq": last}`` (``"id"`` on ``ws/feed/``) when nothing was sent
   for ``FEED_HEARTBEAT_SECONDS``. Reconnect at any time with the last seq/id you saw.
   On a session feed, ``{"type": "preview", "task_id", "kind", "key", "path", "value",
   "after"}`` frames carry progress that is not committed yet (streamed model text, tool
   output): outside the seq order, latest value wins, possibly lost; a commit after seq
   ``after`` (the task's last commit before the preview) holds it.
   A client that asks for it with ``"batch": true`` (or ``?batch=1``) receives instead
   ``{"type": "commits", "commits": [<commit frame>, ...]}``: the commits of one read of
   the log, up to :data:`FRAME_COMMITS` per frame, in order. Catching up on a long log
   then costs a few frames instead of one per commit (per-frame overhead dominates).
   On a session feed, a cursor below the session's ``pruned_seq`` (retention removed the
   commits after it: kernel.retention) gets one ``{"type": "snapshot", "session_id",
   "seq", "pruned_seq", "session", "conversations", "tasks", "submissions",
   "documents"}`` frame, the session's current state at ``seq``, and then the commits
   after ``seq`` as usual: the cursor moves to ``seq``. Never batched.

Other close codes: 4400 a malformed message (not a JSON object, nested past the parser,
or holding a field besides ``token``, ``after`` and ``batch``) or cursor, a starting
cursor past the newest seq (or id) there is, which this feed never sent (another
database's), a token in the URL, or a URL holding text the database cannot store (NUL,
broken Unicode: what an HTTP request is refused with 422 for); 4404 no
such session, 4429 the account has ``USER_SOCKET_LIMIT`` sockets open already
(:mod:`controlplane.sockets.slots`; close one, or wait for one to end), 1011 the log could not
be read (reconnect), 4503 the server is stopping (reconnect, to another web process
behind the same address; controlplane.sockets.shutdown). Daphne closes idle sockets after its
``--websocket_timeout``; clients reconnect with their cursor whatever the close code.

How it stays exact: every frame comes from the commit log (the data of record), read
after the last position this socket sent. A channel-layer hint (sent by
:class:`~controlplane.sockets.notify.Notifier`, received once per process by
:class:`~controlplane.sockets.notify.HintHub`) only tells the reader to read; the reader
also reads every ``FEED_POLL_SECONDS`` without one. So a duplicate hint cannot produce a
duplicate frame, a dropped hint (``channels_redis`` over capacity or expired, Redis down)
delays a frame by at most a poll interval, and a gap is impossible: each read returns
everything after the cursor. Live readers of the same cursor in one process share one query
(:class:`~controlplane.sockets.sharing.SharedReads`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from contextlib import suppress
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from controlplane import access
from controlplane.reads.feed import (
    FRAME_COLUMNS,
    MAX_CURSOR,
    SNAPSHOT_FRAME,
    catch_up_frames,
    frame,
    newest_commit_id,
    session_exists,
    session_head,
    settled_global,
)
from controlplane.sockets import feed_subscribers, shutdown, slots
from controlplane.sockets.notify import GLOBAL_GROUP, hint_hub, session_group
from controlplane.sockets.sharing import shared_reads
from controlplane.web.middleware import unstorable_url

log = logging.getLogger(__name__)

BATCH = 500
"""Commits per read: the first read of a socket and every live one."""
REPLAY_BATCH = 2000
"""Commits per read once a socket is replaying (its previous read came back full); the
next page is read while this one is being sent."""
YIELD_EVERY = 200
"""Frames sent between two yields to the event loop, so that a long replay does not
hold up the other sockets of the process."""
FRAME_COMMITS = 500
"""Commits per frame for a client that asked for batched frames."""
OPENING_SECONDS = 10.0

MESSAGE_FIELDS = ("token", "after", "batch")
"""What a client's message may hold; another field is refused (4400, naming it)."""

REFUSED = 4403
ENDED = 4401
BAD_REQUEST = 4400
NOT_FOUND = 4404
TOO_SLOW = 4408
SERVER_ERROR = 1011

Rows = list[tuple[int, str]]


def _token_user(key: str) -> Any:
    """The active user with a role that this API token belongs to, or None."""
    user = access.token_user(key)
    return user if access.may_read(user) else None


def _bearer(scope: Any) -> str | None:
    """The token of an ``Authorization: Bearer`` handshake header, if any."""
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    return None


def _commits_frame(texts: list[str]) -> str:
    """Several commit frames (JSON texts) as one ``commits`` frame, without re-encoding."""
    return '{"type":"commits","commits":[' + ",".join(texts) + "]}"


def _cursor(value: Any) -> int | None:
    """A cursor from a message (an int) or the URL (digits); None if it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str) and value.isascii() and value.isdigit():
        value = int(value)
    if isinstance(value, int) and 0 <= value <= MAX_CURSOR:
        return value
    return None


class FeedConsumer(AsyncWebsocketConsumer):
    """One socket of a feed; subclasses say which log and which cursor."""

    cursor_name = "seq"
    # No channel per socket: hints arrive through the process's HintHub (notify.py), which
    # receives each one once however many sockets follow the group.
    channel_layer_alias = None

    # -- what differs between the session feed and the global one --------------------

    @property
    def group(self) -> str:
        raise NotImplementedError

    async def exists(self) -> bool:
        return True

    async def read(self, after: int, limit: int) -> Rows:
        raise NotImplementedError

    async def head(self) -> int:
        """The newest position this feed can have sent (read on the primary)."""
        raise NotImplementedError

    # -- connection life -------------------------------------------------------------------

    async def connect(self) -> None:
        self.last: int | None = None
        self.user: Any = None
        self.subscribed = False
        self.changed = asyncio.Event()
        self.pump: asyncio.Task[None] | None = None
        self.opening: asyncio.Task[None] | None = None
        self.watch: asyncio.Task[None] | None = None
        self.slot: slots.Slot | None = None
        self.keeper: asyncio.Task[None] | None = None
        self.credential: access.Credential | None = None
        self.closing = False
        self.url_after: int | None = None  # the URL's cursor, until a token message comes
        await self.accept()
        shutdown.track(self)  # closed with 4503 if this process stops
        query_string = self.scope.get("query_string", b"").decode("latin-1")
        problem = unstorable_url(self.scope.get("path", ""), query_string)
        if problem is not None:
            return await self.refuse(BAD_REQUEST, problem)
        query = parse_qs(query_string)
        if "token" in query:
            return await self.refuse(
                BAD_REQUEST, "never put a token in a URL: send it in the first message "
                "or an Authorization header"
            )
        self.batched = query.get("batch", ["0"])[-1] in ("1", "true")
        user = self.scope.get("user")
        bearer = _bearer(self.scope)
        if bearer is None and user is not None \
                and await database_sync_to_async(access.may_read)(user):
            self.user = user
            session = self.scope.get("session")
            self.credential = access.Credential(
                user.pk, session_key=getattr(session, "session_key", None) or ""
            )
        elif bearer is not None and not await self.authenticate(bearer):
            return
        after = None
        for name in ("after", f"after_{self.cursor_name}"):
            if name in query:
                after = _cursor(query[name][-1])
                if after is None:
                    return await self.refuse(BAD_REQUEST, f"`{name}` must be a whole number")
        if self.user is not None and not await self.subscribe():
            return
        if self.user is not None and after is not None:
            self.start(after)
        else:
            self.url_after = after
            self.opening = asyncio.get_running_loop().create_task(self.opening_timeout())

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if self.closing:
            return
        try:
            message = json.loads(text_data if text_data is not None else bytes_data or b"")
        except (ValueError, RecursionError):  # RecursionError: nested past the parser
            message = None
        if not isinstance(message, dict):
            return await self.refuse(BAD_REQUEST, "send JSON objects")
        unknown = sorted(set(message) - set(MESSAGE_FIELDS))
        if unknown:  # ignored, a cursor under another name would go unheeded
            # A close's reason holds 123 bytes at most: the names, cut, in ASCII.
            named = ", ".join(unknown).encode("ascii", "backslashreplace").decode()[:60]
            return await self.refuse(BAD_REQUEST, f"unknown field {named}: a message takes "
                                     f"{', '.join(MESSAGE_FIELDS)}")
        if self.user is None:
            token = message.get("token")
            if not isinstance(token, str) or not await self.authenticate(token):
                if not self.closing:
                    await self.refuse(REFUSED, "authenticate first: a viewer or operator token")
                return
            if not await self.subscribe():
                return
        if "batch" in message:
            if not isinstance(message["batch"], bool):
                return await self.refuse(BAD_REQUEST, "`batch` must be true or false")
            self.batched = message["batch"]
        if "after" in message:
            after = _cursor(message["after"])
            if after is None:
                return await self.refuse(BAD_REQUEST, "`after` must be a whole number")
            if self.pump is None:
                self.start(after)
            elif self.last is not None and after > self.last:
                self.last = after  # forward only: nothing is ever sent twice on one socket
        elif self.pump is None and self.url_after is not None:
            self.start(self.url_after)  # the token came in this message, the cursor in the URL

    def heartbeat_frame(self) -> str:
        return json.dumps({"type": "heartbeat", self.cursor_name: self.last})

    async def disconnect(self, code: int) -> None:
        self.stop()
        await self.give_slot_back()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:  # also when the consumer dies of an error: no task or follower left behind
            self.stop()
            await self.give_slot_back()

    def stop(self) -> None:
        self.closing = True
        shutdown.forget(self)
        for task in (getattr(self, "pump", None), getattr(self, "opening", None),
                     getattr(self, "watch", None), getattr(self, "keeper", None)):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        if getattr(self, "subscribed", False):
            self.subscribed = False
            feed_subscribers.left()
            hint_hub().unfollow(self.group, self.on_hint)

    async def give_slot_back(self) -> None:
        slot = getattr(self, "slot", None)  # None too if the socket never got to connect()
        if slot is not None:
            await slot.release()

    def on_hint(self, hint: dict[str, Any]) -> None:
        """A commit happened: tell the reader unless this socket has sent it already.
        Previews that come along are passed on as they are (they are not in the log)."""
        previews = hint.get("previews")
        if isinstance(previews, list) and self.last is not None and not self.closing:
            asyncio.get_running_loop().create_task(self.send_previews(previews))
            if self.cursor_name not in hint:
                return
        value = hint.get(self.cursor_name)
        if self.last is None or not isinstance(value, int) or value > self.last:
            self.changed.set()

    # -- steps -------------------------------------------------------------------------------

    async def authenticate(self, token: str) -> bool:
        self.user = await database_sync_to_async(_token_user)(token)
        if self.user is None:
            await self.refuse(REFUSED, "this token has no viewer or operator role")
            return False
        self.credential = access.Credential(self.user.pk, token_digest=access.digest(token))
        return True

    async def recheck(self) -> None:
        """Close the socket soon after its credential stops standing (module docstring)."""
        assert self.credential is not None
        while not self.closing:
            await asyncio.sleep(settings.WEBSOCKET_RECHECK_SECONDS)
            try:
                verdict = await database_sync_to_async(access.recheck)(self.credential)
            except Exception:  # the database is away: the feed's own reads will say so
                log.warning("feed: could not re-check a socket's credential", exc_info=True)
                continue
            if verdict == access.ENDED:
                return await self.refuse(ENDED, "the token or login session has ended")
            if verdict == access.NO_ROLE:
                return await self.refuse(REFUSED, "this account no longer has a role")

    async def hold_slot(self) -> bool:
        """Take one of the account's socket slots for as long as the socket is open."""
        if self.slot is not None:
            return True
        self.slot = await slots.take(slots.SOCKETS, self.user.pk)
        if self.slot is None:
            await self.refuse(slots.TOO_MANY_SOCKETS, f"this account has its "
                              f"{slots.limit(slots.SOCKETS)} sockets open: close one")
            return False
        if self.closing:  # the client left while the slot was being taken
            await self.slot.release()
            return False
        self.keeper = asyncio.get_running_loop().create_task(self.slot.keep())
        return True

    async def subscribe(self) -> bool:
        if not await self.hold_slot():
            return False
        if not await self.exists():
            await self.refuse(NOT_FOUND, "no such session")
            return False
        self.subscribed = True  # failures are logged by the hub: polling serves the feed
        if self.credential is not None and self.watch is None:
            self.watch = asyncio.get_running_loop().create_task(self.recheck())
        feed_subscribers.joined()
        await hint_hub().follow(self.group, self.on_hint)
        return True

    async def refuse(self, code: int, reason: str) -> None:
        if self.closing:
            return
        self.closing = True
        if self.opening is not None and self.opening is not asyncio.current_task():
            self.opening.cancel()
        await self.close(code=code, reason=reason)

    async def opening_timeout(self) -> None:
        await asyncio.sleep(OPENING_SECONDS)
        if self.pump is None:
            await self.refuse(TOO_SLOW, "send {\"after\": N} (and a token) on opening")

    async def past_the_head(self, after: int) -> bool:
        """Refuse a starting cursor past the newest position, which this feed never sent
        (another database's, or one made up): following it would send nothing until the
        log passed it, and say nothing about it either. A cursor moved forward in-band
        later is the client saying what it has already, and is taken as it is."""
        if after == 0:
            return False
        head = await self.head()
        if after <= head:
            return False
        await self.refuse(BAD_REQUEST, f"`after` is past the newest {self.cursor_name} "
                          f"({head}): send the last one you received")
        return True

    def start(self, after: int) -> None:
        self.last = after
        if self.opening is not None:
            self.opening.cancel()
        self.pump = asyncio.get_running_loop().create_task(self.stream())

    async def stream(self) -> None:
        """Replay, then follow the log: read after the last sent position whenever a
        hint arrives, every poll interval anyway, and send a heartbeat when quiet."""
        loop = asyncio.get_running_loop()
        poll = settings.FEED_POLL_SECONDS
        heartbeat = settings.FEED_HEARTBEAT_SECONDS
        quiet_since = loop.time()
        ahead: asyncio.Task[Rows] | None = None  # the next page, read while this one is sent
        try:
            assert self.last is not None
            if await self.past_the_head(self.last):
                return
            while True:
                assert self.last is not None
                if ahead is not None:
                    # Read before the hints that came since: they stay set, and are
                    # read for once the replay ends.
                    rows, ahead = await ahead, None
                    limit = REPLAY_BATCH
                else:
                    self.changed.clear()  # this read covers every hint so far
                    rows = await self.read(self.last, limit := BATCH)
                if len(rows) >= limit:
                    ahead = loop.create_task(self.read(rows[-1][0], REPLAY_BATCH))
                await self.send_rows(rows)
                if rows:
                    quiet_since = loop.time()
                if ahead is not None:
                    continue  # replaying
                due = quiet_since + heartbeat - loop.time()
                if due <= 0:
                    await self.send(text_data=self.heartbeat_frame())
                    quiet_since = loop.time()
                    due = heartbeat
                with suppress(TimeoutError):
                    async with asyncio.timeout(min(poll, due)):
                        await self.changed.wait()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("feed: reading %s after %s failed; closing", self.group, self.last)
            await self.refuse(SERVER_ERROR, "the commit log could not be read; reconnect")
        finally:
            if ahead is not None:
                ahead.cancel()

    async def send_previews(self, previews: list[dict[str, Any]]) -> None:
        """Progress not committed yet: ``{"type": "preview", "task_id", "kind", "key",
        "path", "value"}`` frames, outside the seq order; the next commit holds the value."""
        with suppress(Exception):  # the socket may be closing: a preview may be lost
            for preview in previews:
                await self.send(text_data=json.dumps({"type": "preview", **preview}))

    async def send_rows(self, rows: Rows) -> None:
        """Send the rows after the cursor: a frame each, or batched if the client asked."""
        if rows and rows[0][1].startswith(SNAPSHOT_FRAME):  # alone, never in a batch
            await self.send(text_data=rows[0][1])
            self.last = max(self.last or 0, rows[0][0])
            rows = rows[1:]
        per_frame = FRAME_COMMITS if self.batched else 1
        for frames, start in enumerate(range(0, len(rows), per_frame), 1):
            # Filtered at the last moment: the client may have moved its cursor on.
            assert self.last is not None
            chunk = [(p, text) for p, text in rows[start:start + per_frame] if p > self.last]
            if not chunk:
                continue
            texts = [text for _, text in chunk]
            await self.send(text_data=_commits_frame(texts) if self.batched else texts[0])
            self.last = max(self.last, chunk[-1][0])
            if frames % YIELD_EVERY == 0:
                await asyncio.sleep(0)


class SessionFeedConsumer(FeedConsumer):
    cursor_name = "seq"

    @property
    def session_id(self) -> str:
        return str(self.scope["url_route"]["kwargs"]["session_id"])

    @property
    def group(self) -> str:
        return session_group(self.session_id)

    async def exists(self) -> bool:
        return bool(await database_sync_to_async(session_exists)(self.session_id))

    async def head(self) -> int:
        return await database_sync_to_async(session_head)(self.session_id) or 0

    async def read(self, after: int, limit: int) -> Rows:
        session_id = self.session_id

        async def query() -> Rows:
            return await database_sync_to_async(catch_up_frames)(session_id, after, limit)

        return await shared_reads.read(("session", session_id, after, limit), query)



class GlobalFeedConsumer(FeedConsumer):
    cursor_name = "id"

    @property
    def group(self) -> str:
        return GLOBAL_GROUP

    async def head(self) -> int:
        return int(await database_sync_to_async(newest_commit_id)())

    async def read(self, after: int, limit: int) -> Rows:
        async def query() -> Rows:
            rows = await settled_global(
                after, limit, select=FRAME_COLUMNS, run=database_sync_to_async
            )
            return [(row[0], frame(row)) for row in rows]

        return await shared_reads.read(("global", after, limit), query)
