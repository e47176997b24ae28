"""The phase-commit benchmark, run with tiny counts against the test database.

``make bench`` is not part of ``make test``, so without this its code could rot
unnoticed until someone needs the figures. These tests run every measurement
function once (never the ``durable_bench`` database) and check that the results
are shaped as the report expects.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from benchmarks._support import (
    EARLIER_RUNS,
    Stats,
    database_url,
    machine_facts,
    percentile,
    replace_section,
    write_section,
)
from benchmarks.commit import (
    HEADING,
    PYTHON,
    RAW_STEPS,
    READS,
    WRITES,
    Result,
    Throughput,
    measure_cpu,
    measure_latency,
    measure_throughput,
    profile_phase_commit,
    render,
)
from controlplane.storage import PostgresStorage

DB = pytest.mark.django_db(transaction=True)


def bench_test_url() -> str:
    """The test database's URL, built the way the benchmark builds its own."""
    from django.db import connection

    return database_url(connection.settings_dict["NAME"])


def sane(stats: Stats, count: int) -> None:
    assert stats.count == count
    assert 0 < stats.p50 <= stats.p90 <= stats.p99 <= stats.max
    assert stats.mean > 0


@DB
def test_latency_profile_and_report() -> None:
    url = bench_test_url()
    storage = PostgresStorage()
    latency = measure_latency(storage, url, warmup=3, count=20, block=7)
    for stats in (latency.phase, latency.finish, latency.general, latency.raw):
        sane(stats, 20)
    sane(latency.claim, 40)
    assert latency.ratio_p50 > 0 and latency.ratio_p99 > 0
    assert list(latency.raw_steps) == list(RAW_STEPS)
    assert all(ms > 0 for ms in latency.raw_steps.values())

    profile = profile_phase_commit(storage, count=5)
    labels = {cost.label for cost in profile.costs}
    # A lease's commit is one statement, after a fresh lease's read of the document's
    # head; the general commit's reads show only when a baseline falls due.
    assert {WRITES, PYTHON} <= labels <= {READS, WRITES, PYTHON}
    assert profile.statements_per_commit >= 2
    assert all(cost.per_commit > 0 for cost in profile.costs)

    # Every mode once; a spawned process sets Django up on the URL it is given.
    throughput = [
        measure_throughput(url, workload="phase", sessions=1, seconds=0.1, mode="sequential"),
        measure_throughput(url, workload="phase", sessions=2, seconds=0.1, mode="threads"),
        measure_throughput(url, workload="raw", sessions=2, seconds=0.1, mode="threads"),
        measure_throughput(url, workload="phase", sessions=1, seconds=0.1, mode="processes"),
    ]
    for result, sessions in zip(throughput, (1, 2, 2, 1), strict=True):
        assert isinstance(result, Throughput)
        assert result.sessions == sessions
        assert result.commits >= sessions  # every worker commits at least once
        assert result.seconds >= 0.1 and result.per_second > 0
        sane(result.latency, result.commits)
    # CPU in the timed window: a process's own counter, and its backend's on this host;
    # threads share their process's counter, so theirs is not given.
    alone = throughput[3]
    assert alone.client_ms is not None and alone.client_ms >= 0
    assert alone.server_ms is not None and alone.server_ms >= 0
    assert throughput[1].client_ms is None
    # What the sampler saw in the timed window (0.1 s: perhaps nothing): a state and wait
    # event per backend, averaged over the samples, so at most the sessions and the
    # server's own processes.
    assert all(", " in key or key.startswith("[") for key in alone.waits)
    assert sum(alone.waits.values()) < 20

    cpu = measure_cpu(storage, url, count=5)
    assert set(cpu) == {"phase", "raw"}
    assert all(c.commits == 5 and c.client_ms >= 0 for c in cpu.values())

    facts = machine_facts(url)
    section = render(Result(datetime.now(UTC), facts, latency, profile, cpu, throughput))
    assert section.startswith(HEADING + "\n")
    assert "| phase commit: entry + doc set + `Next` (keep lease) | 20 |" in section
    assert section.count("| phase commit (`Next`, keep lease) |") == 4  # 3 throughput + CPU
    if alone.waits:
        assert "| phase commit (`Next`, keep lease), 1 processes |" in section  # the waits


def test_percentile_is_nearest_rank() -> None:
    ordered = [float(i) for i in range(1, 101)]
    assert percentile(ordered, 50) == 50.0
    assert percentile(ordered, 99) == 99.0
    assert percentile([3.0], 99) == 3.0


def test_a_rerun_replaces_only_its_own_section(tmp_path: Path) -> None:
    report = tmp_path / "benchmarks.md"
    report.write_text("# Benchmarks\n\nintro\n\n## Other\n\nkeep me\n")
    write_section(HEADING, f"{HEADING}\n\nfirst run\n", report)
    write_section("## Later", "## Later\n\nlater section\n", report)
    write_section(HEADING, f"{HEADING}\n\nsecond run\n", report)
    text = report.read_text()
    assert "first run" not in text and text.count("second run") == 1
    assert text.index("## Other") < text.index(HEADING) < text.index("## Later")
    assert "keep me" in text and "later section" in text and text.count(HEADING) == 1
    assert replace_section("", HEADING, HEADING) == HEADING + "\n"


def test_a_rerun_keeps_the_earlier_runs_written_under_its_printout(tmp_path: Path) -> None:
    report = tmp_path / "benchmarks.md"
    report.write_text(f"# Benchmarks\n\n{HEADING}\n\nold printout\n\n{EARLIER_RUNS}\n\n"
                      "**Yesterday:** 2.1x by hand\n\n## Other\n\nkeep me\n")
    write_section(HEADING, f"{HEADING}\n\nnew printout\n", report)
    text = report.read_text()
    assert "old printout" not in text and "new printout" in text
    assert text.index("new printout") < text.index(EARLIER_RUNS) < text.index("**Yesterday:** 2.1x")
    assert text.index("**Yesterday:**") < text.index("## Other") and "keep me" in text
    write_section(HEADING, f"{HEADING}\n\nnewer printout\n", report)
    assert report.read_text().count("**Yesterday:**") == 1
    assert "new printout" not in report.read_text()
