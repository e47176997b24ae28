"""Hints to live views: "commit N happened", never its data (DESIGN §5.6, §9).

The commit log in Postgres is the change feed. A websocket consumer (or a long-polling
REST request) that is told "session S reached seq N" or "commit id N exists" reads the
log after the last position it served; a hint that is lost, late, duplicated or out of
order therefore changes nothing but latency, and consumers poll the log anyway so that
a dropped hint (``channels_redis`` drops group messages for a channel over capacity and
expires them after a minute: DESIGN §13) is caught up within a poll interval.

:class:`Notifier` is a kernel after-commit listener (and preview listener). It hands the
hint to a daemon thread and returns at once, so a slow or absent Redis never slows a
commit down; the thread coalesces what queued up meanwhile (per session only the highest
seq, globally only the highest id, per previewed path only the latest value) and sends
it with ``group_send`` on its own event loop. After a send it waits ``gap`` seconds
before the next, so that a run of commits (a task running phase after phase, 1,000
a second) costs a send every ``gap``, not one per commit: the first hint after a quiet
spell goes out at once, later ones at most ``gap`` late. Sending, and signalling the
thread at all, would otherwise cost the committing thread time a commit in contention
for the interpreter. A failure is logged
and forgotten. The hint is released at once for the usual kernel commit (it owns its
transaction), and by ``transaction.on_commit`` not before the outermost transaction
commits when a commit runs inside an ``atomic`` block (invariant 2: nothing is
observable before its commit is durable).

:class:`HintHub` is the receiving end in the web process: one channel per process that
joins the groups its sockets and long-polls follow, and passes each hint on to them.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import queue
import re
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from channels.layers import get_channel_layer
from django.db import connections, transaction

from kernel.records import WriteSet
from kernel.session import Preview

log = logging.getLogger(__name__)

GLOBAL_GROUP = "commits"
"""Every commit's id is hinted here: the global feed (``ws/feed/``, ``GET /api/changes``)."""
HINT = "feed.hint"
"""The message type. Every hint names its ``group``; a session group's hint also carries
``session_id`` and ``seq``, the global group's the commit ``id``. A session group's
message may carry ``previews`` instead of (or besides) ``seq``: progress that is not
committed (:class:`kernel.Preview`), which is data, not a hint, and may be lost."""
SEND_TIMEOUT = 5.0
QUEUE_SIZE = 10_000
GAP_SECONDS = 0.02
"""Time between two sends of a notifier: what gathers a run of commits' hints into one send."""
_GROUP_SAFE = re.compile(r"^[A-Za-z0-9_.-]{1,80}$")


def session_group(session_id: str) -> str:
    """The Channels group of one session's feed: ``session.<id>``.

    Group names allow ``[A-Za-z0-9_.-]`` and fewer than 100 characters; an id outside
    that (not one the kernel makes) is hashed rather than refused.
    """
    if _GROUP_SAFE.match(session_id):
        return f"session.{session_id}"
    return "session.h" + hashlib.sha256(session_id.encode()).hexdigest()[:40]


@dataclass(frozen=True)
class Hint:
    session_id: str
    seq: int
    id: int
    tasks: tuple[str, ...] = ()
    """Tasks the commit wrote that showed previews from this process: it holds the
    previews they made before it (the page drops them even if it read the commit first)."""


PREVIEWED_MAX = 10_000
"""How many tasks with previews a notifier remembers until one of their commits."""


