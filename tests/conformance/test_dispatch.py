"""The dispatch outbox: delivered after commit, re-delivered by the sweep, gone once claimed."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

from kernel import Draft, Registry, Worker
from kernel.dispatch import Dispatcher, recovery_queue

from .brokers import WIRING, Broker, Waker
from .definitions import Effects, make_registry
from .world import World

pytestmark = pytest.mark.usefixtures("wiring")  # each test both ways (conftest.py)


def wire(kernel, dispatcher: Dispatcher) -> None:
    if WIRING["attached"]:
        dispatcher.attach()
    else:
        kernel.after_commit(dispatcher.after_commit)


def setup(world: World):
    kernel = world.kernel(make_registry(Effects()))
    broker = Broker()
    dispatcher = Dispatcher(kernel, broker.deliver, redeliver_after=timedelta(seconds=30))
    wire(kernel, dispatcher)
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
    """A long healthy queue must not be flooded with copies: each redelivery waits
    twice as long as the one before (by deliveries, not by the row's age)."""
    kernel, broker, dispatcher, handle = setup(world)
    task_id = create(handle, "step", {"name": "s"})
    sends = []
    for _ in range(8):
        world.clock.advance(15)
        sends.append(dispatcher.sweep().delivered)
    # delivered at 0; re-sent once it waited more than 30 s (at 45), then once it
    # waited more than 60 s after that (at 120)
    assert sends == [0, 0, 1, 0, 0, 0, 0, 1]
    world.clock.advance(121)
    assert dispatcher.sweep().delivered == 1  # waited more than 120 s
    assert broker.sent == [task_id] * 4


def test_a_blocked_task_runs_as_soon_as_a_worker_with_its_definition_starts(
    world: World,
) -> None:
    """Issue 11 point 6: blocked for an hour, it is not held back by an hour of backoff."""
    kernel, broker, dispatcher, handle = setup(world)
    old = Registry()  # the deployed workers do not know the kind yet
    stale = world.kernel(old)
    task_id = create(handle, "step", {"name": "later"})
    for _ in range(120):  # an hour of sweeps, each message finding the task blocked
        world.clock.advance(30)
        dispatcher.sweep()
        for sent in broker.sent:
            Worker(stale, "old").advance(sent)
        broker.sent.clear()
    world.clock.advance(5)
    Dispatcher(kernel, broker.deliver, redeliver_after=timedelta(seconds=30)).resume()
    assert broker.sent == [task_id]  # a worker with the definition starts: sent at once
    assert Worker(kernel, "new").advance(task_id)
    assert world.storage.task(task_id).outcome["kind"] == "succeeded"


def test_a_row_from_an_earlier_run_does_not_delay_a_later_lease_expiry(world: World) -> None:
    """Issue 11 point 6: recovery after an expiry is due at once, whatever older row the
    task still has."""
    kernel, broker, dispatcher, handle = setup(world)
    task_id = create(handle, "step", {"name": "s"})
    now = world.clock.now()
    claimed = world.storage.claim(task_id, "a", now, now + timedelta(seconds=10))
    world.clock.advance(11)  # a's lease lapses (a stalls); the sweep gives it a row
    assert dispatcher.sweep().delivered == 1
    now = world.clock.now()  # a renews before anyone claims: the row stays behind
    assert world.storage.renew(task_id, "a", claimed.epoch, now + timedelta(seconds=100))
    for _ in range(5):  # the row is re-sent, backing off, while a holds the lease
        world.clock.advance(20)
        dispatcher.sweep()
    world.clock.advance(2)  # a dies; its lease runs out at 111 s
    broker.sent.clear()
    assert dispatcher.sweep().delivered == 1
    assert broker.sent == [task_id]


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
    wire(kernel, committer)
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


def test_what_the_sweep_sends_goes_to_the_recovery_queue_ahead_of_the_backlog(
    world: World,
) -> None:
    kernel = world.kernel(make_registry(Effects()))
    sent: list[tuple[str, str]] = []
    after = timedelta(seconds=30)
    dispatcher = Dispatcher(
        kernel, lambda task, queue: sent.append((task, queue)), redeliver_after=after
    )
    kernel.after_commit(dispatcher.after_commit)
    task_id = create(kernel.create_session(), "step", {"name": "s"})
    world.clock.advance(31)
    dispatcher.sweep()
    queue = world.storage.task(task_id).queue
    assert sent == [(task_id, queue), (task_id, recovery_queue(queue))]


def test_an_attached_committer_that_dies_before_sending_leaves_its_rows_to_the_sweep(
    world: World,
) -> None:
    """Attached, a commit writes its due rows taken: if its process dies before the
    after-commit listeners send them, the sweep sends them once ``redeliver_after``
    has passed (as when a committer died between taking and sending)."""
    kernel = world.kernel(make_registry(Effects()))
    broker = Broker()
    dispatcher = Dispatcher(kernel, broker.deliver, redeliver_after=timedelta(seconds=30))
    dispatcher.attach()
    kernel.listeners.clear()  # the process dies right after COMMIT: no listener runs
    task_id = create(kernel.create_session(), "step", {"name": "s"})
    assert broker.sent == []
    assert dispatcher.sweep().delivered == 0  # taken by the commit that died
    world.clock.advance(31)
    assert dispatcher.sweep().delivered == 1
    assert broker.sent == [task_id]
    assert Worker(kernel, "w").advance(task_id)
    assert world.storage.task(task_id).outcome["kind"] == "succeeded"


def test_attached_the_commit_writes_its_due_rows_taken_and_only_those(world: World) -> None:
    kernel = world.kernel(make_registry(Effects()))
    broker = Broker()
    dispatcher = Dispatcher(kernel, broker.deliver, redeliver_after=timedelta(seconds=30))
    dispatcher.attach()
    handle = kernel.create_session()
    draft = Draft()
    now_id = draft.create_task("step", {"name": "now"})
    written = handle.commit(draft)
    [row] = written.dispatches
    assert (row.delivered_at, row.attempts, row.woken) == (world.clock.now(), 1, False)
    assert broker.sent == [now_id]
    assert Worker(kernel, "w").advance(now_id)
    napper = create(handle, "napper", {"name": "n", "seconds": 60})
    assert Worker(kernel, "w").advance(napper)  # now asleep: its row is not due
    assert dispatcher.sweep().delivered == 0
    world.clock.advance(61)
    broker.sent.clear()
    assert dispatcher.sweep().delivered == 1 and broker.sent == [napper]


def held(world: World, grace: float = 60.0, broker: Broker | None = None) -> tuple:
    """Attached with an announcement's grace: the messages of the rows its commits take wait
    ``grace`` seconds (a minute here: the tests send them with ``flush``). A ``Waker``
    broker takes queue messages too."""
    kernel = world.kernel(make_registry(Effects()))
    broker = broker or Broker()
    dispatcher = Dispatcher(kernel, broker.deliver, redeliver_after=timedelta(seconds=30),
                            announce_grace=timedelta(seconds=grace),
                            advance_queue=getattr(broker, "wake", None))
    dispatcher.attach()
    return kernel, broker, dispatcher, kernel.create_session()


def test_a_held_message_is_not_sent_for_a_task_claimed_during_its_grace(world: World) -> None:
    kernel, broker, dispatcher, handle = held(world)
    claimed = create(handle, "step", {"name": "claimed"})
    left = create(handle, "step", {"name": "left"})
    assert broker.sent == []  # held
    assert Worker(kernel, "reader").advance(claimed, announced=True)  # as a reader does
    dispatcher.flush()
    assert broker.sent == [left]
    dispatcher.flush()
    assert broker.sent == [left]  # sent once
    assert dispatcher.sweep().delivered == 0  # its row counts as delivered


def test_held_rows_of_a_queue_unclaimed_within_the_grace_go_as_one_queue_message(
    world: World,
) -> None:
    """The listening workers were busy: one worker claims the backlog in order from
    storage, not each row through a message of its own. One row alone keeps its own."""
    waker = Waker()
    kernel, broker, dispatcher, handle = held(world, broker=waker)
    claimed = create(handle, "step", {"name": "claimed"})
    backlog = [create(handle, "step", {"name": n}) for n in ("a", "b", "c")]
    assert Worker(kernel, "reader").advance(claimed, announced=True)
    dispatcher.flush()
    assert waker.sent == [] and waker.woke == ["default"]  # one queue message
    ran, more = Worker(kernel, "w").advance_queue("default", batch=10, budget=60)
    assert (ran, more) == (3, False)
    assert all(kernel.task(t).terminal for t in backlog)
    alone = create(handle, "step", {"name": "alone"})
    dispatcher.flush()
    assert waker.sent == [alone] and waker.woke == ["default"]
    assert dispatcher.sweep().delivered == 0


def test_a_held_message_goes_when_its_grace_has_passed(world: World) -> None:
    kernel, broker, dispatcher, handle = held(world, grace=0.05)
    task_id = create(handle, "step", {"name": "s"})
    try:
        deadline = threading.Event()
        for _ in range(500):
            if broker.sent:
                break
            deadline.wait(0.01)
        assert broker.sent == [task_id]
    finally:
        dispatcher.close()  # its thread's connection with it


def test_a_held_message_that_fails_to_send_is_left_to_the_sweep(world: World) -> None:
    kernel, broker, dispatcher, handle = held(world)
    task_id = create(handle, "step", {"name": "s"})
    broker.down = True
    dispatcher.flush()
    broker.down = False
    assert broker.sent == []
    assert dispatcher.sweep().delivered == 1  # released when the send failed: due now
    assert broker.sent == [task_id]


def test_existing_dispatches_are_those_of_tasks_not_claimed_since(world: World) -> None:
    kernel, broker, dispatcher, handle = setup(world)
    draft = Draft()
    ids = [draft.create_task("step", {"name": n}) for n in ("a", "b")]
    written = handle.commit(draft)
    rows = {d.task_id: d.id for d in written.dispatches}
    assert Worker(kernel, "w").advance(ids[0])
    assert world.storage.existing_dispatches([rows[ids[0]], rows[ids[1]], 10**9]) == {
        rows[ids[1]]}


def test_the_sweep_sends_a_dead_owners_task_to_the_recovery_queue_before_its_lease_ends(
    world: World,
) -> None:
    kernel = world.kernel(make_registry(Effects()))
    sent: list[tuple[str, str]] = []
    dead: set[str] = set()
    dispatcher = Dispatcher(
        kernel, lambda task, queue: sent.append((task, queue)),
        redeliver_after=timedelta(seconds=30), dead_owners=lambda now: sorted(dead),
    )
    wire(kernel, dispatcher)
    task_id = create(kernel.create_session(), "step", {"name": "s"})
    now = world.clock.now()
    held = world.storage.claim(task_id, "killed-worker", now, now + timedelta(seconds=60))
    assert held is not None
    sent.clear()
    world.clock.advance(1)
    assert dispatcher.sweep().delivered == 0  # alive as far as anyone knows
    dead.add("killed-worker")
    world.clock.advance(1)
    assert dispatcher.sweep().delivered == 1  # 58 s before the lease would have ended
    assert dispatcher.sweep().delivered == 0  # a second beat: nothing more
    queue = world.storage.task(task_id).queue
    assert sent == [(task_id, recovery_queue(queue))]
    world.clock.advance(0.001)
    Worker(kernel, "w2").advance(task_id)
    task = world.storage.task(task_id)
    assert task.outcome["kind"] == "succeeded" and task.restarts == 1
