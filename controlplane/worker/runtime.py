"""The kernel runtime of one process: what hangs on the process's Kernel to commit.

Every part of the control plane that changes kernel state (workers, beat, the commands
behind the API and the pages, management commands) takes it from :func:`runtime`, so
each process builds exactly one: the Kernel (:mod:`controlplane.process.kernel`, which
the reads use alone), one Dispatcher that delivers after each commit, one Notifier that
hints live views, and one Worker that renews its lease from a heartbeat thread while a
phase runs. Building it opens no connection; the Worker's heartbeat thread starts only
when it first runs a phase.

It lives apart from the Celery task module (:mod:`controlplane.worker.execution`) so
that the web process needs no task module to commit an operator's action: it hands
dispatches to the broker by task name.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings

from controlplane.celery import ADVANCE, ADVANCE_QUEUE, app
from controlplane.process.kernel import forget, process_kernel
from controlplane.process.logs import log_commit
from controlplane.reads.workers import dead_owners
from controlplane.sockets.notify import Notifier
from kernel import Kernel, Task, Worker
from kernel.dispatch import Dispatcher

log = logging.getLogger(__name__)


def deliver(task_id: str, queue: str) -> None:
    """Hand "advance this task" to the broker (the Dispatcher's delivery)."""
    app.send_task(ADVANCE, args=[task_id], queue=queue, retry=False)


def send_advance_queue(queue: str) -> None:
    """Hand a queue message, "run what is runnable on ``queue``", to the broker (the
    Dispatcher's delivery of a burst)."""
    app.send_task(ADVANCE_QUEUE, args=[queue], queue=queue, retry=False)


def hand_over(task: Task) -> None:
    """A draining worker gave ``task`` back: tell another worker now. If the broker is
    down, the dispatch row the release wrote is sent by the next sweep."""
    try:
        deliver(task.id, task.queue)
    except Exception:
        log.warning("could not hand %s over now; the sweep will", task.id, exc_info=True)


def announce_grace() -> timedelta | None:
    """How long a message waits for a listening worker to claim its task from the
    commit's announcement (``KERNEL_HINT_GRACE_MS``); ``None`` where workers do not
    listen."""
    if not settings.KERNEL_LISTEN:
        return None
    return timedelta(milliseconds=settings.KERNEL_HINT_GRACE_MS)


def _dead_owners(now: datetime) -> list[str]:
    """The silent workers' lease owners, judged by this process (a sweep runs on a worker,
    whose own heartbeat says how long the database has been in reach)."""
    from controlplane.worker import heartbeats

    beat = heartbeats.current()
    if beat is None:
        return dead_owners(now)
    return dead_owners(now, sweeper_steady=beat.steady_for(now))


def dispatcher_of(
    kernel: Kernel,
    deliver: Callable[[str, str], None] = deliver,
    advance_queue: Callable[[str], None] = send_advance_queue,
) -> Dispatcher:
    """The dispatcher of ``kernel``'s commits as the settings configure it, sending
    through ``deliver`` and ``advance_queue`` (the app's broker unless given)."""
    return Dispatcher(
        kernel,
        deliver,
        redeliver_after=timedelta(seconds=settings.KERNEL_REDELIVER_SECONDS),
        advance_queue=advance_queue,
        messages=settings.KERNEL_DISPATCH_MESSAGES,
        announce_grace=announce_grace(),
        dead_owners=_dead_owners,  # the registry's silent workers: their leases end now
    )


@dataclass(frozen=True)
class Runtime:
    kernel: Kernel
    dispatcher: Dispatcher
    worker: Worker


@functools.cache
def runtime() -> Runtime:
    kernel = process_kernel()
    dispatcher = dispatcher_of(kernel)
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


def forget_runtime() -> None:
    """Build the runtime, and its Kernel, again on next use (for tests that change the
    settings they are built from)."""
    runtime.cache_clear()
    forget()


def built() -> bool:
    """Whether this process has built its runtime (so there may be a heartbeat to stop)."""
    return runtime.cache_info().currsize > 0