class Notifier:
    """Sends hints for durable commits to the session's group and the global group."""

    def __init__(
        self, using: str = "default", alias: str = "default", gap: float = GAP_SECONDS
    ) -> None:
        self.using = using
        self.alias = alias
        self.gap = gap
        self._lock = threading.Lock()
        self._pid = 0
        self._queue: queue.Queue[Hint | Preview] = queue.Queue(QUEUE_SIZE)
        self._thread: threading.Thread | None = None
        self._dropped = 0
        self._previewed: set[str] = set()

    def after_commit(self, write_set: WriteSet) -> None:
        """The kernel listener: queue a hint once the commit is durable."""
        commit = write_set.commit
        held = tuple(t.id for t in write_set.updated_tasks if t.id in self._previewed)
        self._previewed.difference_update(held)
        hint = Hint(commit.session_id, commit.seq, commit.id, held)
        if not connections[self.using].in_atomic_block:
            self.hint(hint)  # what on_commit would do at once, without its overhead
        else:
            transaction.on_commit(lambda: self.hint(hint), using=self.using)

    def hint(self, hint: Hint) -> None:
        self._put(hint)

    def preview(self, preview: Preview) -> None:
        """The kernel's preview listener: progress goes to the session's live views at
        once. It is not durable and has no commit to wait for; losing it is harmless."""
        if len(self._previewed) >= PREVIEWED_MAX:  # tasks that never committed here again
            self._previewed.clear()
        self._previewed.add(preview.task_id)
        self._put(preview)

    def _put(self, item: Hint | Preview) -> None:
        self._ensure_thread()
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            # Harmless: consumers poll the log. Say so once in a while, not per commit.
            self._dropped += 1
            if self._dropped % 1000 == 1:
                log.warning("feed hints: queue full, %d hints dropped so far", self._dropped)

    def _ensure_thread(self) -> None:
        pid = os.getpid()
        if self._pid == pid and self._thread is not None and self._thread.is_alive():
            return
        with self._lock:
            if self._pid != pid:
                # A forked child inherits the queue's state but not the thread.
                self._queue = queue.Queue(QUEUE_SIZE)
                self._pid = pid
                self._thread = None
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="feed-notifier", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        sent = -float("inf")
        try:
            while True:
                batch = [self._queue.get()]
                pause = sent + self.gap - time.monotonic()
                if pause > 0:
                    time.sleep(pause)  # hints of the commits meanwhile join this send
                while True:
                    try:
                        batch.append(self._queue.get_nowait())
                    except queue.Empty:
                        break
                try:
                    loop.run_until_complete(self._send(batch))
                except Exception:
                    log.warning("feed hints: could not send %d hint(s)", len(batch), exc_info=True)
                sent = time.monotonic()
        finally:  # only reached if the interpreter tears the thread down
            loop.close()

    async def _send(self, batch: list[Hint | Preview]) -> None:
        layer = get_channel_layer(self.alias)
        if layer is None:
            return
        hints = [item for item in batch if isinstance(item, Hint)]
        latest: dict[str, int] = {}
        for hint in hints:
            latest[hint.session_id] = max(latest.get(hint.session_id, 0), hint.seq)
        held: dict[str, dict[str, int]] = {}  # by session: task -> its newest commit's seq
        for hint in hints:
            for task_id in hint.tasks:
                tasks = held.setdefault(hint.session_id, {})
                tasks[task_id] = max(tasks.get(task_id, 0), hint.seq)
        messages: dict[str, dict[str, Any]] = {
            session_group(sid): {"session_id": sid, "seq": seq,
                                 **({"held": held[sid]} if sid in held else {})}
            for sid, seq in latest.items()
        }
        if hints:
            messages[GLOBAL_GROUP] = {"id": max(hint.id for hint in hints)}
        previews: dict[tuple[Any, ...], Preview] = {}  # only the latest value per path
        for item in batch:
            if isinstance(item, Preview):
                previews[(item.task_id, item.kind, item.key, item.path)] = item
        for preview in previews.values():
            message = messages.setdefault(
                session_group(preview.session_id), {"session_id": preview.session_id}
            )
            message.setdefault("previews", []).append({
                "task_id": preview.task_id, "kind": preview.kind, "key": preview.key,
                "path": list(preview.path), "value": preview.value,
                "after": preview.after_seq,
            })
        sends = [
            layer.group_send(group, {"type": HINT, "group": group, **message})
            for group, message in messages.items()
        ]
        started = time.monotonic()
        results = await asyncio.wait_for(
            asyncio.gather(*sends, return_exceptions=True), SEND_TIMEOUT
        )
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            log.warning(
                "feed hints: %d of %d group sends failed after %.3fs: %r",
                len(failed), len(results), time.monotonic() - started, failed[0],
            )


# -- receiving hints ----------------------------------------------------------------------

