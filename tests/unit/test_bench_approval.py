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
    assert "loaded by other engineers" in met
    assert "Target p99 <= 200 ms: NOT met." in render(result(0.5))
