"""The fan-out benchmark in small: every shape of ours on real workers (seconds).

``make bench BENCH_ARGS=fanout`` runs 5,000-task bursts beside the peers (minutes); here
one worker, a redis-server of the test's own and a handful of tasks per shape check that
each shape runs to the end, that client threads submitting side by side lose no delivery,
and that the report names the shape of every row.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

import pytest

from benchmarks import fanout
from tests.databases import url_of_test_database

FACTS = {"revision": "`abc1234`", "machine": "2 CPUs", "load_before": "1.00",
         "load_after": "2.00", "workers": "1"}


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.django_db(transaction=True)
def test_every_shape_runs_and_client_threads_deliver_without_error(
    private_redis_url: tuple[str, int],  # noqa: F811
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url, _ = private_redis_url
    settings.KERNEL_TASK_MODULES = [fanout.TASK_MODULE]  # this process's registry
    monkeypatch.setenv("KERNEL_TASK_MODULES", fanout.TASK_MODULE)  # the workers'
    args = argparse.Namespace(tasks=24, two_phase=8, sequential=5, latency=4, workers=1,
                              timeout=90.0, logs=None)
    ours = fanout.measure_ours(url_of_test_database(), url, args)
    assert set(ours.per_item) == set(ours.two_per_item) == {1, 4}
    for shown in [*ours.per_item.values(), *ours.two_per_item.values()]:
        assert shown.per_s > 0 and shown.submit_per_s >= shown.per_s
        assert shown.delivery_errors == 0, shown
        assert shown.waits, "the sampler saw the database's backends meanwhile"
    assert ours.fanout > 0 and ours.two > 0 and ours.sequential > 0

    text = fanout.render(datetime(2026, 12, 3, tzinfo=UTC), FACTS, ours, None, "make bench")
    table = text.split("| workload | shape |", 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    shapes = [row.split(" | ")[1] for row in table]
    assert shapes[:3] == ["per item, 1 client thread", "per item, 4 client threads",
                          "batch: one call"], shapes
    assert all(shapes), table
    assert "| state, wait event | per item, 1 thread(s) | per item, 4 thread(s) |" in text