Follower = Callable[[dict[str, Any]], None]
RENEW_SECONDS = 60.0
"""How often the hub re-joins its groups (channels_redis forgets a member after
``group_expiry``, and all of them when Redis restarts) and leaves unfollowed ones."""


class HintHub:
    """The one channel-layer channel of this process (event loop) that receives hints.

    Sockets and long-polls *follow* a group here instead of each holding a channel of
    their own: channels_redis fans a group message out to every member channel of a
    process and every waiting receiver then runs its own receive round, a cost per
    socket per hint; the hub receives each hint once
    and calls each follower (which should only set an event).

    Group membership is renewed every :data:`RENEW_SECONDS`, and after Redis comes back
    from a failure; a group nobody follows any more is left at the next renewal. A hint
    lost meanwhile costs only latency: followers poll the log anyway.
    """

    def __init__(self, alias: str = "default") -> None:
        self.alias = alias
        self.followers: dict[str, set[Follower]] = {}
        self.joined: set[str] = set()
        self.layer: Any = None
        self.channel: str | None = None
        self._started: asyncio.Future[None] | None = None
        self._tasks: list[asyncio.Task[None]] = []

    async def follow(self, group: str, follower: Follower) -> None:
        self.followers.setdefault(group, set()).add(follower)
        if self._started is None:
            self._started = asyncio.get_running_loop().create_future()
            self.layer = get_channel_layer(self.alias)
            if self.layer is not None:
                self.channel = await self.layer.new_channel()
                loop = asyncio.get_running_loop()
                self._tasks = [loop.create_task(self._receive()), loop.create_task(self._renew())]
            self._started.set_result(None)
        await self._started
        if group not in self.joined and self.layer is not None:
            await self._join(group)

    def unfollow(self, group: str, follower: Follower) -> None:
        followers = self.followers.get(group)
        if followers is not None:
            followers.discard(follower)

    async def _join(self, group: str) -> None:
        try:
            await self.layer.group_add(group, self.channel)
            self.joined.add(group)
        except Exception as exc:
            cancelled_meanwhile(exc)
            self.joined.discard(group)
            log.warning("feed hints: could not join %s (%r); polling only for now", group, exc)

    async def renew(self) -> None:
        """Re-join every followed group; leave the others."""
        for group in list(self.joined | set(self.followers)):
            if self.followers.get(group):
                await self._join(group)
            else:
                self.followers.pop(group, None)
                self.joined.discard(group)
                try:
                    await self.layer.group_discard(group, self.channel)
                except Exception as exc:
                    cancelled_meanwhile(exc)

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(RENEW_SECONDS)
            await self.renew()

    async def _receive(self) -> None:
        delay = 0.5
        while True:
            try:
                message = await self.layer.receive(self.channel)
            except Exception as exc:
                cancelled_meanwhile(exc)
                log.warning("feed hints: channel layer unavailable (%r); polling only for "
                            "%.1fs", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
                await self.renew()  # a restarted Redis has forgotten the groups
                continue
            delay = 0.5
            for follower in list(self.followers.get(message.get("group", ""), ())):
                try:
                    follower(message)
                except Exception:
                    log.exception("feed hints: a follower failed")


def cancelled_meanwhile(exc: Exception) -> None:
    """Re-raise as a cancellation if this task was cancelled during the failed call.

    redis-py can turn the CancelledError of an interrupted read into one of its own
    errors; retrying then would keep a cancelled task alive (and hang the shutdown of
    its event loop).
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError() from exc


_hubs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, HintHub] = (
    weakref.WeakKeyDictionary()
)


def hint_hub() -> HintHub:
    """The running event loop's hub (one per Daphne process)."""
    loop = asyncio.get_running_loop()
    hub = _hubs.get(loop)
    if hub is None:
        hub = _hubs[loop] = HintHub()
    return hub


@contextlib.asynccontextmanager
async def following(group: str) -> AsyncIterator[asyncio.Event]:
    """An event that a hint for ``group`` sets, while the block runs."""
    hinted = asyncio.Event()

    def on_hint(message: dict[str, Any]) -> None:
        hinted.set()

    hub = hint_hub()
    try:
        await hub.follow(group, on_hint)
        yield hinted
    finally:
        hub.unfollow(group, on_hint)
