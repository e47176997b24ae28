"""A web process and a worker freeze their start-up heap (``controlplane.process.heap``), so
that the cyclic collector's full walks cover only what requests and phases made, not
every module and view."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from django.test import override_settings

ROOT = Path(__file__).resolve().parents[2]


def test_the_asgi_application_freezes_its_heap_after_loading_every_view() -> None:
    probe = (
        "import gc, sys\n"
        "import controlplane.asgi\n"
        "print(gc.get_freeze_count(), 'controlplane.ui.tasks' in sys.modules)\n"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "controlplane.settings",
           "DJANGO_DEBUG": "1"}
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60, check=True)
    frozen, views_loaded = done.stdout.split()
    assert int(frozen) > 10_000, done.stdout  # Django and the apps, not a handful
    assert views_loaded == "True"


def test_a_worker_freezes_its_heap_once_it_is_ready(monkeypatch: pytest.MonkeyPatch) -> None:
    from controlplane.worker import execution

    class Report:
        pass

    class Sender:  # what worker_ready hands over: queues to wake
        class app:  # noqa: N801
            class amqp:  # noqa: N801
                class queues:  # noqa: N801
                    consume_from = {"hands": None}

    runtime = SimpleNamespace(dispatcher=SimpleNamespace(resume=Report))
    woken: list[str] = []
    monkeypatch.setattr(execution, "runtime", lambda: runtime)
    monkeypatch.setattr(execution, "send_advance_queue", woken.append)
    monkeypatch.setattr(execution, "close_old_connections", lambda: None)
    frozen_before = gc.get_freeze_count()  # an earlier test may have loaded the asgi app
    gc.unfreeze()
    try:
        with override_settings(KERNEL_LISTEN=False):
            execution.resume(Sender)
        assert gc.get_freeze_count() > 10_000  # Django, Celery and the apps
    finally:
        gc.unfreeze()
        if frozen_before:
            gc.freeze()
    assert woken == ["hands"]
