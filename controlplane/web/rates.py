"""Request rates: how fast one account, and one client address, may ask.

Slots (:mod:`controlplane.sockets.slots`) bound what an account holds open at once; this bounds
how often it asks. Every HTTP request but the probes counts against its client's address
(:mod:`controlplane.web.client_address`) and, once the caller is known, its account: a
browser's in the middleware (:class:`controlplane.web.middleware.LimitRequestRates`), a
token's when the API authenticates it. Each allows ``*_REQUESTS_PER_SECOND`` on average
and up to ``*_REQUEST_BURST`` at once (settings); past that the request is answered 429 with
``Retry-After`` before anything else is read.

The counts are in Redis so that every web process behind one address shares them, one
key per subject holding its next free time (the generic cell rate algorithm: a token
bucket kept as one number). The script checks every subject of a request and takes from
all or none, on Redis's clock. As with slots, a Redis that cannot be reached grants the
request (and the failure is logged): a limit that refused everyone while Redis restarts
would do more harm than the load it keeps out.

Written here rather than taken from django-ninja's throttles or django-ratelimit: those
keep their counts in Django's cache with a read, then a write (two processes both take
the last request), cover the API or single views only, not the pages and the login, read
the address from ``X-Forwarded-For`` without knowing which proxy wrote it, and do not
always say when to come back.

A rate of requests does not bound what they cost: a few searches a second that each keep
the server busy for half a second take more of it than a hundred cheap pages. So each
account also has a *budget of server time* (``USER_SERVER_SECONDS_PER_SECOND`` on
average, ``USER_SERVER_SECONDS_BURST`` at once), kept as the same kind of next free time:
``s`` seconds of server time move it on by ``s`` divided by the share. A request's time
is from the middleware to its answer, less what it spent waiting for news (a long-poll).
Its cost is known only at its end, so a request is charged :data:`START_SECONDS` as it is
let in and the difference (or a refund) when it ends: an account can thus start at most
``USER_SERVER_SECONDS_BURST / START_SECONDS`` requests (and one more) at once, fewer the
more it owes, and a request that finds its account more than that allowance in arrears is
refused (429) like one over its rate, until what it spent is paid off. The renders of
an account's live pages are charged to the same budget, and wait while it is in arrears.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import redis
from django.conf import settings

from controlplane.web import turns

log = logging.getLogger(__name__)

KEY_PREFIX = "dcp:rate"
REDIS_TIMEOUT = 0.5
"""Seconds a rate check waits for Redis before it gives up (and grants the request)."""

# Each subject: ARGV[2i-1] the ms between requests on average, ARGV[2i] the ms the next
# free time may run ahead of now (what it may take at once). Returns {0, 0} when taken, else {ms to
# wait, the index of the subject that refused}; nothing is taken from anyone then.
_TAKE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local wait, who = 0, 0
local next_free = {}
for i, key in ipairs(KEYS) do
  local interval = tonumber(ARGV[2 * i - 1])
  local ahead = tonumber(ARGV[2 * i])
  local free = tonumber(redis.call('GET', key) or now)
  if free < now then free = now end
  if free - ahead - now > wait then
    wait, who = free - ahead - now, i
  end
  next_free[i] = free + interval
end
if wait > 0 then return {wait, who} end
for i, key in ipairs(KEYS) do
  redis.call('SET', key, next_free[i], 'PX', math.max(1, next_free[i] - now))
end
return {0, 0}
"""
# Move a subject's next free time on by ARGV[1] ms, or back (a refund) when negative; it
# never goes back past now (time that has passed has paid what it paid).
_CHARGE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local free = tonumber(redis.call('GET', KEYS[1]) or now) + tonumber(ARGV[1])
if free <= now then
  redis.call('DEL', KEYS[1])
  return 0
end
redis.call('SET', KEYS[1], free, 'PX', free - now)
return free - now
"""
# How many ms a subject's next free time stands past now and ARGV[1] ms (what it may
# take at once): 0 when it is within that.
_ARREARS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local free = tonumber(redis.call('GET', KEYS[1]) or now)
return math.max(0, free - now - tonumber(ARGV[1]))
"""


@dataclass(frozen=True)
class Rate:
    per_second: float
    at_once: int

    def argv(self) -> list[int]:
        interval = max(1, round(1000 / self.per_second))
        return [interval, interval * max(0, self.at_once - 1)]


