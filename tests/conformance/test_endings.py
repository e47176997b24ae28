"""Every way a task ends releases what it holds (issue 11, points 1, 2 and 7), on both
storages.

An agent turn holds its conversation (the ``agent-conversation`` document names it
active) and its submissions: however it ends - answered, cancelled by an operator, a
phase that raised, past the restart limit - the commit that ends it settles each
submission with a status and a reason and hands the conversation on. A steer that
arrived while the last model request was in flight is asked about before the turn
finishes. A storage error inside a handler restarts the phase, never fails the task,
and the restart limit holds for intent commits and for the cancel path too.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from kernel import (
    Draft,
    IllegalTransition,
    Kernel,
    Registry,
    Run,
    Status,
    StorageUnavailable,
    SubmissionStatus,
    Transition,
)
from kernel.agent import (
    ModelRequest,
    ModelResponse,
    ScriptedProvider,
    Toolbox,
    WhenBusy,
    register_agent,
    submit,
)
from tests.unit.crashes import Crash

from .world import World

CONVERSATION = "agent-conversation"


class Agent:
    """A conversation on the storage under test, with a model whose behaviour the test
    scripts (``on_request`` runs inside the model call, as a concurrent actor would)."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.requests: list[ModelRequest] = []
        self.on_request: Callable[[int], None] | None = None
        self.registry = self.make_registry()
        kernel = self.kernel()
        self.handle = kernel.create_session()
        draft = Draft()
        self.conversation = draft.create_conversation()
        self.handle.commit(draft)

    def make_registry(self) -> Registry:
        def answer(request: ModelRequest) -> ModelResponse:
            self.requests.append(request)
            if self.on_request is not None:
                self.on_request(len(self.requests))
            said = [m["content"] for m in request.messages if m["role"] == "user"]
            return ModelResponse(f"answer {len(self.requests)} to {said}")

        registry = Registry()
        register_agent(registry, {"scripted": ScriptedProvider(answer)}, Toolbox(), "scripted")
        return registry

    def kernel(self) -> Kernel:
        return self.world.kernel(self.registry)

    def submit(self, text: str, request_id: str, when_busy: WhenBusy = WhenBusy.FOLLOW_UP,
               **kw: Any) -> Any:
        handle = self.kernel().open(self.handle.id)
        return submit(handle, self.conversation, {"text": text}, request_id, when_busy, **kw)

    def cancel(self, task_id: str, reason: str = "operator stop") -> None:
        draft = Draft(actor="user:op")
        draft.cancel(task_id, reason)
        self.kernel().open(self.handle.id).commit(draft)

    def run(self) -> None:
        self.world.scheduler(self.registry).run_until_idle(advance_clock=True)

    def state(self) -> Any:
        return self.kernel().document(self.handle.id, CONVERSATION, self.conversation)

    def submission(self, submitted: Any) -> Any:
        return self.world.storage.submission(submitted.submission.id)

    def turn_of(self, submitted: Any) -> Any:
        return next(
            t for t in self.world.storage.session_tasks(self.handle.id)
            if t.kind == "agent-turn" and submitted.submission.id in t.input["submissions"]
        )


# -- point 1: a turn that ends any way releases its conversation ---------------------------


def test_a_cancelled_running_turn_releases_its_conversation_and_settles_its_input(
    world: World,
) -> None:
    agent = Agent(world)
    first = agent.submit("hello", "req-1")
    turn = agent.turn_of(first)
    agent.on_request = lambda n: agent.cancel(turn.id) if n == 1 else None
    agent.run()

    ended = world.storage.task(turn.id)
    assert ended.outcome["kind"] == "cancelled"
    assert agent.state()["active"] is None
    stored = agent.submission(first)
    assert stored.status is SubmissionStatus.CANCELLED
    assert "cancelled by user:op" in stored.reason and "operator stop" in stored.reason

    # The conversation takes input again: `reject` is accepted and answered...
    again = agent.submit("are you there?", "req-2", WhenBusy.REJECT)
    assert again.outcome == "placed"
    agent.run()
    assert agent.submission(again).status is SubmissionStatus.ANSWERED
    # ...and resubmitting the cancelled input starts a new turn of its own.
    resubmitted = agent.submit("hello", "req-3", resubmit_of=first.submission.id)
    assert resubmitted.outcome == "placed"
    agent.run()
    assert agent.submission(resubmitted).status is SubmissionStatus.ANSWERED
    assert agent.state()["active"] is None


