"""What a web process does with its heap once it has started.

A Django process holds a few hundred thousand long-lived objects after start-up
(modules, the URL conf and its views, settings, the registry). CPython's cyclic collector
walks every one of them on each full collection, and a page that allocates many
containers (the timeline of a task with thousands of phases reads thousands of rows)
sets one off every few requests: measured, that walk turned a 42 ms render into 110 ms
of CPU for one request in four (``make bench BENCH_ARGS=ui``). Frozen objects
(:func:`gc.freeze`) are left out of every collection; the garbage a request makes is
still collected, now by walking only what came after start-up.
"""

from __future__ import annotations

import gc


def settle() -> int:
    """Load what every request will use (the URL conf, hence every view), collect, and
    freeze what is left; returns how many objects were frozen. Called once the process
    has started (:mod:`controlplane.asgi`), never per request."""
    from django.urls import get_resolver

    get_resolver().url_patterns  # noqa: B018  (imports the views)
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
