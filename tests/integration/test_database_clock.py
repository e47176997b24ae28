"""The database clock runs on from the server's time by the monotonic clock: a step of
the local wall clock moves no lease judgment (before, the local wall clock plus a
measured offset was used, and a step moved every judgment until the next measure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from controlplane.storage.clock import DatabaseClock
from kernel.clock import SystemClock


class Ticks:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.django_db(transaction=True)
def test_a_step_of_the_wall_clock_moves_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    ticks = Ticks()
    clock = DatabaseClock(refresh=60.0, monotonic=ticks)
    first = clock.now()
    real = datetime.now(UTC)
    assert abs(first - real) < timedelta(seconds=5)

    monkeypatch.setattr(SystemClock, "now", lambda self: real + timedelta(hours=1))
    ticks.now += 2.5
    assert clock.now() - first == timedelta(seconds=2.5)
    monkeypatch.setattr(SystemClock, "now", lambda self: real - timedelta(hours=1))
    ticks.now += 0.5
    assert clock.now() - first == timedelta(seconds=3)


@pytest.mark.django_db(transaction=True)
def test_the_server_is_read_again_after_refresh() -> None:
    ticks = Ticks()
    clock = DatabaseClock(refresh=10.0, monotonic=ticks)
    clock.now()
    measured = clock._at
    ticks.now += 11
    clock.now()
    assert clock._at > measured
