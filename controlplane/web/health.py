"""Probes for a process manager or a load balancer: alive, and ready to serve.

``/healthz`` (liveness) answers from the process alone: a web process that answers it
is alive, whatever its database or broker do. ``/readyz`` (readiness) asks what serving
needs: the database answers, every migration this code knows is applied, and the
broker answers. Each check is bounded by a short timeout so that a probe never hangs
behind a dead server; what is missing is said by name.
"""

from __future__ import annotations

import logging
import selectors
import threading
import time
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.migrations.executor import MigrationExecutor

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger(__name__)

PROBE_TIMEOUT_SECONDS = 2.0


def database_problem(alias: str = DEFAULT_DB_ALIAS) -> str | None:
    """A connection of its own, with the alias's parameters, a connect timeout and a
    deadline on its query: the request's connection has neither, so a server that takes
    the connection, or lets the client in, and then never answers (hung, or behind a
    firewall that holds it open) would hold the probe, and every probe queued behind its
    lock, for as long as the operating system keeps the socket open."""
    import psycopg

    params = connections[alias].get_connection_params()
    for django_only in ("cursor_factory", "context"):
        params.pop(django_only, None)
    params["connect_timeout"] = max(2, round(PROBE_TIMEOUT_SECONDS))  # libpq's minimum
    try:
        with psycopg.connect(**params, autocommit=True) as conn:
            _select_one(conn, deadline=time.monotonic() + PROBE_TIMEOUT_SECONDS)
    except Exception as exc:  # any failure means "not reachable", said by its class
        return f"{type(exc).__name__}: {exc}".strip()
    return None


def _select_one(conn: psycopg.Connection[Any], deadline: float) -> None:
    """``SELECT 1`` on ``conn``, waiting for the server no later than ``deadline``
    (monotonic): psycopg's own execute waits as long as the socket stays open, and a
    server-side statement timeout needs a server that still runs its timers."""
    from psycopg import pq

    pgconn = conn.pgconn
    pgconn.send_query(b"SELECT 1")
    with selectors.DefaultSelector() as selector:
        selector.register(pgconn.socket, selectors.EVENT_WRITE)
        while pgconn.flush():  # the query is not all sent yet
            _wait(selector, deadline)
        selector.modify(pgconn.socket, selectors.EVENT_READ)
        pgconn.consume_input()
        while pgconn.is_busy():
            _wait(selector, deadline)
            pgconn.consume_input()
    while (result := pgconn.get_result()) is not None:
        if result.status != pq.ExecStatus.TUPLES_OK:
            message = (result.error_message or b"").decode(errors="replace").strip()
            raise psycopg.OperationalError(message or "SELECT 1 failed")


def _wait(selector: selectors.BaseSelector, deadline: float) -> None:
    left = deadline - time.monotonic()
    if left <= 0 or not selector.select(timeout=left):
        raise TimeoutError(f"no answer to a query within {PROBE_TIMEOUT_SECONDS} s")


def unapplied_migrations(alias: str = DEFAULT_DB_ALIAS) -> list[str]:
    executor = MigrationExecutor(connections[alias])
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    return [f"{migration.app_label}.{migration.name}" for migration, _backwards in plan]


def broker_problem() -> str | None:
    import redis

    client = redis.Redis.from_url(
        settings.CELERY_BROKER_URL,
        socket_connect_timeout=PROBE_TIMEOUT_SECONDS,
        socket_timeout=PROBE_TIMEOUT_SECONDS,
    )
    try:
        client.ping()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}".strip()
    finally:
        client.close()
    return None


READINESS_SECONDS = 2.0
"""How long one process reuses its last readiness answer: a probe that anyone may send
as often as they like costs a database round trip and a broker ping at most this often."""
_last: tuple[float, dict[str, str]] | None = None
_last_lock = threading.Lock()
_migrated = False
"""Once every migration this code knows is applied, they stay so: not read again."""


def readiness() -> dict[str, str]:
    """What keeps this process from serving, by name (empty: ready), as found at most
    :data:`READINESS_SECONDS` ago.

    Keys: ``database`` (unreachable), ``migrations`` (how many are not applied, when the
    database answers), ``broker`` (Redis, which carries both Celery and the channel
    layer, unreachable). The probe is public: what failed, and which migrations are
    missing, is logged; the answer only says what is missing (an error text could name
    hosts and users, a migration's name the version deployed).
    """
    global _last
    with _last_lock:
        if _last is not None and time.monotonic() - _last[0] < READINESS_SECONDS:
            return dict(_last[1])
        found = _readiness()
        _last = (time.monotonic(), found)
        return dict(found)


def _readiness() -> dict[str, str]:
    global _migrated
    missing: dict[str, str] = {}
    problem = database_problem()
    if problem is not None:
        log.warning("not ready: database: %s", problem)
        missing["database"] = "unreachable"
    elif not _migrated:
        try:
            pending = unapplied_migrations()
        except Exception:
            log.warning("not ready: cannot read the migration state", exc_info=True)
            missing["migrations"] = "cannot read the migration state"
        else:
            if pending:
                log.warning("not ready: migrations not applied: %s", ", ".join(pending))
                missing["migrations"] = f"{len(pending)} not applied"
            _migrated = not pending
    problem = broker_problem()
    if problem is not None:
        log.warning("not ready: broker: %s", problem)
        missing["broker"] = "unreachable"
    return missing
