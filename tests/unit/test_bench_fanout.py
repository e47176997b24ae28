"""benchmarks.fanout's pieces that need no servers: the no-op kind and the report."""

from __future__ import annotations

from datetime import UTC, datetime

from benchmarks._support import Stats
from benchmarks.fanout import KIND, Ours, register, render
from kernel import Draft, InMemoryStorage, Kernel, ManualClock, Registry, Scheduler


def test_the_no_op_kind_commits_each_phase_and_times_itself() -> None:
    registry = Registry()
    register(registry)
    kernel = Kernel(InMemoryStorage(), registry, ManualClock())
    handle = kernel.create_session()
    draft = Draft()
    task_id = draft.create_task(KIND, {"phases": 3})
    handle.commit(draft)
    Scheduler(kernel).run_until_idle()
    task = kernel.storage.task(task_id)
    assert task.outcome["kind"] == "succeeded"
    assert task.outcome["result"]["t1"] >= task.outcome["result"]["t0"]
    assert len(kernel.storage.commits_after(handle.id, 0, 100)) == 4  # created + 3 phases


def test_the_report_gives_same_run_ratios_and_says_which_peer_did_not_run() -> None:
    ours = Ours(100.0, 5000, 90.0, 1000, 900.0, 2000, {"200 @ 5 ms": Stats.of([0.01, 0.02])},
                {"200 @ 5 ms": Stats.of([0.004, 0.005])})
    peers = {
        "celery": {"per_s": 200.0, "lat_p50_ms": 5.0, "lat_p99_ms": 10.0},
        "procrastinate": {"per_s": 50.0},
        "dbos_fanout": {"error": "exit 1: no dbos"},
        "dbos_seq": {"steps_per_s": 300.0},
    }
    facts = {
        "revision": "`abc`",
        "machine": "2 CPUs",
        "load_before": "1",
        "load_after": "2",
        "workers": "2",
    }
    text = render(datetime(2026, 12, 1, tzinfo=UTC), facts, ours, peers, "make bench")
    assert "on revision `abc`." in text  # the label comes quoted (code_revision)
    assert "2.00x of Procrastinate, 0.50x of Celery" in text
    assert "| 3.00x | >= 3x DBOS | met |" in text
    assert "- dbos_fanout: exit 1: no dbos" in text
    # Idle dispatch, both readings: from before the commit, and from its durable point.
    assert "| 200 @ 5 ms | before the commit | 2 | 10.00 |" in text
    assert "| 200 @ 5 ms | the durable commit | 2 | 4.00 |" in text