def test_a_cancel_settles_steered_input_and_starts_the_queued_follow_up(world: World) -> None:
    agent = Agent(world)
    first = agent.submit("hello", "req-1")
    turn = agent.turn_of(first)
    later: dict[str, Any] = {}

    def during_first_request(n: int) -> None:
        if n == 1:
            later["steer"] = agent.submit("and also this", "req-steer", WhenBusy.STEER)
            later["follow"] = agent.submit("next question", "req-follow", WhenBusy.FOLLOW_UP)
            agent.cancel(turn.id)

    agent.on_request = during_first_request
    agent.run()

    assert agent.submission(first).status is SubmissionStatus.CANCELLED
    assert agent.submission(later["steer"]).status is SubmissionStatus.CANCELLED
    follow = agent.submission(later["follow"])
    assert follow.status is SubmissionStatus.ANSWERED
    assert agent.state() == {"active": None, "queue": [], "steering": []}


def test_a_turn_whose_phase_raises_fails_and_releases_its_conversation(world: World) -> None:
    agent = Agent(world)
    first = agent.submit("hello", "req-1")
    queued: dict[str, Any] = {}

    def explode(n: int) -> None:
        if n == 1:
            queued["follow"] = agent.submit("next", "req-2")
            raise RuntimeError("a bug in the provider adapter")

    agent.on_request = explode
    agent.run()

    turn = world.storage.task(agent.turn_of(first).id)
    assert turn.outcome["kind"] == "failed"
    stored = agent.submission(first)
    assert stored.status is SubmissionStatus.FAILED
    assert "RuntimeError: a bug in the provider adapter" in stored.reason
    assert agent.submission(queued["follow"]).status is SubmissionStatus.ANSWERED
    assert agent.state()["active"] is None


def test_a_restart_limited_turn_fails_and_releases_its_conversation(world: World) -> None:
    agent = Agent(world)
    first = agent.submit("hello", "req-1")
    queued = agent.submit("next", "req-2")
    turn = agent.turn_of(first)
    limit = agent.registry.latest("agent-turn").max_restarts
    for _ in range(limit + 1):  # every commit of the turn dies before it writes
        world.faults.armed["before_write"] = Crash()
        world.reopen()
        with pytest.raises(Crash):
            agent.run()
        assert world.storage.task(turn.id).status is Status.RUNNING
    world.reopen()
    agent.run()

    ended = world.storage.task(turn.id)
    assert ended.outcome["kind"] == "failed" and "restart limit" in ended.outcome["error"]
    stored = agent.submission(first)
    assert stored.status is SubmissionStatus.FAILED and "restart limit" in stored.reason
    assert agent.submission(queued).status is SubmissionStatus.ANSWERED
    assert agent.state()["active"] is None


# -- point 2: a steer is never answered by an answer that did not see it ----------------------


def test_a_steer_during_the_last_model_request_is_asked_about_before_the_turn_ends(
    world: World,
) -> None:
    agent = Agent(world)
    first = agent.submit("hello", "req-1")
    steered: dict[str, Any] = {}

    def steer_once(n: int) -> None:
        if n == 1:
            steered["s"] = agent.submit("use French", "req-steer", WhenBusy.STEER)

    agent.on_request = steer_once
    agent.run()

    assert len(agent.requests) == 2
    last_request_said = [m["content"] for m in agent.requests[-1].messages if m["role"] == "user"]
    assert "use French" in last_request_said
    steer = agent.submission(steered["s"])
    original = agent.submission(first)
    assert steer.status is SubmissionStatus.ANSWERED
    assert steer.answer_entry_id == original.answer_entry_id
    answer = next(e for e in agent.kernel().entries(agent.conversation)
                  if e.id == steer.answer_entry_id)
    assert "use French" in answer.payload["text"]
    assert agent.state()["active"] is None


