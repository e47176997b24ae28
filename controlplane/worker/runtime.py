"""The kernel runtime of one process: the Kernel on the Postgres store, and what hangs on it.

Every part of the control plane that reads or changes kernel state (workers, beat, the
commands behind the API and the pages, management commands) takes it from
:func:`runtime`, so each process builds exactly one: one Kernel, one Dispatcher that
delivers after each commit, one Notifier that hints live views, and one Worker that
renews its lease from a heartbeat thread while a phase runs. Building it opens no
connection; the Worker's heartbeat thread starts only when it first runs a phase.

It lives apart from the Celery task module (:mod:`controlplane.worker.execution`) so that the
web process needs no task module to commit an operator's action: it hands dispatches to
the broker by task name.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings

from controlplane.celery import ADVANCE, WAKE, app
from controlplane.process.logs import log_commit
from controlplane.reference.registry import build_registry
from controlplane.sockets.notify import Notifier
from controlplane.storage import PostgresStorage
from controlplane.storage.artifacts import PostgresArtifacts
from controlplane.storage.clock import DatabaseClock
from controlplane.storage.s3_artifacts import S3Artifacts
from kernel import Kernel, Task, Worker
from kernel.artifacts import ArtifactStore
from kernel.dispatch import Dispatcher

log = logging.getLogger(__name__)


def deliver(task_id: str, queue: str) -> None:
    """Hand "advance this task" to the broker (the Dispatcher's delivery)."""
    app.send_task(ADVANCE, args=[task_id], queue=queue, retry=False)


def wake(queue: str) -> None:
    """Hand "run what is runnable on ``queue``" to the broker (the Dispatcher's delivery
    of a burst)."""
    app.send_task(WAKE, args=[queue], queue=queue, retry=False)


def hand_over(task: Task) -> None:
    """A draining worker gave ``task`` back: tell another worker now. If the broker is
    down, the dispatch row the release wrote is sent by the next sweep."""
    try:
        deliver(task.id, task.queue)
    except Exception:
        log.warning("could not hand %s over now; the sweep will", task.id, exc_info=True)


def hint_grace() -> timedelta | None:
    """How long a message waits for a listening worker to claim its task from the
    commit's hint (``KERNEL_HINT_GRACE_MS``); ``None`` where workers do not listen."""
    if not settings.KERNEL_LISTEN:
        return None
    return timedelta(milliseconds=settings.KERNEL_HINT_GRACE_MS)


@dataclass(frozen=True)
class Runtime:
    kernel: Kernel
    dispatcher: Dispatcher
    worker: Worker


def artifact_store() -> ArtifactStore:
    """Postgres, or the S3-compatible store the settings name (ARTIFACT_S3_ENDPOINT)."""
    if settings.ARTIFACT_S3_ENDPOINT:
        return S3Artifacts.connect(settings.ARTIFACT_S3_ENDPOINT, settings.ARTIFACT_S3_BUCKET)
    return PostgresArtifacts()


@functools.cache
def runtime() -> Runtime:
    # One clock for claims, due times and lease expiry: the database's, so that workers
    # whose own clocks disagree still judge a lease the same way.
    kernel = Kernel(PostgresStorage(), build_registry(), DatabaseClock(),
                    artifacts=artifact_store())
    dispatcher = Dispatcher(
        kernel,
        deliver,
        redeliver_after=timedelta(seconds=settings.KERNEL_REDELIVER_SECONDS),
        wake=wake,
        messages=settings.KERNEL_DISPATCH_MESSAGES,
        hint_grace=hint_grace(),
    )
    dispatcher.attach()  # takes each commit's due rows in the commit, delivers after it
    notifier = Notifier()
    kernel.after_commit(notifier.after_commit)  # live views: hints after each commit
    kernel.on_preview(notifier.preview)  # and progress that is not committed yet
    kernel.after_commit(log_commit)  # one log line per commit: what happened, by whom
    worker = Worker(
        kernel,
        f"{socket.gethostname()}:{os.getpid()}",
        settings.KERNEL_LEASE_SECONDS,
        heartbeat=settings.KERNEL_HEARTBEAT,
        on_release=hand_over,
    )
    return Runtime(kernel, dispatcher, worker)


def built() -> bool:
    """Whether this process has built its runtime (so there may be a heartbeat to stop)."""
    return runtime.cache_info().currsize > 0
