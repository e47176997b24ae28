"""The dashboard benchmark, run with tiny counts against the test database: its seeding,
its render measurement and its report stay working (``make bench`` is not in ``make test``)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from benchmarks.ui import HEADING, Browser, Result, measure_render, render, seed_session
from controlplane.reads import tasks


@pytest.mark.django_db(transaction=True)
def test_seed_render_and_report() -> None:
    session_id, root = seed_session(120)
    assert tasks.child_counts(session_id, [root])[root] == {
        "succeeded": 23, "running": 24, "pending": 24, "waiting": 24, "sleeping": 24}
    stats = measure_render(session_id, runs=3, warmup=1)
    assert stats.count == 3 and stats.p50 > 0
    section = render(Result(datetime.now(UTC), 120, stats, Browser([10.0], [20.0], 1000),
                            (0.5, 0.6)))
    assert section.startswith(HEADING + "\n")
    assert "| server render of the session page (ms) | 3 |" in section
    assert "navigation to socket live" in section
