"""What a process does with its heap once it has started.

A Django process holds a few hundred thousand long-lived objects after start-up
(modules, the URL conf and its views, settings, the registry; in a worker, Celery and
the runtime too). CPython's cyclic collector walks every one of them on each full
collection. In a web process, a page that allocates many containers (the timeline of a
task with thousands of phases reads thousands of rows) sets one off every few requests:
that walk can cost more CPU than the render itself (``make bench BENCH_ARGS=ui``
shows it). In a worker, a full collection during a run stalls the phase it was running
and every announcement meanwhile (the idle dispatch's tail). Frozen objects (:func:`gc.freeze`)
are left out of every collection; the garbage a request or a phase makes is still
collected, now by walking only what came after start-up.
"""

from __future__ import annotations

import gc


def freeze() -> int:
    """Collect, and freeze what is left; returns how many objects were frozen. Called
    once a process has started (a web process: :func:`settle`; a worker: once it is
    ready, :func:`controlplane.worker.execution.resume`), never per request or message."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def settle() -> int:
    """A web process's :func:`freeze`, after loading what every request will use (the
    URL conf, hence every view). Called from :mod:`controlplane.asgi`."""
    from django.urls import get_resolver

    get_resolver().url_patterns  # noqa: B018  (imports the views)
    return freeze()
