"""Idle workers start a task when the commit that made it due is made
(controlplane.worker.announcements).

A commit whose dispatch rows are taken for a message each NOTIFYs the due channel in the
same transaction; a worker's announcement reader claims an announced task when the
process has a free slot and is not draining, and leaves it to its message otherwise. Here
the messages go nowhere, so a task that runs was started by the reader.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta

import psycopg
import pytest
from django.db import connection, connections

from controlplane.storage import PostgresStorage, due
from controlplane.storage.connection import announcing
from controlplane.worker.announcements import AnnouncementReader
from kernel import Draft, Kernel, ManualClock, Registry, Run, Transition, Worker
from kernel.dispatch import Dispatcher
from kernel.records import Status
from tests.databases import url_of_test_database

pytestmark = pytest.mark.django_db(transaction=True)


def world(
    messages: int = 32, grace: timedelta | None = None
) -> tuple[Kernel, Worker, list[str]]:
    """A kernel whose commits take their due rows (``Dispatcher.attach``) and whose
    messages are only recorded (held for ``grace``, if given); a worker on it."""
    registry = Registry()

    @registry.task("quick", queue="hands")
    class Quick:
        initial = "go"

        def go(self, run: Run) -> Transition:
            return run.succeed({"ok": True})

    @registry.task("nap", queue="hands")
    class Nap:
        initial = "go"

        def go(self, run: Run) -> Transition:
            if run.checkpoint.get("slept"):
                return run.succeed({})
            return run.sleep(3600, then="go", checkpoint={"slept": True})

    kernel = Kernel(PostgresStorage(), registry, ManualClock())
    sent: list[str] = []
    Dispatcher(kernel, lambda task_id, queue: sent.append(task_id),
               advance_queue=lambda queue: sent.append(f"wake:{queue}"), messages=messages,
               announce_grace=grace).attach()
    return kernel, Worker(kernel, "listening-worker"), sent


def create(kernel: Kernel, count: int = 1, kind: str = "quick") -> list[str]:
    handle = kernel.create_session()
    draft = Draft(actor="user:test")
    ids = [draft.create_task(kind, {}) for _ in range(count)]
    handle.commit(draft)
    return ids


@pytest.fixture
def announcements() -> Iterator[Callable[[], list[tuple[str, str]]]]:
    """The announcements a LISTENing connection has received so far."""
    conn = psycopg.connect(url_of_test_database(), autocommit=True)
    conn.execute(due.LISTEN)

    def received() -> list[tuple[str, str]]:
        return [pair for n in conn.notifies(timeout=0.2) for pair in due.parse(n.payload)]

    yield received
    conn.close()


def test_a_commit_announces_the_tasks_it_takes_a_message_for(
    announcements: Callable[[], list],
) -> None:
    kernel, _, sent = world()
    ids = create(kernel, 2)
    assert sent == ids  # the messages still go
    assert sorted(announcements()) == sorted(("hands", i) for i in ids)


def test_a_burst_and_a_task_not_due_are_not_announced(announcements: Callable[[], list]) -> None:
    kernel, worker, sent = world(messages=2)
    create(kernel, 3)  # more than `messages`: the queue is woken instead
    assert sent == ["wake:hands", "wake:hands"]
    assert announcements() == []
    [nap] = create(kernel, kind="nap")
    assert announcements() == [("hands", nap)]
    assert worker.advance(nap)  # its phase sleeps: a dispatch row due in an hour
    assert kernel.storage.task(nap).status is Status.SLEEPING
    assert announcements() == []


def test_a_commit_of_more_tasks_than_one_announcement_holds_is_made_and_announces_what_fits(
    announcements: Callable[[], list],
) -> None:
    """Postgres refuses a notification of 8,000 bytes or more, and with it the commit that
    sends it: a commit taking more rows than that holds (a message each, as a high
    ``messages`` allows) announces those that fit, and the rest go by their messages."""
    kernel, _, sent = world(messages=500)
    ids = create(kernel, 300)
    assert sent == ids  # every message still goes
    heard = announcements()
    assert 0 < len(heard) < len(ids)
    assert set(heard) <= {("hands", i) for i in ids}


def test_a_commit_announces_after_itself_while_another_of_the_process_announces(
    announcements: Callable[[], list],
) -> None:
    """Postgres orders every notifying commit behind one lock, its flush included:
    commits of this process announce in their transaction one at a time, and one that
    finds another announcing announces right after its commit, in a transaction that
    does not wait for the flush. Its message is held for the grace as any other."""
    kernel, _, sent = world(grace=timedelta(seconds=30))
    statements: list[str] = []

    def record(execute: Callable, sql: str, params: object, many: bool, context: dict) -> object:
        statements.append(sql)
        return execute(sql, params, many, context)

    def commit_beside() -> None:
        with connection.execute_wrapper(record):
            made.extend(create(kernel))

    assert announcing.claim()  # another thread's commit is announcing
    made: list[str] = []
    try:
        beside = threading.Thread(target=commit_beside)
        beside.start()
        beside.join(10)
    finally:
        announcing.done()
    assert statements[-1] == due.NOTIFY_UNFLUSHED  # after the commit, on its own
    assert not any("pg_notify" in statement for statement in statements[:-1])
    assert announcements() == [("hands", made[0])]
    assert sent == []  # held for the grace: a listening worker may claim it
    later = create(kernel)
    assert announcements() == [("hands", later[0])]
    end_the_grace(kernel)
    assert sent == ["wake:hands"]  # nobody claimed them: a backlog, one queue message


def test_parse_skips_lines_of_other_senders() -> None:
    assert list(due.parse("hands\tt1\nnoise\n\tt2\nbrain\tt3")) == [("hands", "t1"),
                                                                    ("brain", "t3")]


def announced(worker: Worker) -> Callable[[str], bool]:
    return lambda task_id: worker.advance(task_id, announced=True)


@contextmanager
def listening(worker: Worker) -> Iterator[AnnouncementReader]:
    """A reader on ``hands`` running ``worker``'s claims, listening, stopped after."""
    reader = AnnouncementReader({"hands"}, threading.Semaphore(1), announced(worker), lambda: True)
    reader.start()
    try:
        assert reader.listening.wait(10)
        yield reader
    finally:
        reader.stop(timeout=10)


