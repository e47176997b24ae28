"""The LangGraph saver benchmark, run with tiny counts: ours on the test database,
PostgresSaver on a scratch database of its own (created and dropped here), so that the
benchmark's code cannot rot unnoticed (``make bench`` is not part of ``make test``)."""

from __future__ import annotations

import os

import pytest

from benchmarks._support import BENCH_DATABASE, database_url, recreate_database
from benchmarks.langgraph import FLOOR, HEADING, OPERATIONS, STEPS, render, run

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_benchmark_measures_both_savers_and_renders_its_section() -> None:
    peer = database_url(f"{BENCH_DATABASE}_langgraph_smoke_{os.getpid()}")
    recreate_database(peer)
    try:
        result = run(peer, count=4, blocks=2, runs=1)
    finally:
        import psycopg
        from psycopg import sql
        from psycopg.conninfo import conninfo_to_dict, make_conninfo

        name = str(conninfo_to_dict(peer)["dbname"])
        with psycopg.connect(make_conninfo(peer, dbname="postgres"), autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)))
    for saver in ("session_store", "postgres_saver"):
        assert set(result.latency[saver]) == set(OPERATIONS)
        assert all(result.latency[saver][op].count == 4 for op in OPERATIONS)
        assert result.statements[saver]["put"] >= 1
    assert all(result.latency[FLOOR][op].count == 4 for op in OPERATIONS)
    assert set(result.graph) == {"none", "session_store", "postgres_saver"}
    assert result.rows["kernel_commit"] > 0
    section = render(result)
    assert section.startswith(HEADING) and f"{STEPS}-step graph" in section
    assert "during this run" in section and "kernel commit alone" in section
