"""A burst is delivered by a few queue messages of its queue, and a queue message's worker takes the
burst's tasks from storage one after another (issue 12): the outbox is the queue, and a
burst needs a few messages, not one per task."""

from __future__ import annotations

import contextlib
import threading
import time
from datetime import timedelta

import pytest

from kernel import Draft, Registry, Run, Status, Transition, Worker
from kernel.dispatch import Dispatcher, recovery_queue
from kernel.worker import QUICK_SECONDS

from .brokers import WIRING, Waker
from .definitions import Effects, make_registry
from .world import World

# Both ways a dispatcher delivers after commits (conftest.py): attached, a burst's rows are
# written woken by their commit.
pytestmark = pytest.mark.usefixtures("wiring")


def with_other_queue(registry: Registry) -> Registry:
    @registry.task("elsewhere", queue="brain")
    class Elsewhere:
        initial = "go"

        def go(self, run: Run) -> Transition:
            return run.succeed("ran")

    return registry


def setup(world: World, registry: Registry, messages: int = 2):
    kernel = world.kernel(registry)
    broker = Waker()
    dispatcher = Dispatcher(kernel, broker.deliver, advance_queue=broker.wake, messages=messages)
    if WIRING["attached"]:
        dispatcher.attach()
    else:
        kernel.after_commit(dispatcher.after_commit)
    return kernel, broker, dispatcher


def create(handle, kind: str, count: int) -> list[str]:
    draft = Draft()
    ids = [draft.create_task(kind, {"name": str(i)}) for i in range(count)]
    handle.commit(draft)
    return ids


def tasks_of(world: World, *handles) -> dict:
    return {t.id: t for h in handles for t in world.storage.session_tasks(h.id)}


def succeeded(task) -> bool:
    return (task.outcome or {}).get("kind") == "succeeded"


def expire_lease(world: World, task_id: str) -> None:
    """Take the lease of ``task_id`` from its holder ``w``, as if it had run out."""
    task = world.storage.task(task_id)
    assert task is not None
    world.storage.release(task_id, "w", task.epoch, world.clock.now(), interrupted=True)


def test_a_burst_sends_wakes_and_a_small_commit_a_message_per_task(world: World) -> None:
    kernel, broker, dispatcher = setup(world, with_other_queue(make_registry(Effects())))
    handle = kernel.create_session()
    draft = Draft()
    burst = [draft.create_task("step", {"name": str(i)}) for i in range(5)]
    few = [draft.create_task("elsewhere", {}) for _ in range(2)]
    handle.commit(draft)

    assert broker.woke == ["default", "default"]  # 5 > 2: two queue messages, no messages
    assert broker.sent == few  # 2 <= 2: a message each, as without queue messages
    world.clock.advance(1)
    assert dispatcher.sweep().delivered == 0  # every row is delivered
    now = world.clock.now()
    until = now + timedelta(seconds=30)
    assert world.storage.claim_burst("brain", "w", now, until) is None
    claimed = world.storage.claim_burst("default", "w", now, until)
    assert claimed is not None and claimed.id == burst[0] and claimed.lease_owner == "w"


def test_a_failed_wake_leaves_the_burst_to_the_sweep(world: World) -> None:
    kernel, broker, dispatcher = setup(world, make_registry(Effects()))
    handle = kernel.create_session()
    broker.down = True
    create(handle, "step", 3)
    broker.down = False
    assert broker.woke == []
    assert dispatcher.sweep().delivered == 3
    assert broker.woke == [recovery_queue("default")] * 2  # the sweep sends late work there


def test_claim_burst_takes_due_unblocked_burst_rows_of_its_queue_oldest_first(
    world: World,
) -> None:
    kernel, broker, _ = setup(world, with_other_queue(make_registry(Effects())))
    handle = kernel.create_session()
    first = create(handle, "step", 3)
    create(handle, "elsewhere", 3)
    [single] = create(handle, "step", 1)  # a message of its own: not for a queue message's worker
    later = create(handle, "step", 3)
    world.storage.block_dispatches(first[1])
    now = world.clock.now()
    until = now + timedelta(seconds=30)

    def claim(owner: str) -> str | None:
        task = world.storage.claim_burst("default", owner, now, until)
        return None if task is None else task.id

    taken = [claim(f"w{i}") for i in range(6)]
    assert taken == [first[0], first[2], *later, None]
    assert single in broker.sent
    assert world.storage.claim(single, "x", now, until) is not None
    assert world.storage.claim(first[1], "x", now, until) is not None  # runnable all along


def test_advance_queue_runs_the_burst_tasks_of_its_queue(world: World) -> None:
    kernel, _, _ = setup(world, with_other_queue(make_registry(Effects())))
    handle = kernel.create_session()
    ids = create(handle, "step", 7)
    other = create(handle, "elsewhere", 4)
    worker = Worker(kernel, "w")

    assert worker.advance_queue("default", batch=3, budget=60) == (7, False)
    tasks = tasks_of(world, handle)
    assert all(succeeded(tasks[i]) and tasks[i].epoch == 1 for i in ids)
    assert all(tasks[i].status is Status.PENDING for i in other)
    assert worker.held == {}
    assert worker.advance_queue("default", batch=3, budget=60) == (0, False)
    assert worker.advance_queue("brain", batch=3, budget=0) == (1, True)  # budget spent
    assert worker.advance_queue("brain", batch=3, budget=60) == (3, False)


