"""A committer's messages held for the announcement's grace (kernel.dispatch.HeldMessages):
sent after it, the rows of several commits together."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

from kernel.dispatch import TOGETHER, HeldMessages
from kernel.records import Dispatch


def row(n: int) -> Dispatch:
    return Dispatch(id=n, task_id=f"t{n}", session_id="s", not_before=datetime.now(UTC),
                    queue="q", seq=1)


def test_rows_due_soon_go_with_those_due_now_in_one_send() -> None:
    sends: list[list[int]] = []
    sent = threading.Event()

    def send(rows: list[Dispatch]) -> None:
        sends.append([r.id for r in rows])
        sent.set()

    grace = 1.0
    held = HeldMessages(grace, send)
    started = time.monotonic()
    held.add([row(1)])
    time.sleep(grace * TOGETHER / 4)
    held.add([row(2)])
    try:
        assert sent.wait(10)
        assert time.monotonic() - started >= grace * (1 - TOGETHER)  # not before its share
        assert sends == [[1, 2]]  # one look-up and one send for both commits' rows
    finally:
        held.close()
    assert sends == [[1, 2]]


def test_a_burst_of_commits_wakes_the_sending_thread_once_not_per_commit() -> None:
    """Rows added behind others are due after them (one grace for all): the thread,
    already waiting for the oldest, is not woken for each, which would take the
    interpreter from the committing thread at every commit. Every row is still sent."""
    sends: list[int] = []
    sent = threading.Event()

    def send(rows: list[Dispatch]) -> None:
        sends.extend(r.id for r in rows)
        if len(sends) == 100:
            sent.set()

    held = HeldMessages(0.2, send)
    wakes = [0]
    notify = held._ready.notify

    def counted(n: int = 1) -> None:
        wakes[0] += 1
        notify(n)

    held._ready.notify = counted  # type: ignore[method-assign]
    try:
        for n in range(100):
            held.add([row(n)])
        assert wakes[0] == 1
        assert sent.wait(10)
        assert sorted(sends) == list(range(100))
        held.add([row(100)])  # the queue is empty again: the waiting thread is woken
        assert wakes[0] == 2
    finally:
        held.close()
    assert sorted(sends) == list(range(101))
