"""A web process freezes its start-up heap (``controlplane.heap``), so that the cyclic
collector's full walks cover only what requests made, not every module and view."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
