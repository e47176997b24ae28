"""The dispatch outbox: delivered after commit, re-delivered by the sweep, gone once claimed."""

from __future__ import annotations

import threading
from datetime import timedelta

from kernel import Draft, Worker
from kernel.dispatch import Dispatcher

from .definitions import Effects, make_registry
from .world import World


class Broker:
    def __init__(self) -> None:
        self.sent: list[str] = []
        self.down = False

    def deliver(self, task_id: str, queue: str) -> None:
        if self.down:
            raise ConnectionError("broker unreachable")
        self.sent.append(task_id)


def setup(world: World):
    kernel = world.kernel(make_registry(Effects()))
    broker = Broker()
    dispatcher = Dispatcher(kernel, broker.deliver, redeliver_after=timedelta(seconds=30))
    kernel.after_commit(dispatcher.after_commit)
    return kernel, broker, dispatcher, kernel.create_session()


def create(handle, kind: str, input: dict) -> str:
    draft = Draft()
    task_id = draft.create_task(kind, input)
    handle.commit(draft)
    return task_id


def test_runnable_tasks_are_delivered_after_their_commit_and_forgotten_once_claimed(
    world: World,
) -> None:
    kernel, broker, dispatcher, handle = setup(world)
    task_id = create(handle, "step", {"name": "s"})
    assert broker.sent == [task_id]
    assert dispatcher.sweep().delivered == 0  # delivered and not yet overdue
    world.clock.advance(31)
    assert dispatcher.sweep().delivered == 1  # not claimed in time: maybe lost, send again
    assert broker.sent == [task_id, task_id]
    Worker(kernel, "w").advance(task_id)
    world.clock.advance(60)
    assert dispatcher.sweep().delivered == 0
    assert world.storage.take_due_dispatches(world.clock.now(), timedelta(0), 10) == []


def test_a_broker_outage_loses_nothing(world: World) -> None:
    kernel, broker, dispatcher, handle = setup(world)
    broker.down = True
    first = create(handle, "step", {"name": "a"})
    second = create(handle, "step", {"name": "b"})
    assert broker.sent == []
    assert dispatcher.sweep().failed == 2
    broker.down = False
    report = dispatcher.sweep()
    assert (report.delivered, report.failed) == (2, 0)
    assert sorted(broker.sent) == sorted([first, second])


def test_redelivery_backs_off_while_a_message_waits_unclaimed(world: World) -> None:
    """A long healthy queue must not be flooded with copies: each redelivery waits as
    long as the row had waited before it."""
    kernel, broker, dispatcher, handle = setup(world)
    task_id = create(handle, "step", {"name": "s"})
    sends = []
    for _ in range(8):
        world.clock.advance(15)
        sends.append(dispatcher.sweep().delivered)
    # delivered at 0; re-sent once it waited more than 30 s (at 45), then once it
    # waited longer than the 45 s it had waited before (at 105)
    assert sends == [0, 0, 1, 0, 0, 0, 1, 0]
    world.clock.advance(120)
    assert dispatcher.sweep().delivered == 1
    assert broker.sent == [task_id] * 4


def test_two_sweeps_at_once_send_each_row_once(world: World) -> None:
    kernel, broker, dispatcher, handle = setup(world)
    broker.down = True
    created = [create(handle, "step", {"name": f"t{i}"}) for i in range(3)]
    broker.down = False
    entered, release = threading.Event(), threading.Event()
    deliver = broker.deliver

    def slow_deliver(task_id: str, queue: str) -> None:
        entered.set()
        release.wait(10)
        deliver(task_id, queue)

    slow = Dispatcher(kernel, slow_deliver, redeliver_after=timedelta(seconds=30))
    first = threading.Thread(target=slow.sweep)
    first.start()
    assert entered.wait(10)
    try:
        assert dispatcher.sweep().delivered == 0  # the first sweep has taken every row
    finally:
        release.set()
        first.join(10)
    assert sorted(broker.sent) == sorted(created)


def test_a_sweep_while_the_committer_delivers_does_not_send_its_rows(world: World) -> None:
    kernel = world.kernel(make_registry(Effects()))
    sent: list[str] = []
    swept: list[int] = []

    def deliver(task_id: str, queue: str) -> None:
        if not swept:  # a beat's sweep lands between the commit and its delivery
            swept.append(sweeper.sweep().delivered)
        sent.append(task_id)

    committer = Dispatcher(kernel, deliver, redeliver_after=timedelta(seconds=30))
    sweeper = Dispatcher(kernel, deliver, redeliver_after=timedelta(seconds=30))
    kernel.after_commit(committer.after_commit)
    handle = kernel.create_session()
    draft = Draft()
    created = [draft.create_task("step", {"name": f"t{i}"}) for i in range(3)]
    handle.commit(draft)
    assert swept == [0] and sorted(sent) == sorted(created)


def test_sleepers_are_delivered_when_due(world: World) -> None:
    kernel, broker, dispatcher, handle = setup(world)
    task_id = create(handle, "napper", {"name": "n", "seconds": 60})
    Worker(kernel, "w").advance(task_id)
    broker.sent.clear()
    world.clock.advance(59)
    assert dispatcher.sweep().delivered == 0
    world.clock.advance(2)
    assert dispatcher.sweep().delivered == 1
    assert broker.sent == [task_id]


def test_an_expired_lease_is_dispatched_once_per_redelivery_window(world: World) -> None:
    kernel, broker, dispatcher, handle = setup(world)
    task_id = create(handle, "step", {"name": "s"})
    now = world.clock.now()
    world.storage.claim(task_id, "dead-worker", now, now + timedelta(seconds=10))
    broker.sent.clear()
    assert dispatcher.sweep().delivered == 0
    world.clock.advance(11)
    assert dispatcher.sweep().delivered == 1
    assert dispatcher.sweep().delivered == 0  # a second beat in the same second: no-op
    assert broker.sent == [task_id]
    Worker(kernel, "w2").advance(task_id)
    assert world.storage.task(task_id).outcome["kind"] == "succeeded"


def test_an_expired_lease_is_found_behind_a_backlog_of_pending_tasks(world: World) -> None:
    kernel, broker, dispatcher, handle = setup(world)
    dispatcher.batch = 2
    backlog = [create(handle, "step", {"name": f"b{i}"}) for i in range(3)]
    stuck = create(handle, "step", {"name": "stuck"})
    now = world.clock.now()
    world.storage.claim(stuck, "dead-worker", now, now + timedelta(seconds=10))
    world.clock.advance(11)
    broker.sent.clear()
    dispatcher.sweep()
    assert stuck in broker.sent
    assert set(broker.sent) <= {stuck, *backlog}