# -- point 7: transient storage errors restart; the restart limit always holds -----------------


def counting_registry(calls: list[str], fail: Callable[[Run, str], None]) -> Registry:
    registry = Registry()
    registry.document("notes")

    @registry.task("intent-call")
    class IntentCall:
        initial = "call"

        def call(self, run: Run) -> Transition:
            run.commit(checkpoint={"tries": run.checkpoint.get("tries", 0) + 1})  # the intent
            fail(run, "after-intent")
            run.document("notes", "n")  # a read, as a handler makes them
            calls.append("call")
            fail(run, "after-read")
            return run.succeed({"tries": run.checkpoint["tries"]})

        def on_cancel(self, run: Run) -> None:
            calls.append("on_cancel")
            fail(run, "on_cancel")

    return registry


def start_task(world: World, registry: Registry, kind: str = "intent-call") -> str:
    handle = world.kernel(registry).create_session()
    draft = Draft(actor="user:ann")
    task_id = draft.create_task(kind, {})
    handle.commit(draft)
    return task_id


def crash_past_the_limit(world: World, registry: Registry) -> int:
    """Restart after a crash, once more than the restart limit allows; then once more,
    which ends the task. Returns the limit."""
    limit: int = registry.latest("intent-call").max_restarts
    for attempt in range(limit + 1):
        world.reopen()
        with pytest.raises(Crash):
            world.scheduler(registry, worker_id=f"w{attempt + 1}").run_until_idle(
                advance_clock=True
            )
    world.reopen()
    world.scheduler(registry, worker_id="last").run_until_idle(advance_clock=True)
    return limit


def test_a_storage_error_in_an_intent_commit_restarts_the_phase_and_never_fails_it(
    world: World,
) -> None:
    calls: list[str] = []
    registry = counting_registry(calls, lambda run, point: None)
    task_id = start_task(world, registry)
    world.faults.armed["before_write"] = StorageUnavailable("connection lost")
    world.scheduler(registry).run_until_idle()
    interrupted = world.storage.task(task_id)
    assert not interrupted.terminal, interrupted.outcome
    assert interrupted.status is Status.RUNNING  # abandoned: its lease runs out

    world.reopen()
    world.scheduler(registry, worker_id="w2").run_until_idle(advance_clock=True)
    task = world.storage.task(task_id)
    assert task.outcome["kind"] == "succeeded"
    assert calls == ["call"]


def test_a_storage_error_on_a_read_inside_a_handler_restarts_the_phase(world: World) -> None:
    calls: list[str] = []
    failures = {"after-intent": 1}

    def fail(run: Run, point: str) -> None:
        if failures.get(point):
            failures[point] -= 1
            raise StorageUnavailable("server closed the connection unexpectedly")

    registry = counting_registry(calls, fail)
    task_id = start_task(world, registry)
    world.scheduler(registry).run_until_idle(advance_clock=True)
    task = world.storage.task(task_id)
    assert task.outcome["kind"] == "succeeded"
    assert task.outcome["result"] == {"tries": 2}


def test_a_phase_that_commits_its_intent_then_dies_every_time_reaches_the_limit(
    world: World,
) -> None:
    calls: list[str] = []

    def die(run: Run, point: str) -> None:
        if point == "after-intent":
            raise Crash()

    registry = counting_registry(calls, die)
    task_id = start_task(world, registry)
    limit = crash_past_the_limit(world, registry)
    task = world.storage.task(task_id)
    assert task.outcome["kind"] == "failed"
    assert f"restart limit is {limit}" in task.outcome["error"]
    assert task.checkpoint["tries"] == limit + 1


