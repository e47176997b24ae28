"""Reads on a Postgres streaming replica, where a stale answer cannot show.

With ``DATABASE_REPLICA_URL`` set, the settings add a second database alias,
:data:`REPLICA`, that only this package reads from: pages, the feeds' catch-up reads
and the metrics. Everything else - commits, claims, operator actions, the commands'
own reads, the API - stays on the primary (the ``default`` alias). Without it every read
is on the primary and nothing here changes anything.

A replica lags. What makes that harmless:

- A read that the caller marks as allowed to be stale runs inside :func:`on_replica`
  (ORM queries through :class:`Router`, raw SQL through :func:`alias`).
- A read that continues something already shown (a socket's cursor) asks the replica
  first and goes to the primary when the replica has nothing past the cursor
  (:func:`prefer_replica` with ``fresh_enough``): a socket never shows a session older
  than a commit it has shown, and a stalled replica never stalls it either.
- A replica that fails (down, recovering) is skipped: the read runs on the primary.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections

log = logging.getLogger(__name__)

PRIMARY = DEFAULT_DB_ALIAS
REPLICA = "replica"
T = TypeVar("T")

_using: ContextVar[str] = ContextVar("controlplane_reads_using", default=PRIMARY)


def configured() -> bool:
    return REPLICA in settings.DATABASES


def alias() -> str:
    """The database alias this context's reads use."""
    return _using.get()


@contextmanager
def using(name: str) -> Iterator[str]:
    token = _using.set(name if name == PRIMARY or configured() else PRIMARY)
    try:
        yield _using.get()
    finally:
        _using.reset(token)


def on_replica() -> Any:
    """Reads in this block may be stale: they go to the replica, if there is one."""
    return using(REPLICA)


def prefer_replica(read: Callable[[], T], fresh_enough: Callable[[T], bool] | None = None) -> T:
    """``read()`` on the replica; on the primary instead when the replica's answer is not
    ``fresh_enough`` (it is behind what the caller has shown) or the replica fails."""
    if configured():
        try:
            with on_replica():
                found = read()
        except DatabaseError:
            log.warning("replica read failed; reading from the primary", exc_info=True)
            connections[REPLICA].close()
        else:
            if fresh_enough is None or fresh_enough(found):
                return found
    with using(PRIMARY):
        return read()


class Router:
    """``DATABASE_ROUTERS``: ORM reads follow :func:`alias` (the primary unless a read
    asked for the replica); writes and migrations are the primary's only."""

    def db_for_read(self, model: type, **hints: Any) -> str:
        return _using.get()

    def db_for_write(self, model: type, **hints: Any) -> str:
        return PRIMARY

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool:
        return True

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool:
        return db == PRIMARY
