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


@pytest.mark.django_db(transaction=True)
def test_a_first_reading_inside_a_transaction_is_the_servers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker started again after a kill may first ask the time inside a commit's
    transaction. It used to answer with the local wall clock, which a step can put
    seconds ahead: a claim judged on it takes a lease that has not lapsed."""
    from django.db import transaction

    real = datetime.now(UTC)
    monkeypatch.setattr(SystemClock, "now", lambda self: real + timedelta(seconds=10))
    clock = DatabaseClock(refresh=60.0, monotonic=Ticks())
    with transaction.atomic():
        first = clock.now()
    assert abs(first - real) < timedelta(seconds=5)


@pytest.mark.django_db(transaction=True)
def test_a_clock_that_never_read_the_server_refuses_to_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No reading of the server's clock yet and none possible: the answer is that storage
    is unavailable, never the local wall clock (a claim then waits, as it would for the
    database itself)."""
    from django.db import OperationalError
    from django.db.backends.base.base import BaseDatabaseWrapper

    from kernel.errors import StorageUnavailable

    def refused(self: BaseDatabaseWrapper) -> None:
        raise OperationalError("connection refused")

    monkeypatch.setattr(SystemClock, "now", lambda self: datetime.now(UTC) + timedelta(hours=1))
    monkeypatch.setattr(BaseDatabaseWrapper, "cursor", refused)
    clock = DatabaseClock(refresh=60.0, monotonic=Ticks())
    with pytest.raises(StorageUnavailable, match="clock"):
        clock.now()


@pytest.mark.django_db(transaction=True)
def test_a_clock_that_read_the_server_once_runs_on_when_it_cannot_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from django.db import OperationalError
    from django.db.backends.base.base import BaseDatabaseWrapper

    ticks = Ticks()
    clock = DatabaseClock(refresh=10.0, monotonic=ticks)
    first = clock.now()

    def refused(self: BaseDatabaseWrapper) -> None:
        raise OperationalError("connection refused")

    monkeypatch.setattr(BaseDatabaseWrapper, "cursor", refused)
    ticks.now += 30
    assert clock.now() - first == timedelta(seconds=30)
