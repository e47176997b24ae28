"""The scaling and broker benchmarks (issue 14), in small: what their reports compute,
and the broker's count of Redis commands per task on real processes.

``make bench`` is not part of ``make test``: the full runs start two Postgres servers,
two Daphnes and up to four workers (minutes). Here the per-task count runs on the test
database and a redis-server of its own with one worker and a handful of tasks (seconds),
and the reports' arithmetic is checked on made-up runs.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

import pytest

from benchmarks import broker, scaling
from benchmarks._support import TASK_MODULE
from tests.databases import url_of_test_database

FACTS = {"revision": "`abc1234`", "machine": "2 CPUs", "load_before": "1.00 1.00 1.00",
         "load_after": "2.00 2.00 2.00", "version": "15", "fsync": "on",
         "synchronous_commit": "on", "shared_buffers": "128MB", "redis": "7.0.15"}
WHEN = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def scaling_args(**overrides: object) -> argparse.Namespace:
    values = dict(tasks=200, sessions=8, phases=40, readers=2, rounds=2)
    return argparse.Namespace(**{**values, **overrides})


def test_scaling_report_averages_the_rounds_of_each_condition() -> None:
    reads = scaling.Reads(seconds=[0.1, 0.2, 0.3, 0.4], errors=1, elapsed=2.0)
    more = scaling.Reads(seconds=[0.5, 0.6], errors=0, elapsed=1.0)
    runs = [
        scaling.Run(1, "none", fanout=10.0, one_session=50.0, commits=100.0),
        scaling.Run(1, "replica", fanout=8.0, one_session=40.0, commits=90.0, pages=reads,
                    replica_rows=500),
        scaling.Run(1, "none", fanout=20.0, one_session=50.0, commits=300.0),
        scaling.Run(1, "replica", fanout=12.0, one_session=60.0, commits=110.0, pages=more,
                    replica_rows=700),
    ]
    text = scaling.render(WHEN, FACTS, runs, scaling_args())
    rows = [line for line in text.splitlines() if line.startswith("| 1 |")]
    assert rows == [
        "| 1 | none | 15.0 (10.0-20.0) | 50.0 (50.0-50.0) | 200 (100-300) | - | - | - | 0 |",
        # 6 pages over 3 s; p50 and p90 of the pooled latencies; errors and rows summed
        "| 1 | on the replica | 10.0 (8.0-12.0) | 50.0 (40.0-60.0) | 100 (90.0-110) | 2.0 "
        "| 300 / 600 | 1 | 1,200 |",
    ]
    assert text.startswith(scaling.HEADING) and "mean of 2 run(s)" in text


def test_broker_report_divides_the_slowest_command_by_the_commands_per_task() -> None:
    calls = {"lpush": 1.0, "zrange": 2.0, "brpop": 1.0}
    text = broker.render(WHEN, FACTS, calls, {"LPUSH": 40_000.0, "ZRANGE": 80_000.0},
                         argparse.Namespace(tasks=500, workers=2))
    assert "**4.0 Redis commands per task**" in text
    assert "about **10,000 tasks/s**" in text
    assert text.index("`zrange` | 2.00") < text.index("`lpush` | 1.00")


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.django_db(transaction=True)
def test_broker_counts_redis_commands_per_task_on_real_workers(
    private_redis_url: tuple[str, int], settings: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    url, port = private_redis_url
    settings.KERNEL_TASK_MODULES = [TASK_MODULE]  # this process's registry (restored after)
    monkeypatch.setenv("KERNEL_TASK_MODULES", TASK_MODULE)  # the workers' registry
    args = argparse.Namespace(tasks=10, workers=1, timeout=60.0)
    calls = broker.per_task(url_of_test_database(), url, args)
    # Each task is one message: pushed by the committer, fetched by the worker (a fetch
    # that began before the count may end inside it); its commits hint the channel
    # layer's groups (channels_redis reads each group's members), at most once per
    # notifier gap (controlplane.sockets.notify.GAP_SECONDS): commits closer than that share a
    # send, so there may be fewer sends than tasks.
    assert calls.get("lpush", 0) >= 1 and calls.get("brpop", 0) > 0.5, calls
    assert calls.get("zrange", 0) > 0, calls
    assert sum(calls.values()) < 100, calls
    rps = broker.capacity(port, 1000)
    if rps:  # redis-benchmark is installed
        assert {"LPUSH", "RPOP", "ZRANGE"} <= set(rps) and min(rps.values()) > 0
