"""Per-account slots: how many websockets and long-polls one account holds at once.

One viewer must not be able to load the server for everybody: each open websocket holds
a *socket slot* of its account and each long-polling request (``wait`` > 0) a *long-poll
slot*, up to ``USER_SOCKET_LIMIT`` and ``USER_LONG_POLL_LIMIT`` per account
(``settings.py``; docs/security.md). Beyond them the edge refuses: a socket is closed
with :data:`TOO_MANY_SOCKETS`, a long-poll answered 429 with ``Retry-After``.

The count must hold across every web process behind the same address, so the slots are
in Redis: one sorted set per account and kind, a member per slot scored with the time
it expires (Redis's clock, so that web processes need not agree on theirs). Taking a
slot drops the expired members and counts the rest in one script, so two processes
cannot both take the last one. A holder renews its slot every third of
``USER_SLOT_SECONDS``; a web process that dies without releasing its slots leaks them for
that long at most.

When Redis cannot be reached the slot is granted (and the failure logged): the feeds
keep working without Redis (they poll the log), and a limit that shuts every account
out while Redis restarts would do more harm than the load it prevents.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from django.conf import settings

from controlplane.errors import TooBusy
from controlplane.sockets.notify import cancelled_meanwhile

log = logging.getLogger(__name__)

SOCKETS = "sockets"
LONG_POLLS = "long-polls"
KEY_PREFIX = "dcp:slots"

TOO_MANY_SOCKETS = 4429
"""The close code of a socket over its account's limit (HTTP's 429, as a 4xxx code)."""

RETRY_AFTER_SECONDS = 2
"""What a refused long-poll's ``Retry-After`` says."""

REDIS_TIMEOUT = 1.0
"""Seconds a slot operation waits for Redis before it gives up (and grants the slot)."""

# Drop the expired slots, then take one if fewer than the limit are left. The score is
# the expiry in milliseconds of Redis's clock; the key itself expires with its last slot.
_TAKE = """
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ms)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then
  return 0
end
redis.call('ZADD', KEYS[1], ms + tonumber(ARGV[2]), ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""
# Push a held slot's expiry on (it is added again if it had expired meanwhile: its
# holder is still there, whatever the count says now).
_RENEW = """
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('ZADD', KEYS[1], ms + tonumber(ARGV[1]), ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1
"""

_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = (
    weakref.WeakKeyDictionary()
)


def _client() -> Any:
    """This event loop's Redis client (an asyncio client belongs to the loop it runs in)."""
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None:
        client = _clients[loop] = aioredis.Redis.from_url(
            settings.REDIS_URL, socket_connect_timeout=REDIS_TIMEOUT,
            socket_timeout=REDIS_TIMEOUT,
        )
    return client


def limit(kind: str) -> int:
    return int(settings.USER_SOCKET_LIMIT if kind == SOCKETS else settings.USER_LONG_POLL_LIMIT)


def key(kind: str, user_id: Any) -> str:
    return f"{KEY_PREFIX}:{kind}:{user_id}"


def _ttl_ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


@dataclass
class Slot:
    """One slot an account holds; :meth:`release` it (idempotent) when done."""

    kind: str
    user_id: Any
    member: str = field(default_factory=lambda: uuid.uuid4().hex)
    released: bool = False

    @property
    def key(self) -> str:
        return key(self.kind, self.user_id)

    async def renew(self, seconds: float) -> None:
        try:
            async with asyncio.timeout(REDIS_TIMEOUT * 2):
                await _client().eval(_RENEW, 1, self.key, _ttl_ms(seconds), self.member)
        except Exception as exc:
            cancelled_meanwhile(exc)
            # Every socket would say so while Redis is away: the take's warning is enough.
            log.debug("slots: could not renew a %s slot (%r)", self.kind, exc)

    async def keep(self) -> None:
        """Renew the slot until cancelled (a socket's slot lives as long as the socket)."""
        seconds = settings.USER_SLOT_SECONDS
        while True:
            await asyncio.sleep(seconds / 3)
            if self.released:  # a renewal after the release would take the slot again
                return
            await self.renew(seconds)

    async def release(self) -> None:
        if self.released:
            return
        self.released = True
        with suppress(Exception):
            async with asyncio.timeout(REDIS_TIMEOUT * 2):
                await _client().zrem(self.key, self.member)


async def take(kind: str, user_id: Any, seconds: float | None = None) -> Slot | None:
    """A slot of ``kind`` for the account, held for ``seconds`` (default
    ``USER_SLOT_SECONDS``) unless renewed; None when the account holds its limit."""
    slot = Slot(kind, user_id)
    ttl = _ttl_ms(seconds if seconds is not None else settings.USER_SLOT_SECONDS)
    try:
        async with asyncio.timeout(REDIS_TIMEOUT * 2):
            taken = await _client().eval(_TAKE, 1, slot.key, limit(kind), ttl, slot.member)
    except Exception as exc:
        cancelled_meanwhile(exc)
        log.warning("slots: Redis unavailable (%r); granting a %s slot uncounted", exc, kind)
        slot.released = True  # nothing to release or renew
        return slot
    return slot if taken else None



@asynccontextmanager
async def long_poll_slot(user_id: Any, wait: float) -> AsyncIterator[None]:
    """Hold one of the account's long-poll slots while a request waits up to ``wait``
    seconds (no renewal: the slot outlives the wait by ``USER_SLOT_SECONDS``); TooBusy
    when the account holds its limit."""
    slot = await take(LONG_POLLS, user_id, wait + settings.USER_SLOT_SECONDS)
    if slot is None:
        raise TooBusy(
            f"this account has {limit(LONG_POLLS)} long-polls waiting already "
            "(USER_LONG_POLL_LIMIT): wait for one to end", retry_after=RETRY_AFTER_SECONDS,
        )
    try:
        yield
    finally:
        await slot.release()