START_SECONDS = 1.0
"""The server time a request is charged as it is let in, before its cost is known."""


@dataclass(frozen=True)
class Budget:
    """Server time: ``share`` seconds of it per second on average, ``at_once`` seconds
    of it at once. A request takes :data:`START_SECONDS` of it when let in (:func:`take`);
    :class:`Meter` settles the rest when it ends."""

    share: float
    at_once: float

    def argv(self) -> list[int]:
        return [self.owed_ms(START_SECONDS), max(0, self.owed_ms(self.at_once))]

    def owed_ms(self, seconds: float) -> int:
        """How far ``seconds`` of server time move the next free time on (or back)."""
        return round(seconds / self.share * 1000)


@dataclass(frozen=True)
class Subject:
    """Who a request counts against: ``what`` for the message, ``key`` in Redis."""

    what: str
    key: str
    rate: Rate | Budget


@dataclass(frozen=True)
class Refusal:
    what: str
    """Whose limit refused it (a :class:`Subject`'s ``what``)."""
    wait: float

    @property
    def retry_after(self) -> int:
        """Whole seconds, as ``Retry-After`` says them (at least 1)."""
        return max(1, math.ceil(self.wait))

    def detail(self) -> str:
        return f"too many requests from {self.what}: try again in {self.retry_after} s"


NO_TURN = Refusal("this account, whose other requests are still running "
                  "(USER_TURN_WAIT_SECONDS)", turns.RETRY_AFTER_SECONDS)
"""A request whose account's turn did not come (:mod:`controlplane.web.turns`)."""


def account(user_id: Any) -> Subject | None:
    rate = Rate(settings.USER_REQUESTS_PER_SECOND, settings.USER_REQUEST_BURST)
    if rate.per_second <= 0:
        return None
    return Subject("this account (USER_REQUESTS_PER_SECOND)", f"{KEY_PREFIX}:user:{user_id}",
                   rate)


def server_time(user_id: Any) -> Subject | None:
    """The account's budget of server time (None when it is not counted)."""
    budget = Budget(settings.USER_SERVER_SECONDS_PER_SECOND, settings.USER_SERVER_SECONDS_BURST)
    if budget.share <= 0:
        return None
    return Subject("this account, which has used its share of the server's time "
                   "(USER_SERVER_SECONDS_PER_SECOND)", f"{KEY_PREFIX}:time:{user_id}", budget)


def address(bucket: str | None) -> Subject | None:
    rate = Rate(settings.ADDRESS_REQUESTS_PER_SECOND, settings.ADDRESS_REQUEST_BURST)
    if bucket is None or rate.per_second <= 0:
        return None
    return Subject("this address (ADDRESS_REQUESTS_PER_SECOND)",
                   f"{KEY_PREFIX}:addr:{bucket}", rate)


@dataclass
class Meter:
    """A request's server time, charged to its account's budget: :data:`START_SECONDS`
    when it is let in (:meth:`admitted`), what it took beyond or short of that when it
    ends (:meth:`settle`), nothing for the time it spent :meth:`waiting` or waiting for
    its account's turn (:meth:`take_turn`, held until :meth:`end`)."""

    subject: Subject | None = None
    started: float = field(default_factory=time.perf_counter)
    spent: float = 0.0
    """Seconds spent before ``started`` and not charged yet."""
    advanced: float = 0.0
    turn: turns.Turn | None = None

    def take_turn(self, account: Any) -> bool:
        """Wait for ``account``'s turn (:mod:`controlplane.web.turns`), the wait not
        charged: whether it came. A request holds one turn, its last account's."""
        if self.turn is not None and not self.turn.ended and self.turn.account == account:
            return True
        self.end_turn()
        self.spent += time.perf_counter() - self.started
        try:
            self.turn = turns.account_turns.take(account)
        finally:
            self.started = time.perf_counter()
        return self.turn is not None

    def end_turn(self) -> None:
        if self.turn is not None:
            self.turn.end()

    def end(self) -> None:
        """The request is answered: its time charged, its turn to the next in line."""
        try:
            self.settle()
        finally:
            self.end_turn()

    def admitted(self, subject: Subject | None) -> None:
        """The request was let in on ``subject``'s budget (charged its start)."""
        self.settle()  # a browser's login, then a token: the first account's share
        self.subject, self.advanced = subject, START_SECONDS if subject is not None else 0.0

    def settle(self) -> None:
        """Charge what was spent since the start or the last settling, less the advance
        (a Redis call: not on an event loop)."""
        now = time.perf_counter()
        spent, self.spent, self.started = self.spent + now - self.started, 0.0, now
        if self.subject is not None:
            charge(self.subject, spent - self.advanced)
        self.advanced = 0.0

    @asynccontextmanager
    async def waiting(self) -> AsyncIterator[None]:
        """Time spent in here is not the server's: a long-poll waiting for a commit. The
        first wait gives the advance back (on a thread: Redis is called synchronously),
        so that an account's waiting long-polls do not hold its budget, and ends its turn,
        so that they do not hold up the account's other requests."""
        self.end_turn()
        if self.advanced:
            await asyncio.to_thread(self.settle)
        else:
            self.spent += time.perf_counter() - self.started
        try:
            yield
        finally:
            self.started = time.perf_counter()


