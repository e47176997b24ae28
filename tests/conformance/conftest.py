"""Fixtures that run every conformance test against both storages.

The in-memory storage is the reference semantics; the Postgres storage must pass
the same tests unchanged. ``World.reopen()`` gives a storage object that knows
nothing but what was stored, as a restarted process would (for Postgres: a new
connection).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from kernel import InMemoryStorage, ManualClock, Storage

from .brokers import WIRING
from .world import Faults, World


@pytest.fixture(
    params=["memory", pytest.param("postgres", marks=pytest.mark.django_db(transaction=True))]
)
def world(request: pytest.FixtureRequest) -> Iterator[World]:
    faults = Faults()
    clock = ManualClock()
    if request.param == "memory":
        memory = InMemoryStorage(fault=faults)
        yield World(lambda: memory, faults, clock)
        return
    from django.db import connection

    from controlplane.storage import PostgresStorage

    def reopen() -> PostgresStorage:
        connection.close()
        return PostgresStorage(fault=faults)

    yield World(reopen, faults, clock)
    connection.close()


@pytest.fixture(
    params=["memory", pytest.param("postgres", marks=pytest.mark.django_db(transaction=True))]
)
def storage(request: pytest.FixtureRequest) -> Iterator[Callable[[], Storage]]:
    """Each storage as a maker of storage objects on one store: the in-memory one shared,
    a new Postgres one (its own connection per thread) each time."""
    if request.param == "memory":
        memory = InMemoryStorage()
        yield lambda: memory
        return
    from django.db import connection

    from controlplane.storage import PostgresStorage

    yield PostgresStorage
    connection.close()


@pytest.fixture(params=["after_commit", "attached"])
def wiring(request: pytest.FixtureRequest) -> None:
    """Both ways a dispatcher delivers after commits: as a listener that takes the rows
    after the commit, and attached (``Dispatcher.attach``: taken in the commit itself, what
    the control plane runs). The dispatch tests use it on every test."""
    WIRING["attached"] = request.param == "attached"
