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

Under ASGI, each request runs on a thread of its own (Django's per-request
``ThreadSensitiveContext``), so the connection a request opens can serve no other: it is
closed when the request ends (:func:`one_per_request`). Left open, it would be closed
only when the garbage collector found it, holding a Postgres backend until then, and a
busy web process would run the server out of connections. The live pages' threads and
Channels' database thread are long-lived and keep theirs.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.signals import request_finished
from django.db import connections
from django.db.backends.signals import connection_created

UID = "controlplane.web.request_connections"
CLOSING_UID = f"{UID}.closing"


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


def _close_the_requests(sender: Any, **kwargs: Any) -> None:
    connections.close_all()  # this request's own: connections are per thread


def one_per_request() -> None:
    """Close a request's database connections when it ends (an ASGI process: its requests'
    threads end with them). Called from :mod:`controlplane.asgi`."""
    request_finished.connect(_close_the_requests, dispatch_uid=CLOSING_UID)
