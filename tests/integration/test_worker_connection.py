"""A worker keeps its database connection from one task message to the next.

Celery's Django fix-up closes every connection before and after each task unless
``CELERY_DB_REUSE_MAX`` says otherwise; each ``advance`` then opened a new connection
(a backend fork: 1.5 ms idle, 6 ms on a busy machine, the largest part of issue 12's
dispatch latency) and lost the commit path's prepared statements."""

from __future__ import annotations

import pytest
from celery.fixups.django import DjangoWorkerFixup
from django.db import close_old_connections, connection, connections

from controlplane.celery import app
from controlplane.execution import advance

pytestmark = pytest.mark.django_db(transaction=True)


def test_task_messages_reuse_the_connection() -> None:
    fixup = DjangoWorkerFixup(app)
    connection.ensure_connection()
    raw = connection.connection
    for _ in range(1000):  # what Celery runs around each task message
        fixup.on_task_prerun(sender=advance)
        close_old_connections()  # as our tasks do, first and last
        with connection.cursor() as cur:
            cur.execute("SELECT 1")
        close_old_connections()
        fixup.on_task_postrun(sender=advance)
    assert connection.connection is raw


def test_a_connection_that_failed_is_still_replaced() -> None:
    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        [pid] = cur.fetchone()
    raw = connection.connection
    other = connections["default"].copy()
    try:
        with other.cursor() as cur:  # as a restarting server would
            cur.execute("SELECT pg_terminate_backend(%s)", [pid])
    finally:
        other.close()
    close_old_connections()  # the next task's start: the health check finds it dead
    with connection.cursor() as cur:
        cur.execute("SELECT 1")
    assert connection.connection is not raw