def test_quick_endings_of_a_queue_worker_land_in_one_commit_per_session(world: World) -> None:
    kernel, _, _ = setup(world, with_other_queue(make_registry(Effects())))
    one, two = kernel.create_session(), kernel.create_session()
    ids = create(one, "elsewhere", 3) + create(two, "elsewhere", 4)
    heads = {one.id: one.head_seq, two.id: two.head_seq}
    worker = Worker(kernel, "w")

    assert worker.advance_queue("brain", batch=10, budget=60) == (7, False)
    commits = {s: kernel.commits_after(s, heads[s]) for s in heads}
    assert [len(c) for c in commits.values()] == [1, 1]
    summaries = [item for cs in commits.values() for c in cs for item in c.summary]
    assert sorted(item["id"] for item in summaries if item["type"] == "task") == sorted(ids)
    assert all(c.actor == "worker:w" for cs in commits.values() for c in cs)
    assert all(succeeded(t) for t in tasks_of(world, one, two).values())
    assert worker.held == {}


@pytest.mark.parametrize("intent", [False, True], ids=["joint-endings", "carried-by-intent"])
def test_a_refused_commit_of_held_back_endings_commits_each_on_its_own(
    world: World, intent: bool
) -> None:
    """The thief expires the lease of the task before it; then the commit that holds that
    task's ending (the joint endings' one, or the thief's own intent commit carrying it)
    is stale, and each is committed on its own instead."""
    registry = make_registry(Effects())

    @registry.task("stealer")
    class Stealer:
        initial = "go"

        def go(self, run: Run) -> Transition:
            if run.input.get("victim"):
                expire_lease(world, run.input["victim"])
                if intent:
                    run.commit(phase="go", checkpoint={"intent": True})
            return run.succeed("done")

    kernel, _, _ = setup(world, registry)
    handle = kernel.create_session()
    draft = Draft()
    warm = draft.create_task("stealer", {})
    victim = draft.create_task("stealer", {})
    thief = draft.create_task("stealer", {"victim": victim})
    handle.commit(draft)
    worker = Worker(kernel, "w")

    assert worker.advance_queue("default", batch=10, budget=60) == (3, False)
    tasks = tasks_of(world, handle)
    assert succeeded(tasks[warm]) and succeeded(tasks[thief])
    assert tasks[thief].checkpoint == ({"intent": True} if intent else {})
    assert tasks[victim].status is Status.RUNNING and tasks[victim].outcome is None
    assert worker.held == {}


def test_a_draining_queue_worker_claims_nothing_more(world: World) -> None:
    registry = make_registry(Effects())
    kernel, _, _ = setup(world, registry)
    handle = kernel.create_session()
    ids = create(handle, "step", 4)
    worker = Worker(kernel, "w")
    start = registry.latest("step").phases["start"]

    def drain_after_first(run: Run) -> Transition:
        worker.drain()
        return start(run)

    registry.latest("step").phases["start"] = drain_after_first
    assert worker.advance_queue("default", batch=4, budget=60) == (1, True)
    tasks = tasks_of(world, handle)
    assert succeeded(tasks[ids[0]])
    assert [tasks[i].status for i in ids[1:]] == [Status.PENDING] * 3
    assert all(tasks[i].epoch == 0 for i in ids[1:])


def test_waiting_endings_ride_with_the_workers_next_commit_in_their_session(
    world: World,
) -> None:
    registry = make_registry(Effects())

    @registry.task("quick")
    class Quick:
        initial = "go"

        def go(self, run: Run) -> Transition:
            return run.succeed("ran")

    kernel, _, _ = setup(world, registry)
    handle = kernel.create_session()
    draft = Draft()
    quick = [draft.create_task("quick", {}) for _ in range(2)]
    step = draft.create_task("step", {"name": "s"})  # its phase commits its intent first
    handle.commit(draft)
    head = handle.head_seq

    assert Worker(kernel, "w").advance_queue("default", batch=10, budget=60) == (3, False)
    commits = kernel.commits_after(handle.id, head)
    touched = [sorted(i["id"] for i in c.summary if i["type"] == "task") for c in commits]
    assert touched == [sorted([*quick, step]), [step]]  # its intent carries their endings
    assert [c.actor for c in commits] == [f"task:{step}"] * 2
    assert all(succeeded(t) for t in tasks_of(world, handle).values())



def test_endings_are_committed_before_a_task_of_a_kind_that_was_slow(world: World) -> None:
    registry = make_registry(Effects())

    @registry.task("dawdler")
    class Dawdler:
        initial = "go"

        def go(self, run: Run) -> Transition:
            if run.input.get("slow"):
                time.sleep(QUICK_SECONDS * 1.5)
            return run.succeed("ran")

    kernel, _, _ = setup(world, registry)
    handle = kernel.create_session()
    draft = Draft()
    quick = draft.create_task("dawdler", {})
    slow = [draft.create_task("dawdler", {"slow": True}) for _ in range(2)]
    handle.commit(draft)
    head = handle.head_seq

    assert Worker(kernel, "w").advance_queue("default", batch=10, budget=60) == (3, False)
    commits = kernel.commits_after(handle.id, head)
    touched = [sorted(i["id"] for i in c.summary if i["type"] == "task") for c in commits]
    assert touched == [sorted([quick, slow[0]]), [slow[1]]]  # not held behind the slow one


