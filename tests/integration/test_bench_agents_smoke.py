"""The agents benchmark, run small against the test database (and a DBOS system database
of its own beside it): its code must not rot between runs of ``make bench
BENCH_ARGS=agents``. Checks shapes, never speed."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.db import connection

from benchmarks import agents
from benchmarks._support import BENCH_DATABASE, database_url, recreate_database

pytestmark = pytest.mark.django_db(transaction=True)


def test_every_variant_runs_its_steps_and_the_report_renders(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(agents, "STEPS", 3)
    name = connection.settings_dict["NAME"]
    url = database_url(name)
    # One of its own per test database: two suites on one server never share it.
    dbos_url = database_url(f"{BENCH_DATABASE}_agents_dbos_{name}"[:63], url)
    recreate_database(dbos_url)
    samples = agents.measure(url, dbos_url, runs=2, block=1)
    # Every variant ran 2 runs (after its warm-up) of 3 steps each.
    assert {variant: [len(run) for run in found] for variant, found in samples.items()} == {
        variant: [3, 3] for variant in agents.VARIANTS}
    info = {"load_before": "1.0", "load_after": "1.0", "cpus": "2", "python": "3",
            "pydantic_ai": "x", "dbos": "y", "version": "15", "fsync": "on",
            "synchronous_commit": "on"}
    section = agents.render(datetime.now(UTC), info, samples, 2, "make bench BENCH_ARGS=agents")
    assert section.startswith(agents.HEADING)
    assert "| kernel-safe | 6 |" in section and "| dbos | 6 |" in section
    assert "Target (at most 5 ms added per step" in section
    assert "| variant | first step p50 / p99 | middle step p50 / p99 | last step p50 / p99 |" \
        in section and section.count("| kernel |") == 2  # the totals and by position
