"""Running kernel tasks under Celery (DESIGN §7).

``advance`` claims a task and runs its phases inline while it holds the lease;
``advance_queue`` claims and runs what is runnable on a queue, one task after another (what a
burst sends instead of a message per task: the backlog waits in Postgres, not in the
broker); ``sweep`` re-delivers what was lost. All are safe to receive twice, late or out
of order: the claim in Postgres decides.

The kernel they run on is the process's :func:`controlplane.worker.runtime.runtime`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from celery.signals import (
    celeryd_after_setup,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
    worker_shutting_down,
)
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, close_old_connections, connections

from controlplane import commands
from controlplane.celery import ADVANCE, ADVANCE_QUEUE, ARTIFACT_SWEEP, PRUNE, SWEEP, app
from controlplane.errors import Conflict
from controlplane.process import heap
from controlplane.worker import announcements, heartbeats
from controlplane.worker.runtime import (
    announce_grace,
    built,
    deliver,
    runtime,
    send_advance_queue,
)
from kernel import Blocked, StorageUnavailable
from kernel.dispatch import RECOVERY_SUFFIX, recovery_queue

log = logging.getLogger(__name__)
T = TypeVar("T")


BUSY_RETRIES = 5


@app.task(name=ADVANCE, ignore_result=True)
def advance(task_id: str, tries: int = 0) -> bool:
    with announcements.busy():
        return on_a_live_connection(lambda: _advance(task_id, tries))


def on_a_live_connection(run: Callable[[], T]) -> T:
    """``run()`` on this thread's connection as the last message left it, checked by use
    rather than by Django's health check (a ``SELECT 1`` round trip per message, on the
    path between a commit and the task it makes runnable).

    A connection that died since (a restarted Postgres) fails the first statement,
    :meth:`Worker.advance`'s claim, with StorageUnavailable: nothing was claimed then,
    so ``run`` runs once more, on a new connection. A claim that was made before its
    answer was lost is one this worker holds: the second run finds the task held and
    leaves it to the lease's expiry, as before. A phase that meets a dead connection
    ends in ``Worker._run``, which never raises it.
    """
    close_old_connections()  # drops a connection that failed or outlived CONN_MAX_AGE
    db = connections[DEFAULT_DB_ALIAS]
    db.health_check_done = True  # Django's flag: this message's check is its first use
    try:
        try:
            return run()
        except StorageUnavailable:
            log.info("database connection lost since the last message; reconnecting")
            db.close()
            return run()
    finally:
        close_old_connections()


@app.task(name=ADVANCE_QUEUE, ignore_result=True)
def advance_queue(queue: str) -> int:
    """Run ``queue``'s runnable tasks for ``KERNEL_CLAIM_SECONDS``; if some may be left,
    send a queue message for them behind the messages waiting now. How many ran.

    On this thread's connection as the last message left it (:func:`on_a_live_connection`):
    its first statement is the burst claim, which claims nothing when it fails."""
    queue = queue.removesuffix(RECOVERY_SUFFIX)  # the sweep sends to the recovery queue
    worker = runtime().worker
    with announcements.busy():
        ran, more = on_a_live_connection(lambda: worker.advance_queue(
            queue, batch=settings.KERNEL_ENDINGS_PER_COMMIT,
            budget=settings.KERNEL_CLAIM_SECONDS,
        ))
    if more and not worker.draining:
        send_advance_queue(queue)
    return ran


def _advance(task_id: str, tries: int) -> bool:
    worker = runtime().worker
    if worker.draining:
        # Shutting down: claim nothing. Another worker gets the message now, not
        # after the dispatch row's redelivery delay.
        task = runtime().kernel.storage.task(task_id)
        if task is not None:
            deliver(task_id, task.queue)
        return False
    ran = worker.advance(task_id)
    if not ran and tries < BUSY_RETRIES and claimable_soon(task_id):
        # Runnable, yet not claimed: its row was held by a commit in progress. Look
        # again shortly rather than wait for the sweep's redelivery.
        advance.apply_async(
            args=[task_id, tries + 1],
            countdown=0.2 * (tries + 1),
            queue=recovery_queue(runtime().kernel.task(task_id).queue),
            retry=False,
        )
    return ran


def claimable_soon(task_id: str) -> bool:
    kernel = runtime().kernel
    task = kernel.storage.task(task_id)
    if task is None or not task.runnable_at(kernel.clock.now()):
        return False
    return not isinstance(kernel.registry.resolve(task), Blocked)


@app.task(name=SWEEP, ignore_result=True)
def sweep() -> dict[str, int]:
    close_old_connections()
    report = runtime().dispatcher.sweep()
    if report.delivered or report.failed:
        log.info("sweep: %s", report)
    return {"delivered": report.delivered, "failed": report.failed}


@app.task(name=PRUNE, ignore_result=True)
def prune() -> dict[str, int]:
    """Beat's daily retention run (controlplane.commands.prune); logs its summary."""
    close_old_connections()
    try:
        report = commands.prune()
    except Conflict as exc:  # another beat's prune is running: it does the work
        log.info("prune: %s", exc)
        return {"sessions": 0, "partitions": 0}
    finally:
        close_old_connections()
    return {"sessions": report.sessions, "partitions": len(report.partitions)}


