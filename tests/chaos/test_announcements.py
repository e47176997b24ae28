"""Workers' announcement readers, with real processes (controlplane.worker.announcements).

``hands`` has one worker, w1, and it consumes from a Redis db that nothing else sends
to: the messages for the notices it runs go to the stack's db, where nobody consumes
``hands``. w0 consumes ``default`` from the stack's db, so w1's messages for the batch
reach nobody either, and there is no beat to sweep. Every step after the plan therefore
starts from an announcement, in a worker that is idle when the commit lands.

- ``test_announcements_alone_carry_a_batch_through``: the batch ends with one message per
  recipient.
- ``test_a_draining_worker_finishes_the_phase_its_reader_runs``: SIGTERM while w1's
  reader runs ben's stalled send: w1 commits the receipt itself, starts nothing more,
  and exits 0 (Celery's warm shutdown waits for its own message only, and the reader
  is waited for after it).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.conf import settings

from controlplane.dev.ports import reserved_redis_url

from .harness import RECIPIENTS, Stack, assert_sent_once_each
from .private_services import point_celery_at

BEN = RECIPIENTS[1]
pytestmark = [pytest.mark.chaos, pytest.mark.slow]


@pytest.fixture
def elsewhere() -> Iterator[str]:
    """A Redis db of its own: the broker of w1 alone."""
    with reserved_redis_url(settings.REDIS_URL) as url:
        yield url


def test_announcements_alone_carry_a_batch_through(stack: Stack, elsewhere: str) -> None:
    point_celery_at(stack.redis_url)
    stack.wait_ready(stack.worker("w0", queues="default", wait=False),
                     stack.worker("w1", queues="hands", wait=False, REDIS_URL=elsewhere))
    _, batch_id = stack.send_batch(RECIPIENTS)
    batch = stack.wait_terminal(batch_id, timeout=60)
    assert_sent_once_each(stack, batch, RECIPIENTS)


def test_a_draining_worker_finishes_the_phase_its_reader_runs(
    stack: Stack, elsewhere: str
) -> None:
    point_celery_at(stack.redis_url)
    stack.admin.set_faults(stall={"to": BEN, "ms": 2_000, "times": 1, "when": "after_store"})
    planner = stack.worker("w0", queues="default", wait=False)
    hands = stack.worker("w1", queues="hands", wait=False, REDIS_URL=elsewhere,
                         KERNEL_DRAIN_SECONDS="20", KERNEL_LEASE_SECONDS="30")
    stack.wait_ready(planner, hands)
    session_id, batch_id = stack.send_batch([BEN])

    notice = stack.wait_inside_send(session_id, BEN, "w1's announcement reader")
    assert stack.holder(notice) is hands
    hands.terminate()  # SIGTERM
    assert hands.popen.wait(timeout=30) == 0, hands.output()
    ben = stack.task(notice.id)
    assert ben.outcome is not None and ben.outcome["kind"] == "succeeded", ben
    assert ben.epoch == notice.epoch  # committed by w1 itself, not taken over
    log = hands.output()
    assert "draining: no new claims" in log and "released" not in log
    batch = stack.wait_terminal(batch_id, timeout=60)  # w0, from w1's announcement
    assert_sent_once_each(stack, batch, [BEN])
