"""The soak's parts that need no stack: the ``SOAK_FAULTS`` switch, the remote model's
script, the clock-step hook (in a real child process) and the report's landed table."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from . import model
from .harness import CLOCK_HOOK, OPTIONAL, Report, optional_faults


def test_soak_faults_names_the_optional_faults_or_all() -> None:
    assert optional_faults("") == frozenset()
    assert optional_faults("all") == frozenset(OPTIONAL)
    assert optional_faults("values, orphans") == {"values", "orphans"}
    with pytest.raises(ValueError, match="unknown \\['nul'\\]"):
        optional_faults("values,nul")


def test_the_remote_model_calls_the_named_tool_once_per_turn() -> None:
    text = model.tool_text("u-1", "soak_job", "fail", 2.5)
    first = model.script({"messages": [{"role": "user", "content": text}]})
    assert [c["name"] for c in first.tool_calls] == ["soak_job"]
    assert first.tool_calls[0]["arguments"] == {"mode": "fail", "seconds": 2.5}
    answered = {"messages": [{"role": "user", "content": text},
                             {"role": "tool", "content": "not json"}]}
    assert model.script(answered).tool_calls == ()
    # A later turn in the same conversation: the earlier tool result precedes its text.
    later = {"messages": [*answered["messages"], {"role": "assistant", "content": "Done"},
                          {"role": "user", "content": model.tool_text("u-2", "soak_work",
                                                                       "ok", 1)}]}
    assert [c["name"] for c in model.script(later).tool_calls] == ["soak_work"]


def test_the_clock_hook_steps_wall_time_and_the_kernel_clock_not_the_monotonic(
    tmp_path: Path,
) -> None:
    clock = tmp_path / "clock"
    clock.write_text("0\n")
    probe = (
        "import sys, time\n"
        "from kernel.clock import SystemClock\n"
        "def look():\n"
        "    return (time.time(), SystemClock().now().timestamp(), time.monotonic())\n"
        "before = look()\n"
        f"open({str(clock)!r}, 'w').write('-30')\n"
        "time.sleep(0.3)\n"  # the hook re-reads its file at most every 0.1 s
        "after = look()\n"
        "print(*(round(a - b, 1) for a, b in zip(after, before)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True,
        timeout=60, env={"PYTHONPATH": str(CLOCK_HOOK), "SOAK_CLOCK_FILE": str(clock),
                         "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    wall, kernel, monotonic = (float(x) for x in done.stdout.split())
    assert wall == pytest.approx(-29.7, abs=0.3)
    assert kernel == pytest.approx(-29.7, abs=0.3)
    assert monotonic == pytest.approx(0.3, abs=0.2)


def test_tool_runs_are_timed_by_the_machine_clock_not_the_stepped_one(
    tmp_path: Path,
) -> None:
    """The harness sets each tool run beside its faults' times, which it takes from the
    machine's clock; a run timed by the worker's stepped clock (up to 10 s off) missed
    the Postgres restart that cut it short and was reported as a violation."""
    import time

    clock = tmp_path / "clock"
    clock.write_text("-30\n")
    probe = "from tests.soak.tools import record\nrecord('soak_stamp', 'task_1', 'started')\n"
    checkout = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=checkout, capture_output=True, text=True,
        timeout=60, env={"PYTHONPATH": str(CLOCK_HOOK), "SOAK_CLOCK_FILE": str(clock),
                         "AGENT_TOOL_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    [line] = (tmp_path / "soak-runs").read_text().splitlines()
    *_, at = line.split()
    assert float(at) == pytest.approx(time.time(), abs=5)


def test_the_report_counts_landed_against_attempted_per_action_kind() -> None:
    report = Report(seed=1, seconds=60)
    report.actions.update({"cancel-running:200": 3, "cancel-running:409": 2,
                           "cancel-running:0": 1, "resolve-settle:200": 4,
                           "bulk-retry-preview:200": 5, "find:200": 9, "wake:503": 1})
    assert report.by_action() == {
        "cancel-running": {"attempted": 6, "landed": 3, "no answer": 1, "refused (409)": 2},
        "wake": {"answered 503": 1, "attempted": 1},
    }
    report.landed["cancels of running work landed"] = 5
    assert report.targets()["cancels of running work landed"] == {
        "want": 5, "got": 5, "met": True}