@app.task(name=ARTIFACT_SWEEP, ignore_result=True)
def sweep_artifacts() -> dict[str, int]:
    """Beat's daily sweep of unreferenced artifacts (controlplane.commands.sweep_artifacts)."""
    close_old_connections()
    try:
        removed = commands.sweep_artifacts()
    finally:
        close_old_connections()
    return {"removed": removed}


@celeryd_after_setup.connect
def consume_recovery_queues(sender: str, instance: object, **kwargs: object) -> None:
    """Beside each queue this worker consumes, its recovery queue (``hands.now`` for
    ``hands``), where the sweep sends lost, due and expired work: kombu's Redis
    transport moves the queue it just took from to the end of its round, so a message
    there is taken within a message or two, not behind the whole backlog."""
    queues = instance.app.amqp.queues  # type: ignore[attr-defined]
    for name in list(queues.consume_from or {}):
        if not name.endswith(RECOVERY_SUFFIX):
            queues.select_add(recovery_queue(name))


@worker_ready.connect
def resume(sender: object = None, **kwargs: object) -> None:
    """A starting worker starts its announcement reader (``KERNEL_LISTEN``); sweeps once, so
    recovery does not wait for beat; retries at once the tasks an earlier worker found
    blocked that this one's registry can run; freezes what its start built
    (:func:`controlplane.process.heap.freeze`); and sends each of its queues a queue
    message: a backlog that dead workers left in Postgres starts now.

    Workers run with ``--pool solo`` or ``--pool threads``: a forked pool would
    inherit this process's database connection and heartbeat thread.
    """
    try:
        if settings.KERNEL_LISTEN:
            listen(sender)
        close_old_connections()
        report = runtime().dispatcher.resume()
        heap.freeze()  # what the start built, out of the collector's walks
        log.info("resume: %s", report)
        queues = sender.app.amqp.queues.consume_from or {}  # type: ignore[attr-defined]
        for name in queues:
            if not name.endswith(RECOVERY_SUFFIX):
                send_advance_queue(name)
    except Exception:
        log.exception("resume sweep failed; beat will retry")


_reader: announcements.AnnouncementReader | None = None


def listen(sender: object) -> None:
    """Start this worker's announcement reader (:mod:`controlplane.worker.announcements`) on
    the queues it consumes, with as many slots as its pool runs messages at once."""
    global _reader
    if _reader is not None:
        return
    queues, concurrency = heartbeats.shape(sender)

    def advance_announced(task_id: str) -> bool:
        return on_a_live_connection(lambda: runtime().worker.advance(task_id, announced=True))

    def began() -> None:
        if (beat := heartbeats.current()) is not None:
            beat.began()

    def ended(failed: bool) -> None:
        if (beat := heartbeats.current()) is not None:
            beat.ended(failed)

    _reader = announcements.AnnouncementReader(
        {q for q in queues if not q.endswith(RECOVERY_SUFFIX)},
        announcements.open_slots(concurrency),
        advance_announced,
        lambda: not runtime().worker.draining,
        grace=grace.total_seconds() if (grace := announce_grace()) else 0.0,
        began=began,
        ended=ended,
    )
    _reader.start()


@worker_shutdown.connect
def stop_listening(**kwargs: object) -> None:
    """Once Celery's pool has stopped (a warm shutdown waited for its message), wait for
    a phase the reader runs: draining, it gives its lease back after the phase, and
    the drain's grace bounds the wait (:func:`drain`)."""
    if _reader is not None:
        _reader.stop(timeout=settings.KERNEL_DRAIN_SECONDS)
    if built():
        runtime().dispatcher.flush()  # messages held for an announcement's grace: send them now


@worker_process_shutdown.connect
def stop_heartbeat(**kwargs: object) -> None:
    if built():
        runtime().worker.close()


@worker_shutting_down.connect
def drain(how: str = "Warm", **kwargs: object) -> None:
    """SIGTERM (Celery's warm shutdown): stop claiming, let the running phase finish and
    give back the lease of whatever would continue, then Celery exits 0 once the task
    message in hand returns.

    If phases are still in flight after ``KERNEL_DRAIN_SECONDS``, their leases are given
    back (as if they had expired) and the process exits 0 at once: another worker takes
    them over now rather than after the lease runs out. Runs in the signal handler:
    it only sets a flag and starts a thread.
    """
    if how != "Warm":
        return
    runtime().worker.drain()
    log.info("draining: no new claims; %.0fs for running phases", settings.KERNEL_DRAIN_SECONDS)
    threading.Thread(target=_end_of_grace, name="drain-grace", daemon=True).start()


def _end_of_grace() -> None:
    time.sleep(settings.KERNEL_DRAIN_SECONDS)
    released = runtime().worker.release_held()
    log.warning("drain grace (%.0fs) over: released %d lease(s) mid-phase, exiting",
                settings.KERNEL_DRAIN_SECONDS, len(released))
    for handler in logging.getLogger().handlers:
        handler.flush()
    os._exit(0)
