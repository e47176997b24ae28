"""The database connections of a web process: every statement bounded in time.

A page, an API call, a live render or a feed read is one request's worth of work; a
statement that runs longer than ``WEB_STATEMENT_TIMEOUT_SECONDS`` (a filter no index
serves, a deep page of a wide search) is cancelled by Postgres, and the request answered
503 saying so (:func:`controlplane.middleware.storage_down`), instead of holding a
connection and a thread for as long as one caller likes. Workers, beat and management
commands (a prune, a migration) are not web processes and are not bounded: the entry
points of the web, ``controlplane.asgi`` and ``controlplane.wsgi``, call :func:`bound`.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db.backends.signals import connection_created

UID = "controlplane.request_connections"


def _set_timeout(sender: Any, connection: Any, **kwargs: Any) -> None:
    seconds = settings.WEB_STATEMENT_TIMEOUT_SECONDS
    if connection.vendor != "postgresql" or seconds <= 0:
        return
    with connection.cursor() as cur:
        cur.execute("SELECT set_config('statement_timeout', %s, false)",
                    [f"{max(1, round(seconds * 1000))}ms"])


def bound() -> None:
    """Bound every statement of the connections this process opens from now on."""
    connection_created.connect(_set_timeout, dispatch_uid=UID)


def unbound() -> None:
    connection_created.disconnect(dispatch_uid=UID)
