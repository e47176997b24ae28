"""The kill-during-send scenario again, with every dispatch delivered by queue messages.

A burst bigger than ``KERNEL_DISPATCH_MESSAGES`` is not sent as a message per task: its
dispatch rows are marked woken and a worker claims them from Postgres one after another
(``Worker.advance_queue``), committing quick tasks' endings together. The other chaos
tests start batches smaller than the threshold, so they run the per-task path; here the
workers' threshold is 0, so the batch's notices, the kill, the takeover and the stalled
send's late arrival all go through the burst path, with the same assertions.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .harness import Stack, chaos_stack
from .test_kill_during_send import (
    test_worker_killed_while_the_provider_holds_the_send as test_killed_on_the_burst_path,
)

__all__ = ["test_killed_on_the_burst_path"]


@pytest.fixture
def stack(tmp_path: Path, transactional_db: None) -> Iterator[Stack]:
    with chaos_stack(tmp_path, env={"KERNEL_DISPATCH_MESSAGES": "0"}) as running:
        yield running
