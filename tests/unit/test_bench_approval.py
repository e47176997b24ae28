"""The approval benchmark's report: its figures and whether the target is met, said as
the run found them (benchmarks/approval.py; the run itself needs real processes)."""

from __future__ import annotations

from datetime import UTC, datetime

from benchmarks._support import Stats
from benchmarks.approval import HEADING, Result, render


def result(p99_seconds: float) -> Result:
    found = Result(datetime(2026, 12, 3, tzinfo=UTC), {"cpu": "x", "nproc": "2",
                                                      "version": "15", "load_start": "7"})
    found.calls = 3
    found.to_start = Stats.of([0.1, 0.12, p99_seconds])
    found.answered = Stats.of([0.09, 0.1, 0.11])
    found.load_end = "8"
    return found


def test_the_report_says_whether_p99_meets_the_target_and_that_the_machine_was_loaded() -> None:
    met = render(result(0.15))
    assert met.startswith(HEADING) and "Target p99 <= 200 ms: met." in met
    assert "**The machine was loaded by other work during this run**" in met  # load 8
    assert "Target p99 <= 200 ms: NOT met." in render(result(0.5))


def test_a_report_says_the_machine_was_loaded_only_when_it_was() -> None:
    from benchmarks._support import machine_state

    assert "otherwise idle" in machine_state("0.80", cpus=2)
    assert "otherwise idle" in machine_state(1.9, cpus=2)
    assert "loaded by other work" in machine_state("8.6 10.4 8.8", cpus=2)
    assert "not read" in machine_state("?", cpus=2)
    quiet = render(result(0.15))  # load 7 at the start: loaded
    assert "loaded by other work" in quiet