def ran_from_the_announcement(kernel: Kernel) -> str:
    [task_id] = create(kernel)
    assert wait_until(lambda: kernel.storage.task(task_id).status is Status.TERMINAL)
    return task_id


def test_an_idle_worker_runs_an_announced_task_without_its_message() -> None:
    kernel, worker, _ = world()
    with listening(worker) as reader:
        ran_from_the_announcement(kernel)
        # Counted once the claim returns, a moment after its commit ended the task.
        assert wait_until(lambda: reader.ran == 1)


def test_no_message_goes_for_a_task_a_reader_claimed_within_the_grace() -> None:
    """The committer holds each message for the grace and sends it only for a task
    still unclaimed: here the one on a queue that nobody listens to."""
    kernel, worker, sent = world(grace=timedelta(seconds=30))
    with listening(worker) as reader:
        ran_from_the_announcement(kernel)
        reader.queues = {"brain"}  # now nobody listens to hands
        [unheard] = create(kernel)
    end_the_grace(kernel)
    assert sent == [unheard]


def end_the_grace(kernel: Kernel) -> None:
    """Send now what the kernel's dispatcher still holds for the grace, if still wanted."""
    dispatcher = next(f.__self__ for f in kernel.listeners
                      if isinstance(getattr(f, "__self__", None), Dispatcher))
    dispatcher.close()


