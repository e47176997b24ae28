"""Running kernel tasks under Celery (DESIGN §7).

``advance`` claims a task and runs its phases inline while it holds the lease;
``sweep`` re-delivers what was lost. Both are safe to receive twice, late or out
of order: the claim in Postgres decides.

Each process builds one :class:`Runtime` on first use: a Kernel on the Postgres
storage, the Dispatcher that delivers after each commit, and a kernel Worker
that renews its lease from a heartbeat thread while a phase runs.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
from dataclasses import dataclass
from datetime import timedelta

from celery.signals import worker_process_shutdown, worker_ready
from django.conf import settings
from django.db import close_old_connections

from kernel import Blocked, Kernel, SystemClock, Worker
from kernel.dispatch import Dispatcher

from .celery import app
from .notify import Notifier
from .registry import build_registry
from .storage import PostgresStorage

log = logging.getLogger(__name__)


def deliver(task_id: str, queue: str) -> None:
    advance.apply_async(args=[task_id], queue=queue, retry=False)


@dataclass(frozen=True)
class Runtime:
    kernel: Kernel
    dispatcher: Dispatcher
    worker: Worker


@functools.cache
def runtime() -> Runtime:
    kernel = Kernel(PostgresStorage(), build_registry(), SystemClock())
    dispatcher = Dispatcher(
        kernel, deliver, redeliver_after=timedelta(seconds=settings.KERNEL_REDELIVER_SECONDS)
    )
    kernel.after_commit(dispatcher.after_commit)
    notifier = Notifier()
    kernel.after_commit(notifier.after_commit)  # live views: hints after each commit
    kernel.on_preview(notifier.preview)  # and progress that is not committed yet
    worker = Worker(
        kernel,
        f"{socket.gethostname()}:{os.getpid()}",
        settings.KERNEL_LEASE_SECONDS,
        heartbeat=settings.KERNEL_HEARTBEAT,
    )
    return Runtime(kernel, dispatcher, worker)


BUSY_RETRIES = 5


@app.task(name="controlplane.advance", ignore_result=True)
def advance(task_id: str, tries: int = 0) -> bool:
    close_old_connections()  # a restarted Postgres leaves a dead connection behind
    try:
        ran = runtime().worker.advance(task_id)
        if not ran and tries < BUSY_RETRIES and claimable_soon(task_id):
            # Runnable, yet not claimed: its row was held by a commit in progress. Look
            # again shortly rather than wait for the sweep's redelivery.
            advance.apply_async(
                args=[task_id, tries + 1],
                countdown=0.2 * (tries + 1),
                queue=runtime().kernel.task(task_id).queue,
                retry=False,
            )
        return ran
    finally:
        close_old_connections()


def claimable_soon(task_id: str) -> bool:
    kernel = runtime().kernel
    task = kernel.storage.task(task_id)
    if task is None or not task.runnable_at(kernel.clock.now()):
        return False
    return not isinstance(kernel.registry.resolve(task), Blocked)


@app.task(name="controlplane.sweep", ignore_result=True)
def sweep() -> dict[str, int]:
    close_old_connections()
    report = runtime().dispatcher.sweep()
    if report.delivered or report.failed:
        log.info("sweep: %s", report)
    return {"delivered": report.delivered, "failed": report.failed}


@worker_ready.connect
def resume(**kwargs: object) -> None:
    """A starting worker sweeps once, so recovery does not wait for beat.

    Workers run with ``--pool solo`` or ``--pool threads``: a forked pool would
    inherit this process's database connection and heartbeat thread.
    """
    try:
        sweep()
    except Exception:
        log.exception("resume sweep failed; beat will retry")


@worker_process_shutdown.connect
def stop_heartbeat(**kwargs: object) -> None:
    if runtime.cache_info().currsize:
        runtime().worker.close()
