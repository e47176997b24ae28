"""Dead processes for kernel tests on the in-memory storage.

A handler raises :class:`Crash` where a real process would be SIGKILLed: it is a
``BaseException``, so no kernel code catches it, and the test starts a fresh worker
(a fresh kernel over the same storage and clock) as a restarted process would.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

from kernel import Kernel, ManualClock, Scheduler
from kernel.artifacts import InMemoryArtifacts


class Crash(BaseException):
    """A process dying at this point: not an Exception, so nothing in the kernel catches it."""


@dataclass
class CrashPoints:
    """A test world whose process dies at named points, each once: code under test calls
    :meth:`maybe_crash` where a process could be killed."""

    crash_on: set[str] = field(default_factory=set, kw_only=True)

    def maybe_crash(self, point: str) -> None:
        if point in self.crash_on:
            self.crash_on.discard(point)
            raise Crash()


class DiesMidWrite(InMemoryArtifacts):
    """Its first put leaves half the bytes under the name, then the process dies."""

    died = False

    def put(self, data: bytes, media_type: str) -> str:
        if not self.died:
            self.died = True
            digest = super().put(data, media_type)
            self.corrupt(digest, data[: len(data) // 2])
            raise Crash()
        return super().put(data, media_type)


def dead(exc: BaseException) -> bool:
    """Whether ``exc`` is a Crash, or a group the event loop wrapped one in."""
    if isinstance(exc, Crash):
        return True
    return isinstance(exc, BaseExceptionGroup) and all(dead(e) for e in exc.exceptions)


def run_across_crashes(
    make_kernel: Callable[[], Kernel],
    clock: ManualClock,
    *,
    crashes_allowed: int,
    advance_clock: bool,
    lease_lapse: timedelta | None = None,
) -> int:
    """Run to idle; after each Crash start a fresh worker, as often as allowed, after
    ``lease_lapse`` (the dead worker's lease running out) when given. The crash count."""
    crashes = 0
    while True:
        try:
            Scheduler(make_kernel(), f"w{crashes}").run_until_idle(advance_clock=advance_clock)
            return crashes
        except BaseException as exc:
            if not dead(exc):
                raise
            crashes += 1
            if crashes > crashes_allowed:
                raise
            if lease_lapse is not None:
                clock.advance(lease_lapse)
