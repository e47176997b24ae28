"""Retention with real processes: ``manage.py prune`` runs while a batch waits on its
notices, and every live task still runs to its end (issue 14.5).

A real Celery worker consumes ``default`` only: the batch plans its five notices and
waits on them; the notices stay pending on ``hands``, which nobody consumes yet. Beside
it, a finished session. ``manage.py prune`` (a process of its own, every finished
session due at once) removes the finished session's history and nothing of the batch's.
Then the worker is told to consume ``hands``: the batch completes with exactly one
message per recipient, and its session's log is whole.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kernel import Draft, Status

from .harness import RECIPIENTS, Stack, assert_sent_once_each, consume, wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


def test_pruning_leaves_a_waiting_batch_runnable(stack: Stack) -> None:
    finished = stack.kernel.create_session()
    for i in range(3):
        draft = Draft(actor="user:chaos")
        draft.set("email-plan", "old", ["n"], i)
        finished.commit(draft)
    worker = stack.worker("w1", queues="default")
    session_id, batch_id = stack.send_batch(RECIPIENTS)
    wait_for(lambda: stack.task(batch_id).status is Status.WAITING, "the batch waits", 60)
    notices = stack.notices(session_id)
    assert sorted(notices) == sorted(RECIPIENTS)
    assert all(n.status is Status.PENDING for n in notices.values())
    head = stack.head_seq(session_id)

    pruned = subprocess.run(
        [sys.executable, "manage.py", "prune"], cwd=ROOT, capture_output=True, text=True,
        env={**stack.env, "KERNEL_RETENTION_DAYS": "0"}, timeout=120,
    )
    assert pruned.returncode == 0, pruned.stderr[-2000:]
    assert "removed the history of 1 finished session(s): 3 commit(s)" in pruned.stdout
    storage = stack.kernel.storage
    assert storage.session(finished.id).pruned_seq == 3
    assert storage.session(session_id).pruned_seq == 0
    assert [c.seq for c in storage.commits_after(session_id, 0, 1000)] == list(
        range(1, head + 1))

    consume(stack, worker, "hands")
    batch = stack.wait_terminal(batch_id, timeout=90)
    assert_sent_once_each(stack, batch, RECIPIENTS)
    log = storage.commits_after(session_id, 0, 1000)
    assert [c.seq for c in log] == list(range(1, stack.head_seq(session_id) + 1))
