"""The kill-during-send scenario again, with every dispatch delivered by queue messages.

A burst bigger than ``KERNEL_DISPATCH_MESSAGES`` is not sent as a message per task: its
dispatch rows are marked as burst rows and a worker claims them from Postgres one after another
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
from .held_send import kill_while_the_provider_holds_the_send


@pytest.fixture
def stack(tmp_path: Path, transactional_db: None) -> Iterator[Stack]:
    with chaos_stack(tmp_path, env={"KERNEL_DISPATCH_MESSAGES": "0"}) as running:
        yield running


def test_killed_on_the_burst_path(stack: Stack) -> None:
    kill_while_the_provider_holds_the_send(stack)
