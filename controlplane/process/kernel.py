"""The process's one Kernel: the kernel on the Postgres Session Store, with this
deployment's registry (``KERNEL_REGISTRY``), its artifact store and the database's clock.

The reads take it from here, and so does :mod:`controlplane.worker.runtime`, which hangs
the process's delivery, hints and lease renewal on the same Kernel. Building it opens no
connection.
"""

from __future__ import annotations

import functools

from django.conf import settings
from django.utils.module_loading import import_string

from controlplane.storage import DatabaseClock, PostgresArtifacts, PostgresStorage, S3Artifacts
from kernel import Kernel, Registry
from kernel.artifacts import ArtifactStore


def artifact_store() -> ArtifactStore:
    """Postgres, or the S3-compatible store the settings name (ARTIFACT_S3_ENDPOINT)."""
    if settings.ARTIFACT_S3_ENDPOINT:
        return S3Artifacts.connect(settings.ARTIFACT_S3_ENDPOINT, settings.ARTIFACT_S3_BUCKET)
    return PostgresArtifacts()


def build_registry() -> Registry:
    """Every task and document kind this deployment runs, from the function that
    ``KERNEL_REGISTRY`` names: a task kind is known to every process or to none."""
    registry: Registry = import_string(settings.KERNEL_REGISTRY)()
    return registry


@functools.cache
def process_kernel() -> Kernel:
    # One clock for claims, due times and lease expiry: the database's, so that workers
    # whose own clocks disagree still judge a lease the same way.
    return Kernel(PostgresStorage(), build_registry(), DatabaseClock(), artifacts=artifact_store())


def forget() -> None:
    """Build the Kernel again on next use (for tests that change the settings it is
    built from)."""
    process_kernel.cache_clear()
