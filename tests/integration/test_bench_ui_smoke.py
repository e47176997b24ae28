"""The dashboard benchmark, run with tiny counts against the test database: its seeding,
its render measurement and its report stay working (``make bench`` is not in ``make test``)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from benchmarks._support import Stats
from benchmarks.ui import (
    HEADING,
    Browser,
    Result,
    measure_render,
    render,
    seed_long_task,
    seed_session,
)
from controlplane.reads import pages, tasks


@pytest.mark.django_db(transaction=True)
def test_seed_render_and_report() -> None:
    session_id, root = seed_session(120)
    assert tasks.child_counts(session_id, [root])[root] == {
        "succeeded": 23, "running": 24, "pending": 24, "waiting": 24, "sleeping": 24}
    stats = measure_render(session_id, runs=3, warmup=1)
    assert stats.count == 3 and stats.p50 > 0
    long_task = seed_long_task(30)
    timeline = pages.timeline(long_task, tasks.get(long_task).session_id, True)
    assert [r.phase for r in timeline.rows] == [f"p{n}" for n in range(30)]
    assert sum(r.seconds for r in timeline.rows) == timeline.seconds == 30.0
    assert timeline.rows[0].holders == ["bench-host:1000"]
    used: list[float] = []
    timed = measure_render(long_task, runs=2, warmup=1, path="/tasks/{}/", cpu=used)
    assert len(used) == 2 and all(u > 0 for u in used)
    section = render(Result(datetime.now(UTC), 120, stats, Browser([10.0], [20.0], 1000),
                            (0.5, 0.6), timed, 30, {"timeline": Stats.of(used)}))
    assert section.startswith(HEADING + "\n")
    assert "| server render of the session page (ms) | 3 |" in section
    assert "navigation to socket live" in section
    assert "| server render of the task page, a 30-phase timeline (ms) | 2 |" in section
    assert "| … its CPU time in the server process (ms) | 2 |" in section
