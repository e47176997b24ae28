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

A web process also collects its young objects less often than CPython's default (a
collection every 700 new containers). A page or a request holds a read's rows while it
waits for the database (a search's ids, a page's rows): collected that often, they
outlive two young collections, reach the oldest generation, and soon set off a full
collection, which walks every unfrozen object with the interpreter held, so that no
other page of the process renders meanwhile. One account's heavy reads then stall every
other account's live pages, again and again. With :data:`YOUNG_THRESHOLD`, what a request
holds is freed before a young collection comes for it. A larger threshold would make
each young collection a longer pause of its own.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 20_000
"""New container objects (net of those freed) before a web process's young collection."""


def freeze() -> int:
    """Collect, and freeze what is left; returns how many objects were frozen. Called
    once a process has started (a web process: :func:`settle`; a worker: once it is
    ready, :func:`controlplane.worker.execution.resume`), never per request or message."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def settle() -> int:
    """A web process's :func:`freeze`, after loading what every request will use (the
    URL conf, hence every view), and its young collections made rarer
    (:data:`YOUNG_THRESHOLD`). Called from :mod:`controlplane.asgi`."""
    from django.urls import get_resolver

    get_resolver().url_patterns  # noqa: B018  (imports the views)
    frozen = freeze()
    gc.set_threshold(YOUNG_THRESHOLD, *gc.get_threshold()[1:])
    return frozen
