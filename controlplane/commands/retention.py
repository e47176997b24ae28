"""Retention: the commit log's partitions made ahead, finished sessions' history pruned,
unreferenced artifacts swept. Beat and the shell ask for them; no user does, so they
are logged rather than recorded in a session."""

from __future__ import annotations

import logging

from django.conf import settings

from controlplane.errors import Conflict, Invalid
from controlplane.storage import (
    PostgresStorage,
    PruneRunning,
    partitions_to_make,
    prepare_partitions,
    referenced_artifacts,
)
from controlplane.worker.runtime import runtime
from kernel.retention import Progress, PruneReport, RetentionPolicy, quiet

log = logging.getLogger(__name__)


def retention_policy() -> RetentionPolicy:
    """The policy the settings configure (KERNEL_RETENTION_DAYS and _BY_STATUS)."""
    try:
        return RetentionPolicy(
            settings.KERNEL_RETENTION_DAYS, dict(settings.KERNEL_RETENTION_DAYS_BY_STATUS)
        )
    except ValueError as exc:
        raise Invalid(f"KERNEL_RETENTION_DAYS_BY_STATUS: {exc}") from exc


def prune(*, dry_run: bool = False, progress: Progress = quiet) -> PruneReport:
    """Make the commit log's partitions ahead, then remove the history of the finished
    sessions the retention policy says are due (kernel.retention); ``dry_run`` only
    counts. The shell (``manage.py prune``) and beat (daily) ask for it; no user does, so
    it is logged rather than recorded in a session. Raises PruneRunning (errors.Conflict)
    if another prune holds the lock."""
    kernel = runtime().kernel
    storage = kernel.storage
    assert isinstance(storage, PostgresStorage)  # the partitions are Postgres's
    now = kernel.clock.now()
    period = settings.KERNEL_COMMIT_PARTITION, settings.KERNEL_COMMIT_PARTITIONS_AHEAD
    unmade = []
    if dry_run:
        # The run makes these first, moving the default partition's rows of their
        # periods there: the dry run plans them as made, so that it says which
        # partitions the run drops whole.
        unmade = partitions_to_make(now, *period)
        progress(f"partitions to make: {', '.join(p.name for p in unmade) or 'none needed'}")
    else:
        made = prepare_partitions(now, *period)
        progress(f"partitions made: {', '.join(made) or 'none needed'}")
    try:
        report = storage.prune(retention_policy(), now, dry_run=dry_run, progress=progress,
                               unmade=unmade)
    except PruneRunning as exc:
        raise Conflict(str(exc)) from exc
    log.info("prune: %s", report.summary())
    return report


def sweep_artifacts() -> int:
    """Remove the artifacts older than the grace period (kernel.artifacts.GRACE) that no
    entry, document version or task that has not ended references
    (Storage.referenced_artifacts), from the store the settings name; how many. Beat
    asks for it daily (controlplane.celery.ARTIFACT_SWEEP); it is logged, as the prune
    is."""
    kernel = runtime().kernel
    assert kernel.artifacts is not None  # set by the kernel when not given
    removed = kernel.artifacts.sweep(referenced_artifacts, kernel.clock.now())
    log.info("artifact sweep: %d unreferenced artifact(s) removed", removed)
    return removed
