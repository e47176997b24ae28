"""The database connections of a web process: every statement bounded in time, and run
by its own backend alone.

A page, an API call, a live render or a feed read is one request's worth of work; a
statement that runs longer than ``WEB_STATEMENT_TIMEOUT_SECONDS`` (a filter no index
serves, a deep page of a wide search) is cancelled by Postgres, and the request answered
503 saying so (:func:`controlplane.web.middleware.storage_down`), instead of holding a
connection and a thread for as long as one caller likes. Workers, beat and management
commands (a prune, a migration) are not web processes and are not bounded: the entry
points of the web, ``controlplane.asgi`` and ``controlplane.wsgi``, call :func:`bound`.

A web statement also gets no parallel workers (``max_parallel_workers_per_gather`` 0):
with them, one wide search takes every core of the database's machine for its duration
(a leader and two workers on two cores) and costs more CPU in all than run alone, so one
account's read would hold up everyone's pages; alone, it leaves the other cores to them.
The per-account budget of server time (:mod:`controlplane.web.rates`) counts a request's
time, not its cores, which is another reason a request must not use more than one.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db.backends.signals import connection_created

UID = "controlplane.web.request_connections"


def _set_bounds(sender: Any, connection: Any, **kwargs: Any) -> None:
    if connection.vendor != "postgresql":
        return
    seconds = settings.WEB_STATEMENT_TIMEOUT_SECONDS
    with connection.cursor() as cur:
        cur.execute("SELECT set_config('max_parallel_workers_per_gather', '0', false)")
        if seconds > 0:
            cur.execute("SELECT set_config('statement_timeout', %s, false)",
                        [f"{max(1, round(seconds * 1000))}ms"])


def bound() -> None:
    """Bound every statement of the connections this process opens from now on (in time,
    and to one backend)."""
    connection_created.connect(_set_bounds, dispatch_uid=UID)


def unbound() -> None:
    connection_created.disconnect(dispatch_uid=UID)
