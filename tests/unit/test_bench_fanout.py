"""The fan-out benchmark's pieces that need no servers: the no-op kind
(benchmarks._support.noop) and the report."""

from __future__ import annotations

from datetime import UTC, datetime

from benchmarks._support import KIND, Stats, Submitted, register
from benchmarks.fanout import Ours, render
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


def test_the_report_gives_same_run_ratios_by_shape_and_says_which_peer_did_not_run() -> None:
    ours = Ours(400.0, 5000, 90.0, 1000, 900.0, 2000, {"200 @ 5 ms": Stats.of([0.01, 0.02])},
                {"200 @ 5 ms": Stats.of([0.004, 0.005])},
                per_item={1: Submitted(100.0, 120.0), 4: Submitted(90.0, 150.0, 3)},
                two_per_item={1: Submitted(60.0, 70.0), 4: Submitted(80.0, 90.0)})
    peers = {
        "celery": {"per_s": 200.0, "submit_per_s": 800.0, "lat_p50_ms": 5.0, "lat_p99_ms": 10.0},
        "celery_item4": {"per_s": 400.0},
        "celery_group": {"per_s": 800.0},
        "procrastinate": {"per_s": 50.0},
        "procrastinate_item4": {"per_s": 45.0},
        "procrastinate_batch": {"per_s": 100.0},
        "dbos_fanout": {"error": "exit 1: no dbos"},
        "dbos_item4": {"wf_per_s": 20.0},
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
    # Per item from one client thread: our per-item figure against the peers' per-call ones.
    assert ("| per item, 1 client thread | 100 tasks/s (submit 120/s) "
            "| 200 tasks/s (submit 800/s) | 50.0 jobs/s | - "
            "| 2.00x of Procrastinate, 0.50x of Celery |") in text
    # From 4 threads: delivery errors are shown, and fail the target.
    assert "90.0 tasks/s (submit 150/s), **3 delivery errors**" in text
    assert "| 2.00x of Procrastinate, 0.23x of Celery | no delivery error" in text
    assert "| no delivery error, >= ours from 1 thread | **not met** |" in text
    # Batch: our one commit against batch_defer and group.
    assert "| batch: one call | 400 tasks/s (one commit) | 800 tasks/s (`group`) " in text
    assert "| 4.00x of Procrastinate, 0.50x of Celery | >= 2x Procrastinate | met |" in text
    assert "| per item, 4 client threads | 80.0 tasks/s (submit 90.0/s) | - | - " in text
    assert "| 4.00x | - | - |" in text
    assert "| 3.00x | >= 3x DBOS | met |" in text  # sequential phases
    assert "- dbos_fanout: exit 1: no dbos" in text
    # Idle dispatch, both readings: from before the commit, and from its durable point.
    assert "| 200 @ 5 ms | before the commit | 2 | 10.00 |" in text
    assert "| 200 @ 5 ms | the durable commit | 2 | 4.00 |" in text
