"""``manage.py`` as a person runs it from a shell: when the database cannot be reached,
each command says so in a line naming the database and how to get one, and exits 1,
without a page of traceback (``--traceback`` still shows it)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from controlplane.dev.ports import free_port
from controlplane.dev.processes import ROOT, process_env


def manage(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, capture_output=True, text=True,
        timeout=120, env=process_env(database_url, DJANGO_DEBUG="1"))


@pytest.mark.parametrize("args", [["tasks"], ["prune", "--dry-run"], ["migrate"]])
def test_a_command_without_its_database_says_so_in_a_line(args: list[str]) -> None:
    url = f"postgresql://postgres:hunter2@127.0.0.1:{free_port()}/durable"
    done = manage(url, *args)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert "database unavailable" in done.stderr and "make services" in done.stderr
    assert f"127.0.0.1:{url.rsplit(':', 1)[1].split('/')[0]}" in done.stderr
    assert "hunter2" not in done.stderr  # the URL's password is not printed


def test_with_traceback_the_whole_traceback_is_shown() -> None:
    done = manage(f"postgresql://postgres@127.0.0.1:{free_port()}/durable", "tasks",
                  "--traceback")
    assert done.returncode == 1 and "Traceback" in done.stderr
