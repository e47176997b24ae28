"""The database's clock, for every time the kernel compares with stored times.

Claims, due times (sleepers' ``wake_at``, dispatch ``not_before``) and lease expiry
are all compared with times that other processes wrote. If each process used its own
clock, a worker whose clock runs seconds ahead would take leases before they expire,
and one running behind would leave due work waiting for a redelivery (issue 11
point 10). So every process reads one clock, the database's: :class:`DatabaseClock`
is the local clock plus the offset to ``clock_timestamp()`` on the server, measured
on the calling thread's connection (half the round trip either side) and measured
again every ``refresh`` seconds, so a local clock that is stepped is followed within
that time. Reading it costs no round trip otherwise.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timedelta

from django.db import connections

from kernel.clock import Clock, SystemClock

log = logging.getLogger(__name__)


class DatabaseClock:
    def __init__(
        self, using: str = "default", refresh: float = 10.0, local: Clock | None = None
    ) -> None:
        self.using = using
        self.refresh = refresh
        self.local = local or SystemClock()
        self.offset = timedelta(0)
        self._measured = -float("inf")
        self._lock = threading.Lock()

    def now(self) -> datetime:
        if time.monotonic() - self._measured > self.refresh:
            self.measure()
        return self.local.now() + self.offset

    def measure(self) -> bool:
        """Measure the offset now, if this thread may query; whether it did."""
        db = connections[self.using]
        if db.in_atomic_block:
            return False  # never inside a commit's transaction: the next call measures
        try:
            with db.cursor() as cur:
                before = self.local.now()
                cur.execute("SELECT clock_timestamp()")
                (server,) = cur.fetchone()
                after = self.local.now()
        except Exception:  # no connection here (async context, database down): keep the last
            log.debug("could not read the database clock", exc_info=True)
            return False
        with self._lock:
            self.offset = server - (before + (after - before) / 2)
            self._measured = time.monotonic()
        return True