def test_a_burst_too_big_for_one_statement_is_written_and_marked(world: World) -> None:
    kernel, broker, dispatcher = setup(world, with_other_queue(make_registry(Effects())))
    handle = kernel.create_session()
    count = 65535 // 8 + 1  # more rows than one insert statement takes parameters for
    draft = Draft()
    for _ in range(count):
        draft.create_task("elsewhere", {})
    written = handle.commit(draft)

    ids = [d.id for d in written.dispatches]
    assert len(ids) == len(set(ids)) == count and all(ids)
    assert broker.woke == ["brain", "brain"]
    world.clock.advance(1)
    assert dispatcher.sweep().delivered == 0


def test_any_open_says_whether_a_join_still_waits(world: World) -> None:
    kernel, _, _ = setup(world, make_registry(Effects()))
    handle = kernel.create_session()
    ids = create(handle, "step", 3)
    worker = Worker(kernel, "w")
    for task_id in ids[:2]:
        worker.advance(task_id)
    seen: list[bool] = []

    def peek(tx) -> None:
        seen.extend([tx.any_open(ids), tx.any_open(ids[:2]), tx.any_open([]),
                     tx.any_open(["task_unknown"])])
        raise RuntimeError("read only")

    with contextlib.suppress(RuntimeError):
        world.storage.commit(handle.id, peek)
    assert seen == [True, False, False, False]


def test_a_thread_of_a_worker_never_carries_another_threads_endings(world: World) -> None:
    """A threads pool shares one Worker: the endings one thread holds back are its own."""
    registry = make_registry(Effects())
    worker: Worker

    @registry.task("quick")
    class Quick:
        initial = "go"

        def go(self, run: Run) -> Transition:
            if run.input.get("other"):
                other = threading.Thread(target=worker.advance, args=[run.input["other"]])
                other.start()
                other.join()
            return run.succeed("ran")

    kernel, _, _ = setup(world, registry)
    worker = Worker(kernel, "w")
    handle = kernel.create_session()
    [elsewhere] = create(handle, "quick", 1)  # a message of its own: not woken
    draft = Draft()
    first = draft.create_task("quick", {})
    draft.create_task("quick", {"other": elsewhere})
    draft.create_task("quick", {})
    handle.commit(draft)
    head = handle.head_seq

    assert worker.advance_queue("default", batch=10, budget=60) == (3, False)
    commits = kernel.commits_after(handle.id, head)
    touched = [{i["id"] for i in c.summary if i["type"] == "task"} for c in commits]
    [theirs] = [ids for ids in touched if elsewhere in ids]
    assert theirs == {elsewhere} and any(first in ids for ids in touched)
    assert all(succeeded(t) for t in tasks_of(world, handle).values())


@pytest.mark.parametrize("intent", [False, True], ids=["inline-next", "intent"])
def test_held_back_endings_ride_an_intent_commit_but_not_a_plain_inline_next(
    world: World, intent: bool
) -> None:
    """A queue message's worker holds back the ending of the first task; the second task's first
    commit carries it only if it is an intent commit (an external call follows it). A
    phase that returned and only continues its task inline commits alone (one round trip
    on Postgres, from the lease's copy), and the ending waits for its batch."""
    registry = make_registry(Effects())

    @registry.task("two-step")
    class TwoStep:
        initial = "one"

        def one(self, run: Run) -> Transition:
            if intent:
                run.commit(checkpoint={"intent": True})
            return run.next("two", {"one": True})

        def two(self, run: Run) -> Transition:
            return run.succeed("done")

    @registry.task("quick")
    class Quick:
        initial = "go"

        def go(self, run: Run) -> Transition:
            return run.succeed("ran")

    kernel, _, _ = setup(world, registry, messages=1)  # two tasks are a burst: woken
    handle = kernel.create_session()
    draft = Draft()
    first = draft.create_task("quick", {})
    second = draft.create_task("two-step", {})
    handle.commit(draft)
    head = handle.head_seq
    worker = Worker(kernel, "w")

    assert worker.advance_queue("default", batch=10, budget=60) == (2, False)
    commits = kernel.commits_after(handle.id, head)
    moved = [sorted(i["id"] for i in c.summary if i["type"] == "task") for c in commits]
    if intent:
        # The intent commit carried the first task's ending; then the inline Next alone,
        # then the second task's ending.
        assert moved == [sorted([first, second]), [second], [second]]
    else:
        # The inline Next alone; both endings in one commit at the end of the batch.
        assert moved == [[second], sorted([first, second])]
    tasks = tasks_of(world, handle)
    assert succeeded(tasks[first]) and succeeded(tasks[second])
    assert worker.held == {}
