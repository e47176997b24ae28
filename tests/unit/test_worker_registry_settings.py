"""The worker registry's timings are refused at start-up when the dead-worker sweep could
take a live worker for dead with them (docs/deploy.md)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest


def start_up(**env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "import controlplane.settings"],
        env={**os.environ, "DJANGO_DEBUG": "1", **env}, capture_output=True, text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"WORKER_HEARTBEAT_SECONDS": "3", "WORKER_DEAD_SECONDS": "10"},
         "WORKER_DEAD_SECONDS: 10.0 is less than four heartbeats"),
        ({"WORKER_HEARTBEAT_SECONDS": "0"}, "WORKER_HEARTBEAT_SECONDS: '0' is not"),
        ({"WORKER_DEAD_SECONDS": "ten"}, "WORKER_DEAD_SECONDS: 'ten' is not"),
        ({"WORKER_HEARTBEAT_SECONDS": "nan"}, "WORKER_HEARTBEAT_SECONDS: 'nan' is not"),
    ],
)
def test_worker_timings_the_sweep_cannot_judge_by_are_refused(
    env: dict[str, str], message: str
) -> None:
    found = start_up(**env)
    assert found.returncode != 0
    assert "ImproperlyConfigured" in found.stderr
    assert re.search(message, found.stderr), found.stderr[-500:]


def test_worker_timings_of_four_heartbeats_start() -> None:
    found = start_up(WORKER_HEARTBEAT_SECONDS="0.5", WORKER_DEAD_SECONDS="2")
    assert found.returncode == 0, found.stderr[-500:]
