"""The worker registry: each Celery worker process says who it is and how it is doing.

Every ``WORKER_HEARTBEAT_SECONDS`` a daemon thread of the worker writes its row of
``controlplane_worker`` (one upsert): host, pid, node name, the queues it consumes, its
concurrency, the ``advance`` messages in flight now, those processed and failed in the
last minute (and since it started). A clean shutdown marks the row stopped; a killed
worker just stops beating, and once its heartbeat is older than ``WORKER_DEAD_SECONDS``
the Workers page shows it dead and the sweep ends the leases it holds
(:func:`controlplane.reads.workers.dead_owners`).

This is a control-plane table, not a kernel record: no commit writes it. Leases stay the
authority on who runs what: the sweep ends a dead worker's leases by bumping their
epochs, so the worker, were it alive after all, can commit nothing more. The handlers below
are connected when a worker imports this module (``controlplane.celery`` includes it);
their cost per task message is a lock and a few integer updates.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections import deque
from datetime import datetime
from typing import Any

from celery.signals import task_postrun, task_prerun, worker_ready, worker_shutdown
from django.conf import settings
from django.db import close_old_connections, connection

from controlplane.celery import ADVANCE
from controlplane.models import Worker
from controlplane.process.kernel import process_kernel

log = logging.getLogger(__name__)
WINDOW = 60.0
"""Seconds over which processed and failed messages are counted."""
UPDATED = ["name", "host", "pid", "queues", "concurrency", "in_flight",
           "processed_last_minute", "failed_last_minute", "processed_total", "failed_total",
           "last_heartbeat", "stopped_at"]


def worker_id() -> str:
    """``host:pid``: the same name the kernel writes as this process's lease owner."""
    return f"{socket.gethostname()}:{os.getpid()}"


class Heartbeat:
    """One worker process's counters and the thread that writes them."""

    def __init__(self, name: str, queues: list[str], concurrency: int, every: float) -> None:
        self.id = worker_id()
        self.name, self.queues, self.concurrency, self.every = name, queues, concurrency, every
        self.started_at: datetime | None = None
        """The database's time at the first row written."""
        self.beating_since: datetime | None = None
        """The database's time at the first beat of the current run of beats written
        without a gap (:func:`gap`)."""
        self.last_beat: datetime | None = None
        """The database's time at the last beat written."""
        self.lock = threading.Lock()
        self.in_flight = 0
        self.recent: deque[tuple[float, bool]] = deque()  # (monotonic end, failed)
        self.processed_total = 0
        self.failed_total = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="worker-registry", daemon=True)

    def began(self) -> None:
        with self.lock:
            self.in_flight += 1

    def ended(self, failed: bool) -> None:
        with self.lock:
            self.in_flight = max(0, self.in_flight - 1)
            self.processed_total += 1
            self.failed_total += failed
            self.recent.append((time.monotonic(), failed))

    def row(self, stopped: bool = False) -> Worker:
        # The database's clock, as the Workers page judges silence by: this machine's
        # clock may disagree with the web server's by more than WORKER_DEAD_SECONDS.
        now = process_kernel().clock.now()
        self.started_at = self.started_at or now
        with self.lock:
            horizon = time.monotonic() - WINDOW
            while self.recent and self.recent[0][0] < horizon:
                self.recent.popleft()
            failed = sum(1 for _, f in self.recent if f)
            return Worker(
                id=self.id, name=self.name, host=socket.gethostname(), pid=os.getpid(),
                queues=self.queues, concurrency=self.concurrency, in_flight=self.in_flight,
                processed_last_minute=len(self.recent), failed_last_minute=failed,
                processed_total=self.processed_total, failed_total=self.failed_total,
                started_at=self.started_at, last_heartbeat=now,
                stopped_at=now if stopped else None,
            )

    def write(self, stopped: bool = False) -> None:
        """One upsert of this worker's row (``started_at`` is kept from the first)."""
        row = self.row(stopped)
        Worker.objects.bulk_create([row], update_conflicts=True,
                                   unique_fields=["id"], update_fields=UPDATED)
        with self.lock:
            if self.last_beat is None or (
                (row.last_heartbeat - self.last_beat).total_seconds() > gap()
            ):
                self.beating_since = row.last_heartbeat
            self.last_beat = row.last_heartbeat

    def steady_for(self, now: datetime) -> float | None:
        """How long this worker's beats have run without a gap up to ``now`` (the
        database's time), in seconds; None while it is in a gap itself (its last beat
        longer ago than :func:`gap`) or has not beaten yet."""
        with self.lock:
            since, last = self.beating_since, self.last_beat
        if since is None or last is None or (now - last).total_seconds() > gap():
            return None
        return (now - since).total_seconds()

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        if self.thread.is_alive():
            self.thread.join(timeout=self.every + 5)
        try:
            self.write(stopped=True)
        except Exception:
            log.warning("worker registry: could not mark %s stopped", self.id, exc_info=True)

    def _run(self) -> None:
        try:
            while True:
                try:
                    self.write()
                except Exception:
                    log.warning("worker registry: heartbeat of %s not written", self.id,
                                exc_info=True)
                    connection.close()  # a restarted Postgres: a fresh connection next time
                if self.stopping.wait(self.every):
                    return
        finally:
            close_old_connections()


def gap() -> float:
    """A silence between a worker's own beats that breaks their run: half
    ``WORKER_DEAD_SECONDS``. A database outage makes a live worker look dead when the
    outage and up to two beat intervals around it are longer than ``WORKER_DEAD_SECONDS``;
    with that at least four beat intervals long, such an outage is longer than half of
    it, so it breaks the sweeper's run too, and the sweeper judges no one for
    ``WORKER_DEAD_SECONDS`` after it, while every live worker beats again. A beat late by
    less (a slow write) breaks nothing."""
    return settings.WORKER_DEAD_SECONDS / 2


_beat: Heartbeat | None = None


def current() -> Heartbeat | None:
    return _beat


@worker_ready.connect
def _started(sender: Any = None, **kwargs: object) -> None:
    global _beat
    if _beat is not None:
        return
    queues, concurrency = shape(sender)
    _beat = Heartbeat(str(getattr(sender, "hostname", "") or worker_id()), queues,
                      concurrency, settings.WORKER_HEARTBEAT_SECONDS)
    _beat.start()


def shape(sender: Any) -> tuple[list[str], int]:
    """The queues a starting worker (``worker_ready``'s sender) consumes, and how many
    messages its pool runs at once (one for ``--pool solo``)."""
    try:
        queues = sorted(sender.app.amqp.queues.consume_from)
    except AttributeError:
        queues = []
    controller = getattr(sender, "controller", None)
    pool = getattr(controller, "pool_cls", "")
    solo = "solo" in f"{getattr(pool, '__module__', '')} {pool}"
    concurrency = 1 if solo else getattr(controller, "concurrency", None) or 1
    return queues, int(concurrency)


@task_prerun.connect
def _began(sender: Any = None, **kwargs: object) -> None:
    if _beat is not None and getattr(sender, "name", None) == ADVANCE:
        _beat.began()


@task_postrun.connect
def _ended(sender: Any = None, state: str | None = None, **kwargs: object) -> None:
    if _beat is not None and getattr(sender, "name", None) == ADVANCE:
        _beat.ended(failed=state == "FAILURE")


@worker_shutdown.connect
def _stopped(**kwargs: object) -> None:
    global _beat
    if _beat is not None:
        _beat.stop()
        _beat = None
