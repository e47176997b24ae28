"""Graceful drain: SIGTERM to a worker in the middle of a batch (issue 14, point 2).

The worker stops claiming, lets the phase it runs finish within its grace period
(``KERNEL_DRAIN_SECONDS``), gives back the lease it still holds so that another worker
takes the task over at once (not after the 30-second lease runs out), and exits 0.
The batch ends with exactly one message per recipient at the provider.

- ``within_grace``: ben's send stalls 2 s, the grace is 20 s: the send returns, its
  receipt is committed by the draining worker, which then exits 0 holding nothing.
- ``grace_runs_out``: ben's send stalls 20 s (the provider stored it at once), the grace
  is 0.5 s: the draining worker gives ben's lease back mid-phase and exits 0; the other
  worker claims ben's notice within a second, finds the stored email by its operation
  id and commits the receipt; nothing is sent twice.
"""

from __future__ import annotations

import time

import pytest

from kernel import Status

from .harness import RECIPIENTS, Stack, assert_sent_once_each, wait_for
from .private_services import point_celery_at

BEN = RECIPIENTS[1]
LEASE_SECONDS = "30"
pytestmark = [pytest.mark.chaos, pytest.mark.slow]


@pytest.mark.parametrize(
    ("case", "stall_ms", "grace"), [("within_grace", 2_000, 20.0), ("grace_runs_out", 20_000, 0.5)]
)
def test_sigterm_mid_batch_hands_the_leases_over_and_exits_0(
    stack: Stack, case: str, stall_ms: int, grace: float
) -> None:
    point_celery_at(stack.redis_url)
    stack.admin.set_faults(stall={"to": BEN, "ms": stall_ms, "times": 1, "when": "after_store"})
    draining = stack.worker("w1", KERNEL_LEASE_SECONDS=LEASE_SECONDS,
                            KERNEL_DRAIN_SECONDS=str(grace))
    session_id, batch_id = stack.send_batch(RECIPIENTS)

    notice = stack.wait_inside_send(session_id, BEN, "the first worker")
    assert stack.holder(notice) is draining
    other = stack.worker("w2", KERNEL_LEASE_SECONDS=LEASE_SECONDS)

    terminated = time.monotonic()
    draining.terminate()  # SIGTERM
    if case == "grace_runs_out":
        taken = wait_for(
            lambda: (t := stack.task(notice.id)).lease_owner == other.lease_owner
            or t.status is Status.TERMINAL, "the other worker to take ben's notice over",
            timeout=float(LEASE_SECONDS), every=0.02)
        handed_over_in = time.monotonic() - terminated - grace
        assert taken and handed_over_in < 1.0, f"taken over {handed_over_in:.2f}s after release"
    assert draining.popen.wait(timeout=30) == 0, draining.output()
    batch = stack.wait_terminal(batch_id, timeout=60)
    assert_sent_once_each(stack, batch, RECIPIENTS)
    ben = stack.task(notice.id)
    assert ben.outcome is not None and ben.outcome["kind"] == "succeeded"
    log = draining.output()
    assert "draining: no new claims" in log
    if case == "within_grace":
        assert ben.epoch == notice.epoch  # the draining worker committed the receipt itself
        assert "released" not in log
    else:
        # released (epoch + 1), then claimed by the other worker: an interrupted phase
        assert ben.epoch == notice.epoch + 2 and ben.restarts == 1
        assert "released 1 lease(s) mid-phase" in log
        assert [r["outcome"] for r in stack.lookups(notice.input["operation_id"])] == ["found"]
    assert time.monotonic() - terminated < float(LEASE_SECONDS), "waited for lease expiry"
