"""One consistent view of the store for a page, and the one way this layer runs SQL."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import connections, transaction

from controlplane.reads.replica import alias
from controlplane.storage import HotCursor


@contextmanager
def snapshot() -> Iterator[None]:
    """One ``REPEATABLE READ`` transaction: all reads inside see the same commits (on the
    primary, or on the replica inside :func:`~.replica.on_replica`)."""
    using = alias()
    connection = connections[using]
    outermost = not connection.in_atomic_block
    with transaction.atomic(using=using):
        if outermost:  # inside someone else's transaction, its snapshot rules
            with connection.cursor() as cur:
                cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        yield


def rows(sql: str, params: Any = None, *, prepared: bool = False) -> list[Any]:
    """Every row of one statement, on the request's connection to the database this
    context reads (autocommit unless a snapshot is open). ``prepared``: planned once per
    connection (a fixed statement a live page sends on every commit, whose planning
    costs as much as its execution)."""
    connection = connections[alias()]
    if prepared:
        connection.ensure_connection()
        return HotCursor(connection).execute(sql, params).fetchall()
    with connection.cursor() as cur:
        cur.execute(sql, params or [])
        return list(cur.fetchall())
