"""A worker killed mid-phase is recovered from as soon as its heartbeat is missed, not
once its lease runs out (DESIGN §7: the sweep treats a worker whose heartbeat stopped as
dead).

Leases here last a minute and a worker is dead after 3 s without a heartbeat. The
worker that holds email 4's notice is SIGKILLed while the provider holds its send
(``stall``, ``before_store``: nothing stored). Beat's sweep, run by the other worker,
finds the killed worker's registry row silent, ends its lease and sends the notice to
the recovery queue; the other worker re-enters ``confirm``, finds nothing stored under
the operation id and sends once with it. The killed worker's held request, landing at
last, is a duplicate of that message: one email per recipient. The surviving worker,
itself blocked in sends the provider answers slowly, beats meanwhile and keeps its
leases.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernel import Status

from .harness import RECIPIENTS, Stack, assert_sent_once_each, chaos_stack, wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.slow]
STALLED = RECIPIENTS[3]
LEASE_SECONDS = 60
BOUND = 30  # far from the lease: only the missed heartbeat can recover within it
DEAD = "is dead; its 1 lease(s) end now"


@pytest.fixture
def stack(tmp_path: Path, transactional_db: None) -> Iterator[Stack]:
    env = {"WORKER_DEAD_SECONDS": "3", "WORKER_HEARTBEAT_SECONDS": "0.5"}
    with chaos_stack(tmp_path, env=env) as running:
        yield running


def test_a_killed_workers_task_runs_again_long_before_its_lease_would_end(
    stack: Stack,
) -> None:
    stack.admin.set_faults(stall={"to": STALLED, "ms": LEASE_SECONDS * 1000,
                                  "when": "before_store"})
    lease = {"KERNEL_LEASE_SECONDS": str(LEASE_SECONDS)}
    workers = [stack.worker("w1", wait=False, **lease), stack.worker("w2", wait=False, **lease)]
    stack.wait_ready(*workers)
    stack.beat()
    session_id, batch_id = stack.send_batch(RECIPIENTS)

    wait_for(lambda: stack.admin.faults()["fired"]["stall"] == 1,
             "the provider to hold the send of email 4")
    notice = stack.notices(session_id)[STALLED]
    assert (notice.status, notice.phase) == (Status.RUNNING, "confirm")
    killed = stack.holder(notice)
    [survivor] = [w for w in workers if w is not killed]
    killed.kill()
    killed_at = time.monotonic()
    key = notice.input["operation_id"]
    stack.admin.set_faults()  # the held request keeps its stall; new ones are not held

    recovered = stack.wait_terminal(notice.id, timeout=BOUND)
    assert time.monotonic() - killed_at < BOUND
    # one epoch for the ended lease (the fence), one for the new claim
    assert (recovered.epoch, recovered.restarts) == (notice.epoch + 2, 1)
    assert recovered.outcome is not None and recovered.outcome["kind"] == "succeeded"
    assert recovered.outcome["result"]["idempotency_key"] == key
    dead_lines = [line for line in survivor.output().splitlines() if "is dead;" in line]
    assert len(dead_lines) == 1 and f":{killed.pid} {DEAD}" in dead_lines[0], dead_lines

    batch = stack.wait_terminal(batch_id)
    assert_sent_once_each(stack, batch, RECIPIENTS)
    # The killed worker's request, released at last, is absorbed by its key.
    stack.admin.end_stalls()
    late = wait_for(lambda: [r for r in stack.admin.requests()
                             if r["idempotency_key"] == key and r["faults"] == ["stall"]],
                    "the stalled request to reach the store", timeout=30)
    assert [(r["outcome"], r["created"]) for r in late] == [("duplicate", False)]
    assert len(stack.admin.messages()) == len(RECIPIENTS)
    # Nobody else was taken for dead: the survivor beat while its phases ran.
    assert f":{survivor.pid} is dead" not in survivor.output()
