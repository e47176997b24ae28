"""A Pydantic AI agent whose tools run on the hands queue (``hands(...)``), on the
reference storage: the turn commits a task per call and waits for it holding no lease;
the task replays the run from the turn's journal and runs only its call. Crashes are
``Crash`` raised where a process would die; a new scheduler resumes from storage alone."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_ai import Agent, ApprovalRequired, CallDeferred, RunContext
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import DeferredToolRequests

from kernel import (
    Draft,
    InMemoryStorage,
    Kernel,
    ManualClock,
    Registry,
    Scheduler,
    Status,
    SubmissionStatus,
    Task,
)
from kernel.agent import approval as approvals
from kernel.agent import submit
from kernel.hosts.pydantic_ai import (
    HANDS,
    SAFE,
    KernelDurability,
    hands,
    register_agent,
    save_partial,
)
from kernel.hosts.pydantic_ai.journal import Journal
from tests.unit.crashes import Crash, CrashPoints, run_across_crashes

HANDS_KIND = "agent-tool:support"


class Ticket(BaseModel):
    customer: str
    notified: bool


@dataclass
class World(CrashPoints):
    """Response 0 calls ``lookup`` (safe, on hands), response 1 calls ``notify``
    (unsafe, on hands), response 2 answers. With ``parallel``, response 0 calls
    ``lookup`` twice and ``note`` (safe, run by the turn itself) in one response."""

    parallel: bool = False
    model_calls: list[int] = field(default_factory=list)
    effects: list[str] = field(default_factory=list)
    seen: list[dict[str, Any]] = field(default_factory=list)
    """At each hands tool's start: the turn's and the running task's state."""
    storage: InMemoryStorage = field(default_factory=InMemoryStorage)
    clock: ManualClock = field(default_factory=ManualClock)
    session_id: str = ""
    during_notify: Callable[[], None] | None = None
    """Called inside ``notify`` once it has saved its partial result."""

    def model(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        step = sum(1 for m in messages if m.kind == "response")
        self.model_calls.append(step)
        parts: list[Any]
        if step == 0 and self.parallel:
            parts = [ToolCallPart("lookup", {"customer": "ana"}, tool_call_id="c1"),
                     ToolCallPart("note", {"text": "looking"}, tool_call_id="c0"),
                     ToolCallPart("lookup", {"customer": "ben"}, tool_call_id="c1b")]
        elif step == 0:
            parts = [ToolCallPart("lookup", {"customer": "ana"}, tool_call_id="c1")]
        elif step == 1:
            parts = [ToolCallPart("notify", {"to": "ana@example.com"}, tool_call_id="c2")]
        else:
            parts = [TextPart("Done."), ToolCallPart(
                info.output_tools[0].name, {"customer": "ana", "notified": True},
                tool_call_id=f"out{step}")]
        return ModelResponse(parts=parts)

    def look(self, call: str) -> None:
        tasks = self.storage.session_tasks(self.session_id)
        (turn,) = [t for t in tasks if t.kind == "agent:support"]
        running = [t for t in tasks if t.status is Status.RUNNING]
        self.seen.append({"call": call, "turn": turn.status, "turn_lease": turn.lease_owner,
                          "running": [(t.kind, t.queue) for t in running]})

    def agent(self) -> Agent[None, Ticket]:
        agent = Agent(FunctionModel(self.model), name="support", output_type=Ticket,
                      capabilities=[KernelDurability()])
        world = self

        @agent.tool_plain(metadata=hands(SAFE))
        def lookup(customer: str) -> str:
            world.look(f"lookup:{customer}")
            world.effects.append(f"lookup:{customer}")
            world.maybe_crash(f"lookup:{customer}")
            return f"{customer} <{customer}@example.com>"

        @agent.tool(metadata=HANDS)
        def notify(ctx: RunContext[Any], to: str) -> str:
            world.look("notify")
            world.effects.append(f"notify:{to}")
            save_partial(ctx, {"sent": [to]})
            if world.during_notify is not None:
                world.during_notify()
            world.maybe_crash("notify")
            return f"sent to {to}"

        @agent.tool_plain(metadata=SAFE)
        def note(text: str) -> str:
            world.effects.append(f"note:{text}")
            return "noted"

        return agent

    def kernel(self) -> Kernel:
        registry = Registry()
        register_agent(registry, "support", self.agent())
        return Kernel(self.storage, registry, self.clock)

    def run(self, crashes_allowed: int = 0) -> int:
        return run_across_crashes(self.kernel, self.clock, crashes_allowed=crashes_allowed,
                                  advance_clock=True)

    def start(self) -> tuple[Kernel, str, str]:
        kernel = self.kernel()
        handle = kernel.create_session()
        self.session_id = handle.id
        draft = Draft()
        conversation = draft.create_conversation()
        handle.commit(draft)
        submitted = submit(handle, conversation, {"text": "Notify ana", "agent": "support"},
                           "req-1")
        assert submitted.submission is not None
        return kernel, conversation, submitted.submission.id

    def tasks(self, kind: str) -> list[Task]:
        return [t for t in self.storage.session_tasks(self.session_id) if t.kind == kind]

    def turn(self) -> Task:
        (turn,) = self.tasks("agent:support")
        return turn


def results(kernel: Kernel, conversation: str) -> dict[str, Any]:
    return {e.payload["call_id"]: e.payload for e in kernel.entries(conversation)
            if e.kind == "tool_result"}


def test_each_hands_call_is_a_task_on_hands_while_the_turn_waits_holding_no_lease() -> None:
    world = World()
    kernel, conversation, submission = world.start()
    world.run()
    # While each call ran, the turn waited and held no lease; its task ran on hands.
    assert world.seen == [
        {"call": "lookup:ana", "turn": Status.WAITING, "turn_lease": None,
         "running": [(HANDS_KIND, "hands")]},
        {"call": "notify", "turn": Status.WAITING, "turn_lease": None,
         "running": [(HANDS_KIND, "hands")]},
    ]
    assert world.model_calls == [0, 1, 2]  # no committed response is requested again
    assert world.effects == ["lookup:ana", "notify:ana@example.com"]
    stored = kernel.storage.submission(submission)
    assert stored is not None and stored.status is SubmissionStatus.ANSWERED
    turn = world.turn()
    assert turn.outcome is not None and turn.outcome["kind"] == "succeeded"
    assert turn.outcome["result"]["output"] == {"customer": "ana", "notified": True}
    children = world.tasks(HANDS_KIND)
    assert [(t.queue, t.parent_id, t.input["call"]["id"], (t.outcome or {}).get("kind"))
            for t in children] == [("hands", turn.id, "c1", "succeeded"),
                                   ("hands", turn.id, "c2", "succeeded")]
    found = results(kernel, conversation)
    assert found["c1"]["replay"] == "safe" and found["c1"]["turn"] == turn.id
    assert found["c2"]["replay"] == "unsafe" and found["c2"]["result"] == "sent to ana@example.com"
    # The unsafe call's intent was the hands task's, not the turn's; its result was
    # committed with the task's end, which keeps the checkpoint as it was (an ended
    # task's is not read again: run again, the task finds the result first).
    notify = next(t for t in children if t.input["call"]["id"] == "c2")
    assert list(notify.checkpoint.get("intents")) == ["c2"]
    assert "intents" not in turn.checkpoint or turn.checkpoint["intents"] == {}


def hands_commits(kernel: Kernel, task: Task) -> list[list[str]]:
    """What each commit a hands task made wrote: its entries' and documents' kinds, and
    ``running`` (the task went on after it: an intent, a partial result) or ``end``."""
    written = []
    for commit in kernel.storage.commits_after(task.session_id, 0, 1000):
        if commit.actor != f"task:{task.id}":
            continue
        shown = []
        for item in commit.summary:
            if item.get("type") in ("entry", "document"):
                shown.append(item["kind"])
            elif item.get("type") == "task" and item.get("id") == task.id:
                shown.append("end" if item.get("status") == "terminal" else "running")
        written.append(sorted(shown))
    return written


def test_a_safe_hands_call_costs_its_task_one_commit_and_an_unsafe_one_two() -> None:
    """The safe call's result joins its task's end; the unsafe call commits its intent
    before it starts, and its result joins its task's end (``notify`` saves a partial
    result in between: a commit of its own). The turn wakes on that end, so the result
    is durable before the brain goes on."""
    world = World()
    kernel, conversation, submission = world.start()
    world.run()
    lookup, notify = world.tasks(HANDS_KIND)
    assert hands_commits(kernel, lookup) == [["end", "tool_result"]]
    assert hands_commits(kernel, notify) == [
        ["running"], ["agent-progress", "running"], ["end", "tool_result"]]
    assert world.effects == ["lookup:ana", "notify:ana@example.com"]


def test_parallel_calls_get_a_task_each_and_the_turn_runs_its_own_call_meanwhile() -> None:
    world = World(parallel=True)
    kernel, conversation, submission = world.start()
    world.run()
    assert world.model_calls == [0, 1, 2]
    assert sorted(world.effects) == sorted(["lookup:ana", "lookup:ben", "note:looking",
                                            "notify:ana@example.com"])
    turn = world.turn()
    assert turn.outcome is not None and turn.outcome["kind"] == "succeeded", turn.outcome
    first = [t for t in world.tasks(HANDS_KIND) if t.input["call"]["name"] == "lookup"]
    assert sorted(t.input["call"]["id"] for t in first) == ["c1", "c1b"]
    found = results(kernel, conversation)
    assert found["c1b"]["result"] == "ben <ben@example.com>"
    assert found["c0"]["result"] == "noted" and "hands" not in found["c0"]
    # Both lookups' results reached the model together, as their calls were made.
    answered = [e.payload for e in kernel.entries(conversation) if e.kind == "model_response"]
    assert len(answered) == 3


def test_a_hands_task_killed_during_an_unsafe_call_leaves_it_uncertain_not_called_again() -> None:
    world = World(crash_on={"notify"})
    kernel, conversation, submission = world.start()
    world.run(crashes_allowed=1)
    (_, notify) = world.tasks(HANDS_KIND)
    assert notify.status is Status.WAITING and notify.wait == {"signal": "resolution:c2:1"}
    assert [d.name for d in kernel.registry.decisions(notify)] == [
        "happened", "run_again", "not_done"]
    turn = world.turn()
    assert turn.status is Status.WAITING and turn.lease_owner is None
    assert world.effects.count("notify:ana@example.com") == 1
    draft = Draft(actor="user:op")
    draft.signal(notify.id, "resolution:c2:1",
                 {"decision": "happened", "by": "user:op", "reason": "seen in the outbox",
                  "receipt": {"result": "sent (checked)"}}, step_epoch=notify.epoch)
    kernel.open(world.session_id).commit(draft)
    world.run()
    assert world.effects.count("notify:ana@example.com") == 1
    assert world.model_calls == [0, 1, 2]
    stored = kernel.storage.submission(submission)
    assert stored is not None and stored.status is SubmissionStatus.ANSWERED
    found = results(kernel, conversation)
    assert found["c2"]["result"] == "sent (checked)" and found["c2"]["resolved"]["by"] == "user:op"


def test_a_hands_task_killed_after_its_unsafe_call_returned_leaves_it_uncertain(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Killed once the call returned, before the commit that records its result and
    ends the task: the call may have taken effect and nothing says how, so it is an
    uncertain step of the hands task, as when killed during the call."""
    world = World()
    record = Journal.record_result

    def dies_before_notify_is_recorded(journal: Journal, call_id: str, *args: Any,
                                       **kwargs: Any) -> None:
        if call_id == "c2" and journal.run.task.kind == HANDS_KIND:
            monkeypatch.setattr(Journal, "record_result", record)
            raise Crash()
        record(journal, call_id, *args, **kwargs)

    monkeypatch.setattr(Journal, "record_result", dies_before_notify_is_recorded)
    kernel, conversation, submission = world.start()
    assert world.run(crashes_allowed=1) == 1
    (_, notify) = world.tasks(HANDS_KIND)
    assert notify.status is Status.WAITING and notify.wait == {"signal": "resolution:c2:1"}
    assert "c2" not in results(kernel, conversation)
    assert world.turn().status is Status.WAITING
    draft = Draft(actor="user:op")
    draft.signal(notify.id, "resolution:c2:1",
                 {"decision": "happened", "by": "user:op", "reason": "in the outbox"},
                 step_epoch=notify.epoch)
    kernel.open(world.session_id).commit(draft)
    world.run()
    assert world.effects.count("notify:ana@example.com") == 1
    stored = kernel.storage.submission(submission)
    assert stored is not None and stored.status is SubmissionStatus.ANSWERED


def test_a_safe_hands_call_cut_midway_runs_again_in_its_task() -> None:
    world = World(crash_on={"lookup:ana"})
    kernel, conversation, submission = world.start()
    world.run(crashes_allowed=1)
    assert world.effects.count("lookup:ana") == 2
    assert world.model_calls == [0, 1, 2]
    assert len(world.tasks(HANDS_KIND)) == 2  # the same task ran the call again
    stored = kernel.storage.submission(submission)
    assert stored is not None and stored.status is SubmissionStatus.ANSWERED


def test_a_hands_task_that_ends_without_a_result_is_answered_as_failed() -> None:
    world = World(crash_on={"notify"})
    kernel, conversation, submission = world.start()
    world.run(crashes_allowed=1)
    (_, notify) = world.tasks(HANDS_KIND)
    draft = Draft(actor="user:op")
    draft.cancel(notify.id, "wrong recipient")
    kernel.open(world.session_id).commit(draft)
    world.run()
    assert world.effects.count("notify:ana@example.com") == 1
    found = results(kernel, conversation)
    assert "cancelled" in found["c2"]["error"], found["c2"]
    # What the call had saved before it was cut reaches the model with the failure.
    assert found["c2"]["partial"] == {"sent": ["ana@example.com"]}
    assert "ana@example.com" in found["c2"]["error"] and found["c2"]["replay"] == "unsafe"
    assert world.model_calls == [0, 1, 2]
    turn = world.turn()
    assert turn.outcome is not None and turn.outcome["kind"] == "succeeded", turn.outcome


def test_cancelling_the_turn_cancels_its_hands_task_and_leaves_the_call_cancelled() -> None:
    world = World(crash_on={"notify"})
    kernel, conversation, submission = world.start()
    world.run(crashes_allowed=1)
    turn = world.turn()
    draft = Draft(actor="user:olga")
    draft.cancel(turn.id, "wrong customer")
    kernel.open(world.session_id).commit(draft)
    world.run()
    (_, notify) = world.tasks(HANDS_KIND)
    assert (notify.outcome or {}).get("kind") == "cancelled"
    assert (world.turn().outcome or {}).get("kind") == "cancelled"
    card = results(kernel, conversation)["c2"]
    assert card["cancelled"] is True and card["reason"] == "wrong customer"
    assert card["partial"] == {"sent": ["ana@example.com"]}  # saved by the hands task
    assert world.effects.count("notify:ana@example.com") == 1
    stored = kernel.storage.submission(submission)
    assert stored is not None and stored.status is SubmissionStatus.CANCELLED


@dataclass
class Billing:
    """Response 0 calls ``pay`` (approval required, on hands) and ``refund`` (on hands,
    asks for approval from its body above 10); response 1 answers."""

    effects: list[str] = field(default_factory=list)
    requests: int = 0
    storage: InMemoryStorage = field(default_factory=InMemoryStorage)
    clock: ManualClock = field(default_factory=ManualClock)

    def model(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.requests += 1
        if not any(m.kind == "response" for m in messages):
            return ModelResponse(parts=[
                ToolCallPart("pay", {"amount": 5}, tool_call_id="c2"),
                ToolCallPart("refund", {"amount": 50}, tool_call_id="c3"),
            ])
        return ModelResponse(parts=[TextPart("Done.")])

    def kernel(self) -> Kernel:
        agent = Agent(FunctionModel(self.model), name="billing",
                      output_type=[str, DeferredToolRequests],
                      capabilities=[KernelDurability()])
        world = self

        @agent.tool_plain(requires_approval=True, metadata=HANDS)
        def pay(amount: int) -> str:
            world.effects.append(f"pay:{amount}")
            return f"paid {amount}"

        @agent.tool(metadata=HANDS)
        def refund(ctx: RunContext[Any], amount: int) -> str:
            if amount > 10 and not ctx.tool_call_approved:
                raise ApprovalRequired(metadata={"reason": f"{amount} is more than 10"})
            world.effects.append(f"refund:{amount}")
            return f"refunded {amount}"

        registry = Registry()
        register_agent(registry, "billing", agent, approval_timeout=600)
        return Kernel(self.storage, registry, self.clock)


def test_a_hands_call_that_asks_for_approval_waits_on_the_gate_then_runs_on_hands() -> None:
    world = Billing()
    kernel = world.kernel()
    handle = kernel.create_session()
    draft = Draft()
    conversation = draft.create_conversation()
    handle.commit(draft)
    submit(handle, conversation, {"text": "Settle ana", "agent": "billing"}, "req-1")
    Scheduler(world.kernel(), "w").run_until_idle()
    in_session = kernel.storage.session_tasks(handle.id)
    (turn,) = [t for t in in_session if t.kind == "agent:billing"]
    assert turn.status is Status.WAITING and turn.lease_owner is None
    asked = {t.input["call"]["id"]: t for t in in_session if t.kind == approvals.TASK_KIND}
    assert sorted(asked) == ["c2", "c3"] and world.effects == []
    for task in asked.values():
        decided = Draft(actor="user:olga")
        approvals.decide(decided, task.id, "approve", by="user:olga", reason="ok",
                         seen=task.checkpoint["approval"]["digest"])
        kernel.open(handle.id).commit(decided)
    Scheduler(world.kernel(), "w").run_until_idle()
    assert sorted(world.effects) == ["pay:5", "refund:50"]
    assert world.requests == 2
    in_session = kernel.storage.session_tasks(handle.id)
    (turn,) = [t for t in in_session if t.kind == "agent:billing"]
    assert turn.outcome is not None and turn.outcome["result"]["output"] == "Done."
    # refund asked from its body in a hands task; after the decisions each call ran in
    # a hands task of the next segment.
    ran = sorted((t.input["call"]["id"], t.input["replay"].get("segment", 0))
                 for t in in_session if t.kind == "agent-tool:billing")
    assert ran == [("c2", 1), ("c3", 0), ("c3", 1)]
    shown = results(kernel, conversation)
    assert shown["c2"]["result"] == "paid 5" and shown["c2"]["approval"]["by"] == "user:olga"
    assert shown["c3"]["result"] == "refunded 50"


def test_in_a_phase_inside_a_running_loop_the_hands_calls_go_the_same_way() -> None:
    """The agent's loop on a thread of its own (the phase's thread runs a loop): the turn
    still stops at its call and waits, and the hands task still runs only its call."""
    world = World(crash_on={"notify"})
    kernel, conversation, submission = world.start()

    async def inside() -> None:
        world.run(crashes_allowed=1)  # blocks this loop: the agent's needs another

    asyncio.run(inside())
    (_, notify) = world.tasks(HANDS_KIND)
    assert notify.status is Status.WAITING and notify.wait == {"signal": "resolution:c2:1"}
    assert world.seen[0]["turn"] is Status.WAITING and world.seen[0]["turn_lease"] is None
    draft = Draft(actor="user:op")
    draft.signal(notify.id, "resolution:c2:1",
                 {"decision": "not_done", "by": "user:op", "reason": "bounced"},
                 step_epoch=notify.epoch)
    kernel.open(world.session_id).commit(draft)
    asyncio.run(inside())
    assert world.effects.count("notify:ana@example.com") == 1
    assert world.model_calls == [0, 1, 2]
    assert "did not take effect" in results(kernel, conversation)["c2"]["error"]
    stored = kernel.storage.submission(submission)
    assert stored is not None and stored.status is SubmissionStatus.ANSWERED


def test_a_turn_cancelled_while_its_hands_task_runs_the_call_ends_both() -> None:
    world = World()

    def cancel_the_turn() -> None:
        draft = Draft(actor="user:olga")
        draft.cancel(world.turn().id, "wrong list")
        world.kernel().open(world.session_id).commit(draft)

    world.during_notify = cancel_the_turn
    kernel, conversation, submission = world.start()
    for _ in range(3):  # the cancelled task's next commit is refused: its worker moves on
        try:
            world.run()
            break
        except Exception:
            continue
    (_, notify) = world.tasks(HANDS_KIND)
    assert (notify.outcome or {}).get("kind") == "cancelled"
    assert (world.turn().outcome or {}).get("kind") == "cancelled"
    card = results(kernel, conversation)["c2"]
    assert card["cancelled"] is True and card["by"] == "user:olga"
    assert card["partial"] == {"sent": ["ana@example.com"]}
    assert world.effects.count("notify:ana@example.com") == 1
    stored = kernel.storage.submission(submission)
    assert stored is not None and stored.status is SubmissionStatus.CANCELLED


@dataclass
class Courier(CrashPoints):
    """Response 0 calls ``ship`` (on hands, with ``policy``), whose body hands the parcel
    to the warehouse and defers the call's result to it (``CallDeferred``); response 1
    answers with what the call returned."""

    policy: dict[str, Any]
    shipped: list[str] = field(default_factory=list)
    told: list[Any] = field(default_factory=list)
    storage: InMemoryStorage = field(default_factory=InMemoryStorage)
    clock: ManualClock = field(default_factory=ManualClock)
    session_id: str = ""

    def model(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if not any(m.kind == "response" for m in messages):
            return ModelResponse(parts=[ToolCallPart("ship", {"parcel": "p1"},
                                                     tool_call_id="c9")])
        self.maybe_crash("model:1")
        self.told.append({p.tool_call_id: p.content for m in messages
                          if isinstance(m, ModelRequest) for p in m.parts
                          if isinstance(p, ToolReturnPart | RetryPromptPart)}.get("c9"))
        return ModelResponse(parts=[TextPart("Done.")])

    def kernel(self) -> Kernel:
        agent = Agent(FunctionModel(self.model), name="courier",
                      output_type=[str, DeferredToolRequests],
                      capabilities=[KernelDurability()])
        world = self

        @agent.tool_plain(metadata=hands(self.policy))
        def ship(parcel: str) -> str:
            world.shipped.append(parcel)
            raise CallDeferred(metadata={"parcel": parcel})

        registry = Registry()
        register_agent(registry, "courier", agent)
        return Kernel(self.storage, registry, self.clock)

    def start(self) -> tuple[Kernel, str, str]:
        kernel = self.kernel()
        handle = kernel.create_session()
        self.session_id = handle.id
        draft = Draft()
        conversation = draft.create_conversation()
        handle.commit(draft)
        submitted = submit(handle, conversation, {"text": "Ship p1", "agent": "courier"}, "r")
        assert submitted.submission is not None
        return kernel, conversation, submitted.submission.id

    def tasks(self, kind: str) -> list[Task]:
        return [t for t in self.storage.session_tasks(self.session_id) if t.kind == kind]


@pytest.mark.parametrize("policy", [HANDS, hands(SAFE)], ids=["unsafe", "safe"])
@pytest.mark.parametrize(("decision", "receipt", "told"), [
    ("happened", {"result": "delivered to ana"}, "delivered to ana"),
    ("not_done", None, "The call did not take effect: the van broke down"),
])
def test_a_hands_call_deferred_outside_waits_on_the_turn_as_a_brain_call_would(
    policy: dict[str, Any], decision: str, receipt: Any, told: str
) -> None:
    """``CallDeferred`` raised in a hands task: its task ends, and the call becomes the
    turn's wait for its result from outside (``resolution:<call id>:external``), the same
    wait a call the turn ran itself would be; the result recorded there reaches the model
    as the call's return, and the tool's body is not run again."""
    world = Courier(policy, crash_on={"model:1"})
    kernel, conversation, submission = world.start()
    Scheduler(world.kernel(), "w").run_until_idle()
    (turn,) = world.tasks("agent:courier")
    assert turn.status is Status.WAITING and turn.lease_owner is None
    assert turn.wait == {"signal": "resolution:c9:external"}
    (task,) = world.tasks("agent-tool:courier")
    assert (task.outcome or {}).get("kind") == "succeeded" and task.lease_owner is None
    assert not task.checkpoint.get("intents")  # deferred, nothing took effect: not uncertain
    assert world.shipped == ["p1"] and "c9" not in results(kernel, conversation)

    draft = Draft(actor="user:olga")
    payload: dict[str, Any] = {"decision": decision, "by": "user:olga",
                               "reason": "the van broke down"}
    if receipt is not None:
        payload["receipt"] = receipt
    draft.signal(turn.id, "resolution:c9:external", payload, step_epoch=turn.epoch)
    kernel.open(world.session_id).commit(draft)
    # The brain dies asking the model after the result: the run goes on from the
    # committed decision, which the framework is given again, not the tool.
    assert run_across_crashes(world.kernel, world.clock, crashes_allowed=1,
                              advance_clock=True) == 1

    assert world.told == [told]
    assert world.shipped == ["p1"]  # the body ran once, in its hands task
    assert len(world.tasks("agent-tool:courier")) == 1
    (turn,) = world.tasks("agent:courier")
    assert turn.outcome is not None and turn.outcome["result"]["output"] == "Done.", turn.outcome
    stored = kernel.storage.submission(submission)
    assert stored is not None and stored.status is SubmissionStatus.ANSWERED
    shown = results(kernel, conversation)["c9"]
    assert shown["resolved"]["by"] == "user:olga"


def test_a_hands_task_is_blocked_where_its_own_tool_changed_and_runs_where_another_did() -> None:
    """A hands task needs the one tool its call was made for, as the turn recorded it."""
    from kernel import Worker
    from kernel.environment import BLOCKED_DOCUMENT

    world = World()
    kernel, conversation, submission = world.start()
    assert Worker(kernel, "w1").advance(world.turn().id)  # spawns lookup's task, waits
    (task,) = world.tasks(HANDS_KIND)
    assert task.input["call"]["name"] == "lookup"

    def deployed(lookup: Callable[..., str], notify: Callable[..., str]) -> Kernel:
        agent = Agent(FunctionModel(world.model), name="support", output_type=Ticket,
                      capabilities=[KernelDurability()])
        agent.tool_plain(lookup, name="lookup", metadata=hands(SAFE))
        agent.tool_plain(notify, name="notify", metadata=HANDS)
        agent.tool_plain(lambda text: "noted", name="note", metadata=SAFE)
        registry = Registry()
        register_agent(registry, "support", agent)
        return Kernel(world.storage, registry, world.clock)

    def lookup(customer: str) -> str:
        world.effects.append(f"lookup:{customer}")
        return f"{customer} <{customer}@example.com>"

    def lookup_by_region(customer: str, region: str) -> str:
        return customer

    def notify_cc(to: str, cc: str) -> str:
        return to

    changed = deployed(lookup_by_region, notify_cc)
    assert not Worker(changed, "w2").advance(task.id)
    (difference,) = changed.document(world.session_id, BLOCKED_DOCUMENT, task.id)["differences"]
    assert difference.startswith("tool lookup: parameters ")
    assert world.effects == []

    assert Worker(deployed(lookup, notify_cc), "w3").advance(task.id)
    assert world.effects == ["lookup:ana"]
    assert kernel.task(task.id).status is Status.TERMINAL


def test_a_hands_call_whose_tool_raises_fails_its_task_with_the_tools_error() -> None:
    """The tool raises in its hands task: the task fails with the tool's error, which
    the model is told as the call's failure (not that the replay missed the call)."""
    told: list[dict[str, Any]] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if sum(1 for m in messages if m.kind == "response") == 0:
            return ModelResponse(parts=[ToolCallPart("fetch", {"url": "u"}, tool_call_id="c1")])
        told.append({p.tool_call_id: p.content for m in messages if isinstance(m, ModelRequest)
                     for p in m.parts if isinstance(p, ToolReturnPart)})
        return ModelResponse(parts=[TextPart("Done.")])

    agent = Agent(FunctionModel(model), name="support", capabilities=[KernelDurability()])

    @agent.tool_plain(metadata=hands(SAFE))
    def fetch(url: str) -> str:
        raise ValueError("disk full")

    registry = Registry()
    register_agent(registry, "support", agent)
    world = World()
    kernel = Kernel(world.storage, registry, world.clock)
    handle = kernel.create_session()
    world.session_id = handle.id
    draft = Draft()
    conversation = draft.create_conversation()
    handle.commit(draft)
    submit(handle, conversation, {"text": "Fetch u", "agent": "support"}, "r")
    Scheduler(kernel, "w").run_until_idle()
    (task,) = world.tasks(HANDS_KIND)
    assert task.outcome is not None and task.outcome["error"] == "ValueError: disk full"
    assert told == [{"c1": "The call's task on the hands queue failed: ValueError: disk full"}]
