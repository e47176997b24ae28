"""A web process that stops (SIGTERM: a deploy, a scale-down) closes its websockets first.

Daphne stops its Twisted reactor on SIGTERM; left alone, the sockets would just drop (a
client sees 1006, abnormal closure). Instead every open feed socket gets a close frame
with code 4503 (server stopping) before the reactor shuts down, and the client
reconnects, to another web process behind the proxy, with the last seq or id it saw:
the feed resends nothing it sent and misses nothing (controlplane.sockets.feed).

The hook is a "before shutdown" trigger on Daphne's reactor, registered when the first
socket opens (never at import: importing the reactor outside Daphne would install the
wrong one).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import weakref
from typing import Any, Protocol

log = logging.getLogger(__name__)

SERVICE_RESTART = 4503
"""The close code: 1012 (service restart) is what the websocket RFC registry has for it,
but Daphne's websocket library only lets a server send 1000 or 3000-4999; 4503 follows
the feed's 4xxx codes that mirror HTTP statuses."""
FLUSH_SECONDS = 0.2
"""Time given to the reactor to write the close frames before it shuts down."""


class Closable(Protocol):
    async def close(self, code: int | None = None, reason: str | None = None) -> None: ...


_open: weakref.WeakSet[Any] = weakref.WeakSet()
_registered = False


def track(socket: Closable) -> None:
    """An open socket, to be closed with 4503 if this process stops."""
    _open.add(socket)
    _register()


def forget(socket: Closable) -> None:
    _open.discard(socket)


def _register() -> None:
    global _registered
    reactor = sys.modules.get("twisted.internet.reactor")
    if _registered or reactor is None:  # not under Daphne: nothing to hook
        return
    reactor.addSystemEventTrigger("before", "shutdown", close_all)  # type: ignore[attr-defined]
    _registered = True


def close_all() -> Any:
    """Close every open socket with 4503; a Deferred the reactor's shutdown waits for."""
    from twisted.internet import defer

    sockets = list(_open)
    if not sockets:
        return None
    log.info("stopping: closing %d websocket(s) with %d", len(sockets), SERVICE_RESTART)

    async def close() -> None:
        results = await asyncio.gather(
            # close(), not the consumers' refuse(): Daphne has cancelled them already
            *(s.close(code=SERVICE_RESTART, reason="server stopping: reconnect with your cursor")
              for s in sockets),
            return_exceptions=True,
        )
        for failed in (r for r in results if isinstance(r, BaseException)):
            log.warning("could not close a websocket: %r", failed)
        await asyncio.sleep(FLUSH_SECONDS)

    return defer.Deferred.fromFuture(asyncio.ensure_future(close()))
