"""Stand-in brokers the dispatch tests deliver to (they list the tasks sent and the queues
woken, and can be taken down), and how each test wires its dispatcher: ``WIRING`` is set
by the ``wiring`` fixture of conftest.py."""

from __future__ import annotations


class Broker:
    def __init__(self) -> None:
        self.sent: list[str] = []
        self.down = False

    def deliver(self, task_id: str, queue: str) -> None:
        if self.down:
            raise ConnectionError("broker unreachable")
        self.sent.append(task_id)


class Waker(Broker):
    def __init__(self) -> None:
        super().__init__()
        self.woke: list[str] = []

    def wake(self, queue: str) -> None:
        if self.down:
            raise ConnectionError("broker unreachable")
        self.woke.append(queue)


WIRING = {"attached": False}
