"""Reads and renders shared by the sockets of one process: a commit's hint reaches every
socket that shows its session at about the same time, and each identical read or page
render then runs once for all of them."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any

from controlplane.sockets.page_threads import PAGE_THREADS
from controlplane.sockets.render_turns import RenderTurns, Turn


@dataclass
class _Slot:
    read: Callable[[], Awaitable[Any]]
    queued: asyncio.Future[Any] | None = None


class SharedReads:
    """Identical concurrent reads share one query, and none misses what it asked for.

    A hint reaches every consumer of a session in the process at about the same time;
    without sharing, 100 sockets would run 100 identical queries. A caller joins the
    next read that has not started yet (or starts one): a read that was already
    running when the caller asked might predate the commit it was woken for, so it is
    never joined. At most one read per key runs at a time.
    """

    def __init__(self) -> None:
        self._slots: dict[Hashable, _Slot] = {}

    async def read(self, key: Hashable, read: Callable[[], Awaitable[Any]]) -> Any:
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = _Slot(read)
            asyncio.get_running_loop().create_task(self._drive(key, slot))
        if slot.queued is None:
            slot.queued = asyncio.get_running_loop().create_future()
            # Nobody may be left to take an error: do not let asyncio warn about it.
            slot.queued.add_done_callback(lambda f: f.cancelled() or f.exception())
        return await asyncio.shield(slot.queued)

    async def _drive(self, key: Hashable, slot: _Slot) -> None:
        future: asyncio.Future[Any] | None = None
        try:
            while slot.queued is not None:
                future, slot.queued = slot.queued, None
                try:
                    future.set_result(await slot.read())
                except Exception as exc:
                    future.set_exception(exc)
        finally:
            del self._slots[key]
            # Only if this task itself was cancelled: fail its callers rather than hang them.
            for left in (future, slot.queued):
                if left is not None and not left.done():
                    left.set_exception(RuntimeError("shared read abandoned"))


shared_reads = SharedReads()


RENDERS_KEPT = 64
"""Page views whose latest render a process keeps (one entry per page, role and
parameters watched, or per session page, role and cursor)."""


class SharedRenders:
    """One render of a live page per commit, however many sockets show it.

    A render is keyed by what changes its HTML (the page, the viewer's role, the page's
    parameters; a session page's cursor) and is good for every socket that asks for a
    position it covers: the latest one is kept and handed to each socket that asks for
    no more than it shows, so sockets whose reads are not simultaneous (each polls on its
    own clock, hints get lost, a socket is busy sending) still share it; a socket asking
    while a render for its position runs waits for that one. Other renders are shared as
    :class:`SharedReads` are, and made for the highest position their callers asked for.

    A render waits for its turn on the page threads (:mod:`controlplane.sockets.render_turns`:
    a few at once per account, accounts in turn), and is made, once it has its turn, for
    the highest position asked for while it waited: a page view's re-renders coalesce
    while they wait, so however many commits pass, one render brings it up to date.
    """

    def __init__(self, kept: int = RENDERS_KEPT, turns: RenderTurns | None = None) -> None:
        self.kept = kept
        self.turns = turns if turns is not None else RenderTurns(PAGE_THREADS)
        self._latest: OrderedDict[Hashable, tuple[int, Any]] = OrderedDict()
        self._wanted: dict[Hashable, int] = {}
        self._running: dict[Hashable, tuple[int, asyncio.Future[tuple[int, Any]]]] = {}
        self._askers: dict[Hashable, set[Hashable]] = {}
        self._waiting: dict[Hashable, Turn] = {}
        self._reads = SharedReads()

    async def render(
        self, key: Hashable, at_least: int, render: Callable[[int], Awaitable[tuple[int, Any]]],
        account: Hashable = None,
    ) -> tuple[int, Any]:
        """``render(at)`` (which returns ``(position, result)``, the position at least
        ``at`` unless the data is not there yet) or the kept render of ``key`` if it is at
        ``at_least`` or beyond; ``account`` is whose turn the render waits for."""
        latest = self._latest.get(key)
        if latest is not None and latest[0] >= at_least:
            self._latest.move_to_end(key)
            return latest
        running = self._running.get(key)
        if running is not None and running[0] >= at_least:
            return await asyncio.shield(running[1])
        self._wanted[key] = max(self._wanted.get(key, at_least), at_least)
        waiting = self._waiting.get(key)
        if waiting is not None:
            self.turns.join(waiting, account)  # the waiting render will cover this ask
        else:
            self._askers.setdefault(key, set()).add(account)

        async def fresh() -> tuple[int, Any]:
            target = self._wanted.pop(key, at_least)
            latest = self._latest.get(key)
            if latest is not None and latest[0] >= target:
                self._askers.pop(key, None)
                return latest  # a render made while this one was queued covers it
            turn = self._waiting[key] = self.turns.ask(self._askers.pop(key, {account}))
            try:
                return await self.turns.run(turn, lambda: made_at(target))
            finally:
                if self._waiting.get(key) is turn:
                    del self._waiting[key]

        async def made_at(target: int) -> tuple[int, Any]:
            del self._waiting[key]
            target = max(target, self._wanted.pop(key, target))  # asked while it waited
            done: asyncio.Future[tuple[int, Any]] = asyncio.get_running_loop().create_future()
            done.add_done_callback(lambda f: f.cancelled() or f.exception())
            self._running[key] = (target, done)
            try:
                made = await render(target)
            except BaseException as exc:
                done.set_exception(exc if isinstance(exc, Exception) else
                                   RuntimeError("shared render abandoned"))
                raise
            finally:
                if self._running.get(key, (0, None))[1] is done:
                    del self._running[key]
            done.set_result(made)
            self.keep(key, made)
            return made

        made: tuple[int, Any] = await self._reads.read(key, fresh)
        return made

    def keep(self, key: Hashable, made: tuple[int, Any]) -> None:
        latest = self._latest.get(key)
        if latest is None or made[0] > latest[0]:
            self._latest[key] = made
            self._latest.move_to_end(key)
            while len(self._latest) > self.kept:
                self._latest.popitem(last=False)


shared_renders = SharedRenders()
