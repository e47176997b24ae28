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


def in_a_web_process(probe: str) -> subprocess.CompletedProcess[str]:
    """``probe`` run by a fresh interpreter that has loaded the ASGI application."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "controlplane.settings",
           "DJANGO_DEBUG": "1"}
    return subprocess.run([sys.executable, "-c", "import controlplane.asgi\n" + probe],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
                          check=True)


def test_the_asgi_application_freezes_its_heap_after_loading_every_view() -> None:
    probe = (
        "import gc, sys\n"
        "print(gc.get_freeze_count(), 'controlplane.ui.tasks' in sys.modules)\n"
    )
    done = in_a_web_process(probe)
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


def test_requests_holding_thousands_of_rows_set_off_no_full_collection() -> None:
    """A web process's page or request holds a read's rows while it waits for the database
    (a search's ids, a page's rows). Promoted to the oldest generation, they would set off
    full collections, each walking the whole unfrozen heap with the interpreter held, while
    no other page of the process renders."""
    probe = (
        "import gc\n"
        "full = []\n"
        "gc.callbacks.append(lambda phase, info: phase == 'stop' and info['generation'] == 2"
        " and full.append(1))\n"
        "for request in range(300):\n"
        "    rows = [{'id': n, 'tags': [n]} for n in range(2500)]  # 5,000 containers held\n"
        "    for n in range(2000):  # what a render makes and drops meanwhile\n"
        "        [{'cell': n}]\n"
        "    del rows\n"
        "print(len(full))\n"
    )
    done = in_a_web_process(probe)
    assert int(done.stdout) == 0, done.stdout
