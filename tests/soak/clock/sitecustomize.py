"""The soak's clock-step hook: imported at start-up by the worker processes whose
``PYTHONPATH`` starts with this folder (and only by them).

The offset in seconds written to ``$SOAK_CLOCK_FILE`` is added to the process's wall
clock as Python code reads it: ``time.time()`` and the kernel's local clock
(``kernel.clock.SystemClock``), as an NTP step of the machine's clock would move them.
The monotonic clock is left alone, as a step leaves it, and with it ``DatabaseClock``,
which runs on from the server's time by the monotonic clock and never answers with the
local one. It is re-read at most every 0.1 s.

Why not libfaketime: Debian's 0.9.10, with the monotonic clock left alone
(``FAKETIME_DONT_FAKE_MONOTONIC=1``), makes Python's ``time.sleep`` fail (EINVAL from
``clock_nanosleep``), and with it faked, a step moves ``time.monotonic`` too
(backwards on a negative step), which no real clock step does.
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import suppress
from datetime import timedelta
from pathlib import Path

_FILE = os.environ.get("SOAK_CLOCK_FILE", "")
_real_time = time.time
_state = {"offset": 0.0, "looked": -1.0}


def offset() -> float:
    now = time.monotonic()
    if now - _state["looked"] >= 0.1:
        _state["looked"] = now
        with suppress(OSError, ValueError):  # no file yet: keep the last offset
            _state["offset"] = float(Path(_FILE).read_text().strip() or 0)
    return _state["offset"]


def _install() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the checkout
    from kernel import clock

    local_now = clock.SystemClock.now

    def stepped_now(self: clock.SystemClock) -> object:
        return local_now(self) + timedelta(seconds=offset())

    clock.SystemClock.now = stepped_now  # type: ignore[method-assign, assignment]
    time.time = lambda: _real_time() + offset()


if _FILE:
    _install()
