"""The broker and the database restarted in the middle of a batch (DESIGN §5.6, §7).

Each test runs on a private Postgres and a private Redis (temporary folders, own
ports; see ``private_services``), never on the shared servers, so that it can stop
and start them. The provider answers every request after a delay, so that the
five sends take a few seconds and the restart lands while some are still to come.

- Redis restarted (without persistence): the queued "advance" messages are gone.
  Their dispatch rows stay until a claim deletes them, so the sweep delivers them
  again after ``KERNEL_REDELIVER_SECONDS``; workers and beat reconnect to the broker.
- Postgres restarted: every connection dies, including the one a worker holds in
  the middle of a phase. Workers reconnect; a phase whose commit failed is
  recovered through its expired lease (``confirm`` asks the provider first).

Either way: exactly five messages, one per recipient, and a batch that succeeded
with ``sent == 5``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .harness import wait_for
from .private_services import PrivatePostgres, PrivateStack, private_stack

RECIPIENTS = [f"{name}@example.com" for name in ("ana", "ben", "cai", "dee", "eve")]
LATENCY_MS = 1000  # per provider request: five sends take five seconds and more
pytestmark = [pytest.mark.chaos, pytest.mark.slow]


@pytest.fixture
def private(tmp_path: Path, postgres_cluster_template: PrivatePostgres
            ) -> Iterator[PrivateStack]:
    with private_stack(tmp_path, postgres_cluster_template, latency_ms=LATENCY_MS) as running:
        yield running


def start_batch_and_wait_for_one_notice(stack: PrivateStack) -> tuple[str, str]:
    """Start the batch; return once its first notice committed its receipt."""
    stack.beat()
    stack.worker("w1")
    session_id, batch_id = stack.send_batch(RECIPIENTS)
    wait_for(lambda: any(row["status"] == "terminal"
                         for row in stack.notice_rows(session_id).values()),
             "the first notice to finish", timeout=40, every=0.1)
    return session_id, batch_id


def assert_five_sent_once(stack: PrivateStack, batch: dict[str, Any]) -> None:
    """One message per recipient, each notice settled by exactly one terminal commit,
    and a batch that succeeded with the provider's receipts."""
    for to, notice in stack.notice_rows(batch["session_id"]).items():
        assert notice["outcome"]["kind"] == "succeeded", (to, notice["outcome"])
        ends = [i for i in stack.history(batch["session_id"], notice["id"])
                if i["status"] == "terminal"]
        assert len(ends) == 1, (to, ends)
    messages = stack.admin.messages()
    assert Counter(m["to"] for m in messages) == Counter(RECIPIENTS), messages
    assert len({m["idempotency_key"] for m in messages}) == len(RECIPIENTS)
    assert batch["outcome"]["kind"] == "succeeded", batch["outcome"]
    assert batch["outcome"]["result"]["sent"] == 5
    receipts = batch["outcome"]["result"]["receipts"]
    assert {to: receipts[to]["id"] for to in RECIPIENTS} == {m["to"]: m["id"] for m in messages}


def unfinished(stack: PrivateStack, session_id: str) -> list[str]:
    notices = stack.notice_rows(session_id)
    assert sorted(notices) == sorted(RECIPIENTS)
    return sorted(to for to, row in notices.items() if row["status"] != "terminal")


def test_redis_restarted_mid_batch(private: PrivateStack) -> None:
    session_id, batch_id = start_batch_and_wait_for_one_notice(private)
    queued = private.broker.queued()

    private.broker.restart()  # no persistence: every queued message is lost

    assert queued, "some notices should still have been waiting in the broker"
    # The sweep may already have sent some of them again (new messages, new ids).
    assert not queued & private.broker.queued(), "the restart should lose what was queued"
    assert len(unfinished(private, session_id)) >= 2, "the restart should land mid-batch"
    batch = private.wait_done(batch_id, timeout=60)

    assert_five_sent_once(private, batch)


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_postgres_restarted_mid_batch(private: PrivateStack, mode: str) -> None:
    """``fast``: sessions are terminated, then a clean shutdown; ``immediate``: a crash
    (no shutdown checkpoint; the restart runs crash recovery)."""
    session_id, batch_id = start_batch_and_wait_for_one_notice(private)

    private.postgres.restart(mode)  # every connection dies

    assert len(unfinished(private, session_id)) >= 2, "the restart should land mid-batch"
    batch = private.wait_done(batch_id, timeout=60)

    assert_five_sent_once(private, batch)
