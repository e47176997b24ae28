"""The email batch benchmark, run end to end with tiny numbers against the test database.

``make bench`` is not part of ``make test``, and the batch benchmark drives real
processes (workers, beat, the provider) through a kill and a restart: without this
test its code could rot unnoticed until someone needs the figures. Twelve emails on
one worker, a kill after six, a two-second lease: the same code path as the real
run, in about twenty seconds.
"""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks._batch_system import (
    CommitRow,
    mean_notice_phase,
    queued_tasks,
    scheduling_samples,
)
from benchmarks._support import database_url
from benchmarks.batch import HEADING, Config, render, run
from controlplane.dev.ports import reserved_redis_url

EMAILS = 12
KILL_AFTER = 6
HOPS = {("send-batch", "plan"), ("send-notice", "send"), ("send-batch", "summarize")}


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.django_db(transaction=True)
def test_batch_benchmark_end_to_end() -> None:
    from django.db import connection

    url = database_url(connection.settings_dict["NAME"])
    config = Config(
        emails=EMAILS,
        workers=1,
        probes=3,
        probe_warmup=1,
        kill_after=KILL_AFTER,
        recovery_latency_ms=100,  # ~1 s for the batch: the kill lands in the middle
        lease_seconds=2.0,
        redeliver_seconds=3.0,  # a message lost with the worker comes back fast
        batch_timeout=30.0,
    )
    with reserved_redis_url() as redis_url:  # a Redis db no other run uses meanwhile
        result = run(url, redis_url, config)

    assert len(result.probe) == 3 * 3
    assert {(s.kind, s.phase) for s in result.probe} == HOPS
    assert all(s.seconds > 0 for s in result.probe)

    batch = result.batch
    assert batch.delivery.ok and batch.delivery.messages == EMAILS
    assert batch.delivery.duplicate_posts == 0
    assert batch.phase_commits >= 2 * EMAILS + 2  # intent + receipt per email, plan + summary
    assert batch.latency.count == EMAILS + 2 and batch.notice_latency.count == EMAILS
    assert batch.seconds > 0 and batch.emails_per_second > 0 and batch.phases_per_second > 0

    rec = result.recovery
    assert rec is not None
    assert rec.delivery.ok and rec.delivery.messages == EMAILS
    assert KILL_AFTER <= rec.killed_after < EMAILS
    assert rec.orphans + rec.pending_at_kill == EMAILS - rec.killed_after
    assert 0 < rec.workers_ready <= rec.all_claimed
    if rec.stranded:
        assert rec.redispatched is not None and rec.reclaimed is not None
        assert rec.redispatched <= rec.reclaimed <= rec.all_claimed
    if rec.orphans:
        assert rec.lease_expiry is not None
    assert rec.delivery.duplicate_posts == 0  # an interrupted send is confirmed, not resent

    stages = dict(result.activity)
    assert list(stages) == ["probes and clean batch", "recovery batch"]
    for name, act in stages.items():
        # The counts come from log lines, read once the workers stopped. Clean: plan,
        # summary and every email, at least once. Recovery: at least what the new workers
        # ran (the emails not done at the kill, and the summary); the killed worker's
        # runs may be unlogged (a queue message logs its runs when it ends).
        floor = EMAILS + 2 if name != "recovery batch" else EMAILS - rec.killed_after + 1
        assert act.phases >= floor, (name, act, rec)
        # The emails the dead held are dispatched again by a sweep, after their leases,
        # unless a message for them was still queued (a live worker's claim takes them).
        swept = rec.orphans - rec.orphans_queued if name == "recovery batch" else 0
        assert act.redelivered >= swept, (act, rec)

    section = render(result)
    assert section.startswith(HEADING + "\n")
    assert "revision `" in section
    assert f"| ok | clean | {EMAILS} |" in section
    assert f"| ok | recovery | {EMAILS} |" in section
    assert f"`{connection.settings_dict['NAME']}`" in section


def _commit(seq: int, at: float, actor: str, *items: dict[str, Any]) -> CommitRow:
    return CommitRow(seq, at, actor, list(items))


def _task(
    task_id: str, status: str, kind: str = "send-notice", phase: str = "send"
) -> dict[str, Any]:
    return {"type": "task", "id": task_id, "kind": kind, "phase": phase, "status": status}


def test_scheduling_samples_pair_runnable_with_the_next_own_commit() -> None:
    commits = [
        _commit(1, 10.0, "user:x", _task("b", "pending", "send-batch", "plan")),
        _commit(
            2,
            10.5,
            "task:b",
            {"type": "document"},
            _task("n1", "pending"),
            _task("n2", "pending"),
            _task("b", "waiting", "send-batch", "plan"),
        ),
        _commit(3, 10.75, "task:n1", _task("n1", "running", phase="confirm")),
        _commit(4, 11.0, "task:n1", _task("n1", "terminal", phase="confirm")),
        _commit(
            5,
            12.0,
            "task:n2",
            _task("n2", "terminal", phase="confirm"),
            _task("b", "pending", "send-batch", "summarize"),
        ),
        _commit(6, 12.25, "task:b", _task("b", "terminal", "send-batch", "summarize")),
    ]
    samples = {(s.task, s.phase): s.seconds for s in scheduling_samples(commits)}
    assert samples == {
        ("b", "plan"): 0.5,
        ("n1", "send"): 0.25,  # the later commit of n1 is not a second sample
        ("n2", "send"): 1.5,
        ("b", "summarize"): 0.25,
    }


def test_a_notice_whose_receipt_rides_with_the_next_intent_is_timed_to_that_commit() -> None:
    commits = [
        _commit(1, 10.0, "task:b", _task("n1", "pending"), _task("n2", "pending")),
        _commit(2, 10.5, "task:n1", _task("n1", "running", phase="confirm")),
        # n1's receipt, held back, lands with n2's intent
        _commit(3, 11.0, "task:n2", _task("n1", "terminal", phase="confirm"),
                _task("n2", "running", phase="confirm")),
        _commit(4, 12.0, "task:n2", _task("n2", "terminal", phase="confirm")),
        _commit(5, 12.5, "task:b", _task("b", "terminal", "send-batch", "summarize")),
    ]
    assert mean_notice_phase(commits, "b") == pytest.approx(0.75)  # (0.5 + 1.0) / 2


def test_queued_tasks_reads_ids_from_the_raw_messages() -> None:
    class Broker:
        def lrange(self, key: str, start: int, end: int) -> list[bytes]:
            assert (key, start, end) in {("hands", 0, -1), ("hands.now", 0, -1)}
            if key == "hands.now":  # the sweep's recovery queue
                return [b'{"headers": {"argsrepr": "[\'task_18ecbe5f4c0874d1\']"}}']
            return [b'{"headers": {"argsrepr": "[\'task_18ecbe5f4c0874d0\']"}}', b"{}"]

    assert queued_tasks(Broker(), "hands") == {"task_18ecbe5f4c0874d0", "task_18ecbe5f4c0874d1"}