def waiting(request: Any) -> AbstractAsyncContextManager[None]:
    """What a request spends in here is not charged to its account (see :class:`Meter`)."""
    meter = getattr(request, "server_time", None)
    return meter.waiting() if isinstance(meter, Meter) else nullcontext()


def admit_token(request: Any, user_id: Any) -> Refusal | None:
    """Count an API token's request against its account (its rate and, when the request
    is metered, its server time), as the middleware does for a browser's login."""
    meter = getattr(request, "server_time", None)
    spent = server_time(user_id) if isinstance(meter, Meter) else None
    refused = take(account(user_id), spent)
    if refused is None and isinstance(meter, Meter):
        meter.admitted(spent)
        if not meter.take_turn(user_id):
            return NO_TURN
    return refused


_clients: dict[str, Any] = {}
_clients_lock = threading.Lock()
_warned_at = 0.0


def _client() -> Any:
    url = settings.REDIS_URL
    with _clients_lock:
        client = _clients.get(url)
        if client is None:
            client = _clients[url] = redis.Redis.from_url(
                url, socket_timeout=REDIS_TIMEOUT, socket_connect_timeout=REDIS_TIMEOUT)
        return client


def _unavailable(exc: Exception) -> None:
    global _warned_at
    if time.monotonic() - _warned_at > 60:  # once a minute, not once a request
        _warned_at = time.monotonic()
        log.warning("request rates are not counted: Redis is unavailable (%s)", exc)


def take(*subjects: Subject | None) -> Refusal | None:
    """Count one request against every subject given, or against none of them if one is
    over its rate: then the refusal (who, and how long to wait)."""
    counted = [s for s in subjects if s is not None]
    if not counted:
        return None
    argv = [n for s in counted for n in s.rate.argv()]
    try:
        wait_ms, who = _client().eval(_TAKE, len(counted), *(s.key for s in counted), *argv)
    except redis.RedisError as exc:
        _unavailable(exc)
        return None
    if not wait_ms:
        return None
    return Refusal(counted[int(who) - 1].what, int(wait_ms) / 1000)


def arrears(subject: Subject | None) -> float:
    """Seconds until a :class:`Budget` subject is back within what it may take at once (0
    if it is, or is not counted): while it is not, its account's requests are refused and its live
    pages wait (:mod:`controlplane.sockets.pages`)."""
    if subject is None or not isinstance(subject.rate, Budget):
        return 0.0
    try:
        owed = _client().eval(_ARREARS, 1, subject.key, max(0, subject.rate.owed_ms(
            subject.rate.at_once)))
    except redis.RedisError as exc:
        _unavailable(exc)
        return 0.0
    return int(owed) / 1000


def charge(subject: Subject | None, seconds: float) -> float | None:
    """Take ``seconds`` of server time from a :class:`Budget` subject (see
    :func:`server_time`), or give them back when negative: the subject's
    :func:`arrears` after it, or None when that is not known (nothing was charged)."""
    if subject is None or not isinstance(subject.rate, Budget):
        return 0.0
    interval = subject.rate.owed_ms(seconds)
    if interval == 0:
        return None
    try:
        ahead = int(_client().eval(_CHARGE, 1, subject.key, interval))
    except redis.RedisError as exc:
        _unavailable(exc)
        return 0.0
    return max(0, ahead - subject.rate.owed_ms(subject.rate.at_once)) / 1000