def test_a_cancel_handler_that_dies_every_time_reaches_the_limit(world: World) -> None:
    calls: list[str] = []

    def die(run: Run, point: str) -> None:
        if point in ("after-read", "on_cancel"):
            raise Crash()

    registry = counting_registry(calls, die)
    task_id = start_task(world, registry)
    with pytest.raises(Crash):
        world.scheduler(registry, worker_id="w0").run_until_idle()
    draft = Draft(actor="user:op")
    draft.cancel(task_id, "stop")
    world.kernel(registry).open(world.storage.task(task_id).session_id).commit(draft)
    limit = crash_past_the_limit(world, registry)
    task = world.storage.task(task_id)
    assert task.outcome["kind"] == "cancelled"
    assert "the cancel handler was interrupted" in task.outcome["error"]
    assert calls.count("on_cancel") == limit + 1


# -- point 3: a cancel's handler waits for the revoked phase; an operator's wake cannot skip it --


def caller(
    after_intent: Callable[[Run], None], on_cancel: Callable[[Run], None] | None = None
) -> Registry:
    """A task that commits its intent, then makes its external call (``after_intent``)."""
    registry = Registry()

    @registry.task("caller")
    class Caller:
        initial = "call"

        def call(self, run: Run) -> Transition:
            run.commit(checkpoint={"intent": True})
            after_intent(run)
            return run.succeed()

        def on_cancel(self, run: Run) -> None:
            if on_cancel is not None:
                on_cancel(run)

    return registry


def test_waking_a_cancel_early_is_refused_until_the_revoked_phase_can_no_longer_call_out(
    world: World,
) -> None:
    seen: dict[str, Any] = {}

    def cancel_then_wake(run: Run) -> None:
        seen["deadline"] = run.deadline(1.0)
        # The operator cancels while the call is out; the operator then tries to wake it.
        handle = world.kernel(registry).open(run.session_id)
        cancel = Draft(actor="user:op")
        cancel.cancel(run.task_id, "stop")
        handle.commit(cancel)
        wake = Draft(actor="user:op")
        wake.wake(run.task_id)
        with pytest.raises(IllegalTransition, match="cancelling"):
            handle.commit(wake)

    registry = caller(cancel_then_wake, lambda run: seen.update(revoked=run.revoked_until))
    task_id = start_task(world, registry, "caller")
    world.scheduler(registry, lease=30.0).run_until_idle()
    task = world.storage.task(task_id)
    assert task.outcome["kind"] == "cancelled"  # woken by its worker: the phase returned
    assert seen["revoked"] is not None
    assert seen["deadline"] <= seen["revoked"] - timedelta(seconds=1)


def test_an_operator_wake_of_a_cancel_waits_for_the_lease_of_a_dead_worker(world: World) -> None:
    def die(run: Run) -> None:
        raise Crash()  # the worker dies inside its external call

    registry = caller(die)
    task_id = start_task(world, registry, "caller")
    with pytest.raises(Crash):
        world.scheduler(registry).run_until_idle()
    session_id = world.storage.task(task_id).session_id
    world.reopen()
    handle = world.kernel(registry).open(session_id)
    cancel = Draft(actor="user:op")
    cancel.cancel(task_id, "stop")
    handle.commit(cancel)
    wake = Draft(actor="user:op")
    wake.wake(task_id)
    with pytest.raises(IllegalTransition, match="cancelling"):
        handle.commit(wake)
    world.clock.advance(31)  # the dead worker's lease has run out: nothing can land now
    wake = Draft(actor="user:op")
    wake.wake(task_id)
    handle.commit(wake)
    world.scheduler(registry, worker_id="w2").run_until_idle()
    assert world.storage.task(task_id).outcome["kind"] == "cancelled"
