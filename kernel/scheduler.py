"""The in-process scheduler: runs ready tasks until none is left.

It is the Celery worker's little sibling for tests and scripts: it asks storage
what is runnable (pending, due sleepers, expired leases) instead of waiting for
dispatch messages, so it needs no outbox delivery. Reopening after a crash is
just building a new one on the same storage: every decision is read back from it.
"""

from __future__ import annotations

from datetime import timedelta

from .clock import ManualClock
from .session import Kernel
from .worker import Worker

BATCH = 100


class Scheduler:
    def __init__(self, kernel: Kernel, worker_id: str | None = None, lease_seconds: float = 30.0):
        self.kernel = kernel
        self.worker = Worker(kernel, worker_id, lease_seconds)

    def run_until_idle(self, *, advance_clock: bool = False, max_phases: int = 100_000) -> int:
        """Advance runnable tasks until none is; return how many were advanced.

        With ``advance_clock`` and a :class:`ManualClock`, time jumps to the next
        wake-up or lease expiry whenever nothing is runnable, so sleeps and
        crashed workers' leases resolve without real waiting.
        """
        advanced = 0
        while advanced < max_phases:
            now = self.kernel.clock.now()
            progressed = False
            for task in self.kernel.storage.runnable(now, BATCH):
                if self.worker.advance(task.id):
                    advanced += 1
                    progressed = True
            if progressed:
                continue
            clock = self.kernel.clock
            wake = self.kernel.storage.next_wake() if advance_clock else None
            if not isinstance(clock, ManualClock) or wake is None or wake < now:
                return advanced  # what is due and still here is blocked
            clock.set(max(wake, clock.now()) + timedelta(microseconds=1))
        raise RuntimeError(f"scheduler did not become idle within {max_phases} advances")
