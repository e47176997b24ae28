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
