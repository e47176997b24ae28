"""The dashboard benchmark, run with tiny counts against the test database: its seeding,
its render measurement and its report stay working (``make bench`` is not in ``make test``)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.db import connection

from benchmarks._support import Stats, seed_session, seed_tasks
from benchmarks.ui import (
    EMBEDDED_HEADING,
    HEADING,
    SCAN_PATH,
    TASK_QUERIES,
    TASKS_HEADING,
    TRIGRAM_PATH,
    Browser,
    Result,
    measure_render,
    measure_tasks_page,
    render,
    render_tasks_page,
    seed_long_task,
    tasks_heading,
    trigram_index,
    without_trigram_index,
)
from controlplane.reads import pages, tasks
from controlplane.storage import search


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


@pytest.mark.django_db(transaction=True)
def test_the_tasks_page_seed_measure_and_report_on_both_paths() -> None:
    sessions = seed_tasks(240, sessions=4)
    assert len(sessions) == 4
    assert tasks.count(tasks.TaskFilter()) == 240
    assert tasks.count(tasks.TaskFilter(outcome="failed")) == 40
    renewal = tasks.ids(tasks.TaskFilter(text="renewal"), 240)
    assert renewal
    assert trigram_index(), "the test server has pg_trgm: migration 0006 made the index"
    with_index = measure_tasks_page(runs=2, warmup=1)
    without_trigram_index()
    try:
        assert not trigram_index()
        assert tasks.ids(tasks.TaskFilter(text="renewal"), 240) == renewal  # the same tasks
        without = measure_tasks_page(runs=2, warmup=1)
    finally:  # the later tests' database has its index again
        with connection.cursor() as cur:
            cur.execute(f"DROP STATISTICS {search.STATISTICS}")
            cur.execute(search.CREATE_INDEX)
    assert set(without) == set(TASK_QUERIES) and all(s.count == 2 for s in without.values())
    both = Result(datetime.now(UTC), 120, None, None, (0.5, 0.6), found=240,
                  tasks_page={TRIGRAM_PATH: with_index, SCAN_PATH: without}, server="PG")
    assert tasks_heading(both) == TASKS_HEADING
    section = render_tasks_page(both)
    assert section.startswith(TASKS_HEADING + "\n")
    assert f"| newest first, no filter (`/tasks/`) (ms) | {TRIGRAM_PATH} | 2 |" in section
    assert f"| newest first, no filter (`/tasks/`) (ms) | {SCAN_PATH} | 2 |" in section
    embedded = Result(datetime.now(UTC), 120, None, None, (0.5, 0.6), found=240,
                      tasks_page={SCAN_PATH: without}, server="PG")
    assert render_tasks_page(embedded).startswith(EMBEDDED_HEADING + "\n")
    assert TRIGRAM_PATH not in render_tasks_page(embedded).split("|---|")[-1]
