"""The Celery app: carries "advance task X", "advance queue Q", the once-a-second sweep, the
daily prune and the daily sweep of unreferenced artifacts.

Start a worker with ``celery -A controlplane.celery worker -Q default,hands,brain``
and beat with ``celery -A controlplane.celery beat``.
"""

from __future__ import annotations

import os

from celery import Celery
from celery.schedules import crontab
from celery.signals import setup_logging

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

ADVANCE = "controlplane.advance"
"""The task that claims a kernel task and runs its phases (controlplane.worker.execution)."""
ADVANCE_QUEUE = "controlplane.wake"
"""The task that claims a queue's runnable tasks from Postgres and runs them
(controlplane.worker.execution): what one ``advance`` message also does after its own task."""
SWEEP = "controlplane.sweep"
"""The task that re-delivers what was lost, once a second from beat."""
PRUNE = "controlplane.prune"
"""Retention: the daily prune of finished sessions' history (controlplane.commands.prune)."""
ARTIFACT_SWEEP = "controlplane.sweep_artifacts"
"""The daily removal of artifacts no record references (controlplane.commands.sweep_artifacts):
what a writer that died between storing an artifact and committing its reference left,
and what the prune's removals left."""

# The worker registry's signal handlers are connected when a worker imports its tasks.
app = Celery("controlplane",
             include=["controlplane.worker.execution", "controlplane.worker.heartbeats"])
app.config_from_object("django.conf:settings", namespace="CELERY")


@setup_logging.connect
def configure_logging(loglevel: object = None, **kwargs: object) -> None:
    """Worker and beat log like the web process (controlplane.process.logs), at ``-l``'s level;
    connecting here keeps Celery from installing its own handlers."""
    import logging

    from controlplane.process import logs

    level = logging.getLevelName(loglevel) if isinstance(loglevel, int) else loglevel
    logs.apply(logs.config(level=str(level) if level else None))


@app.on_after_configure.connect
def schedule_sweep(sender: Celery, **kwargs: object) -> None:
    from django.conf import settings

    # A sweep that waited longer than two periods is stale: drop it, a fresh one follows.
    sender.add_periodic_task(
        settings.KERNEL_SWEEP_SECONDS,
        sender.signature(SWEEP),
        name="sweep",
        expires=2 * settings.KERNEL_SWEEP_SECONDS,
    )
    # Daily; two beats would start two, and the second finds the first's lock and stops.
    sender.add_periodic_task(
        crontab(hour=settings.KERNEL_PRUNE_HOUR, minute=0),
        sender.signature(PRUNE),
        name="prune",
    )
    # Daily, after the prune (whose removed entries may leave artifacts unreferenced); two
    # beats' sweeps remove the same rows, which changes nothing.
    sender.add_periodic_task(
        crontab(hour=settings.KERNEL_PRUNE_HOUR, minute=30),
        sender.signature(ARTIFACT_SWEEP),
        name="sweep_artifacts",
    )