@pytest.mark.parametrize("why", ["busy", "draining", "another queue"])
def test_an_announcement_is_left_to_its_message(why: str) -> None:
    """Nothing is claimed: the task stays as its commit left it, for its message."""
    kernel, worker, _ = world()
    slots = threading.Semaphore(1)
    reader = AnnouncementReader({"brain" if why == "another queue" else "hands"}, slots,
                                announced(worker), lambda: why != "draining")
    [task_id] = create(kernel)
    if why == "busy":
        slots.acquire()  # a message's phase runs
    reader.on_announcement(f"hands\t{task_id}")
    task = kernel.storage.task(task_id)
    assert task.status is Status.PENDING and task.epoch == 0
    assert reader.ran == 0
    assert worker.advance(task_id)  # what its message does


def test_a_busy_reader_takes_an_announced_task_when_its_slot_frees_within_the_grace() -> None:
    """A worker that ends its phase within the grace runs the next announced task from
    Postgres: its message, held for the grace, is then not sent."""
    kernel, worker, _ = world()
    slots = threading.Semaphore(1)
    reader = AnnouncementReader({"hands"}, slots, announced(worker), lambda: True, grace=30.0)
    [task_id] = create(kernel)
    slots.acquire()  # a message's phase runs
    threading.Timer(0.2, slots.release).start()  # and ends
    reader.on_announcement(f"hands\t{task_id}")
    assert reader.ran == 1
    assert kernel.storage.task(task_id).status is Status.TERMINAL


def test_a_reader_busy_past_the_grace_leaves_the_task_to_its_message() -> None:
    kernel, worker, _ = world()
    slots = threading.Semaphore(1)
    reader = AnnouncementReader({"hands"}, slots, announced(worker), lambda: True, grace=0.1)
    [task_id] = create(kernel)
    slots.acquire()  # a message's phase runs past the grace
    started = time.monotonic()
    reader.on_announcement(f"hands\t{task_id}", heard=started)
    assert 0.1 <= time.monotonic() - started < 5
    assert reader.ran == 0
    assert kernel.storage.task(task_id).status is Status.PENDING


def test_a_reader_busy_behind_a_long_phase_waits_out_the_grace_once_not_for_each() -> None:
    """Announcements that piled up in the connection while the reader waited are as old
    as the wait: their grace is over, and their messages may be on their way."""
    kernel, worker, _ = world()
    slots = threading.Semaphore(1)
    reader = AnnouncementReader({"hands"}, slots, announced(worker), lambda: True, grace=1.0)
    slots.acquire()  # a message's phase runs, for long
    reader.start()
    try:
        assert reader.listening.wait(10)
        started = time.monotonic()
        ids = [create(kernel)[0] for _ in range(4)]  # four commits, four announcements
        assert wait_until(lambda: reader.left == 4)
        assert time.monotonic() - started < 3.0  # not four graces one after another
    finally:
        slots.release()
        reader.stop(timeout=10)
    assert reader.ran == 0
    assert {kernel.storage.task(i).status for i in ids} == {Status.PENDING}


def test_an_announcement_for_a_task_already_claimed_reads_nothing_more(
    django_assert_num_queries: Callable,
) -> None:
    kernel, worker, _ = world()
    [task_id] = create(kernel)
    assert Worker(kernel, "other").advance(task_id)
    with django_assert_num_queries(1):  # the claim, and no read of the task after it
        assert not worker.advance(task_id, announced=True)


def test_the_reader_listens_again_after_its_connection_is_lost() -> None:
    kernel, worker, _ = world()
    import controlplane.worker.announcements as module

    module.RECONNECT_SECONDS, before = 0.05, module.RECONNECT_SECONDS
    try:
        with listening(worker) as reader:
            with connection.cursor() as cur:  # as a restarting Postgres would
                cur.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                            "WHERE query = %s AND datname = current_database()", [due.LISTEN])
                assert cur.rowcount == 1
            assert wait_until(lambda: not reader.listening.is_set())
            assert reader.listening.wait(10)
            ran_from_the_announcement(kernel)
    finally:
        module.RECONNECT_SECONDS = before
    connections.close_all()


def wait_until(check: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.01)
    return False
