"""The database's clock, for every time the kernel compares with stored times.

Claims, due times (sleepers' ``wake_at``, dispatch ``not_before``) and lease expiry
are all compared with times that other processes wrote. If each process used its own
clock, a worker whose clock runs seconds ahead would take leases before they expire,
and one running behind would leave due work waiting for a redelivery. So every process
reads one clock, the database's: :class:`DatabaseClock` reads ``clock_timestamp()`` on
the server (half the round trip either side) and runs on from there by the local
*monotonic* clock, measuring again every ``refresh`` seconds. A step of the local wall
clock (an NTP correction, a VM resumed) therefore moves nothing: lease judgments follow
the server's time and the time that really passed here. Reading it costs no round trip
otherwise.

Until it has read the server once it has nothing to run on from, and it never answers
with the local wall clock instead: a worker started again after a kill, whose clock a
step put seconds ahead, would take live leases with it. Its first reading uses a
connection of its own when this thread's is inside a transaction, and when the server
cannot be read at all the answer is :class:`~kernel.errors.StorageUnavailable`, as the
claim that asked would have met.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from kernel.errors import StorageUnavailable

log = logging.getLogger(__name__)


class DatabaseClock:
    def __init__(
        self, using: str = "default", refresh: float = 10.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.using = using
        self.refresh = refresh
        self.monotonic = monotonic
        self._server: datetime | None = None
        """The server's time at :attr:`_at` on the monotonic clock."""
        self._at = -float("inf")
        self._lock = threading.Lock()

    def now(self) -> datetime:
        if self.monotonic() - self._at > self.refresh:
            self.measure()
        with self._lock:
            server, at = self._server, self._at
        if server is None:
            server, at = self._first_reading()
        return server + timedelta(seconds=self.monotonic() - at)

    def measure(self) -> bool:
        """Measure the server's time now, if this thread may query; whether it did."""
        db = connections[self.using]
        if db.in_atomic_block:
            return False  # never inside a commit's transaction: the next call measures
        return self._read(db)

    def _first_reading(self) -> tuple[datetime, float]:
        own = connections.create_connection(self.using)
        try:
            self._read(own)
        finally:
            own.close()
        with self._lock:
            server, at = self._server, self._at
        if server is None:
            raise StorageUnavailable("database unavailable: its clock could not be read")
        return server, at

    def _read(self, db: BaseDatabaseWrapper) -> bool:
        try:
            with db.cursor() as cur:
                before = self.monotonic()
                cur.execute("SELECT clock_timestamp()")
                (server,) = cur.fetchone()
                after = self.monotonic()
        except Exception:  # no connection here (async context, database down): keep the last
            log.debug("could not read the database clock", exc_info=True)
            return False
        with self._lock:
            self._server, self._at = server, (before + after) / 2
        return True
