"""Pydantic AI's deferred tools on the kernel's approval gate, on the reference storage:
a call that needs approval ends the run's segment, waits in an approval task (the gate's
record, holding no worker) and goes on with the operator's decision as the framework
takes it: approved, the tool runs once (with edited arguments if given); denied, the
model gets the reason as the call's return."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from pydantic_ai import Agent, ApprovalRequired, CallDeferred, RunContext
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
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
from kernel.hosts.pydantic_ai import SAFE, KernelDurability, register_agent
from tests.unit.crashes import CrashPoints, run_across_crashes


@dataclass
class World(CrashPoints):
    requests: list[list[ModelMessage]] = field(default_factory=list)
    effects: list[str] = field(default_factory=list)
    storage: InMemoryStorage = field(default_factory=InMemoryStorage)
    clock: ManualClock = field(default_factory=ManualClock)
    output_type: Any = field(default_factory=lambda: [str, DeferredToolRequests])

    def model(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.requests.append(list(messages))
        step = sum(1 for m in messages if m.kind == "response")
        self.maybe_crash(f"model:{step}")
        if step == 0:
            return ModelResponse(parts=[
                ToolCallPart("lookup", {"customer": "ana"}, tool_call_id="c1"),
                ToolCallPart("pay", {"amount": 5}, tool_call_id="c2"),
                ToolCallPart("refund", {"amount": 50}, tool_call_id="c3"),
            ])
        return ModelResponse(parts=[TextPart("Done.")])

    def agent(self) -> Agent[None, Any]:
        agent = Agent(FunctionModel(self.model), name="billing",
                      output_type=self.output_type,
                      capabilities=[KernelDurability()])
        world = self

        @agent.tool_plain(metadata=SAFE)
        def lookup(customer: str) -> str:
            world.effects.append(f"lookup:{customer}")
            return f"{customer} owes 5"

        @agent.tool_plain(requires_approval=True)
        def pay(amount: int) -> str:
            world.effects.append(f"pay:{amount}")
            world.maybe_crash("pay")
            return f"paid {amount}"

        @agent.tool
        def refund(ctx: RunContext[None], amount: int) -> str:
            if amount > 10 and not ctx.tool_call_approved:
                raise ApprovalRequired(metadata={"reason": f"{amount} is more than 10"})
            world.effects.append(f"refund:{amount}")
            return f"refunded {amount}"

        return agent

    def kernel(self) -> Kernel:
        registry = Registry()
        register_agent(registry, "billing", self.agent(), approval_timeout=600)
        return Kernel(self.storage, registry, self.clock)

    def run(self, crashes_allowed: int = 0) -> int:
        # After a crash, the dead worker's lease ends before the next one starts.
        return run_across_crashes(self.kernel, self.clock, crashes_allowed=crashes_allowed,
                                  advance_clock=False, lease_lapse=timedelta(minutes=5))

    def start(self) -> tuple[Kernel, str, str, str]:
        kernel = self.kernel()
        handle = kernel.create_session()
        draft = Draft()
        conversation = draft.create_conversation()
        handle.commit(draft)
        submitted = submit(handle, conversation, {"text": "Settle ana", "agent": "billing"},
                           "req-1")
        assert submitted.submission is not None
        return kernel, handle.id, conversation, submitted.submission.id


def tasks(kernel: Kernel, session_id: str, kind: str) -> list[Task]:
    return [t for t in kernel.storage.session_tasks(session_id) if t.kind == kind]


def asked(kernel: Kernel, session_id: str) -> dict[str, Task]:
    return {t.input["call"]["id"]: t for t in tasks(kernel, session_id, approvals.TASK_KIND)}


def decide(kernel: Kernel, task: Task, decision: str, reason: str, **kw: Any) -> None:
    draft = Draft(actor="user:olga")
    approvals.decide(draft, task.id, decision, by="user:olga", reason=reason,
                     seen=task.checkpoint["approval"]["digest"], **kw)
    kernel.open(task.session_id).commit(draft)


def results(kernel: Kernel, conversation: str) -> dict[str, Any]:
    return {e.payload["call_id"]: e.payload for e in kernel.entries(conversation)
            if e.kind == "tool_result"}


def returns(messages: list[ModelMessage]) -> dict[str, Any]:
    return {p.tool_call_id: p.content for m in messages if isinstance(m, ModelRequest)
            for p in m.parts if isinstance(p, ToolReturnPart)}


def test_deferred_calls_wait_on_the_gate_holding_no_worker_then_run_as_decided() -> None:
    world = World()
    kernel, session_id, conversation, submission = world.start()
    world.run()
    (turn,) = tasks(kernel, session_id, "agent:billing")
    assert turn.status is Status.WAITING and turn.lease_owner is None
    waiting = asked(kernel, session_id)
    assert sorted(waiting) == ["c2", "c3"]
    assert world.effects == ["lookup:ana"]  # the safe call ran; the asked ones did not
    for task in waiting.values():
        requested = approvals.pending(task)
        assert requested is not None and task.lease_owner is None
        assert requested["who"] == approvals.WHO
    assert approvals.pending(waiting["c2"])["arguments"] == {"amount": 5}
    assert approvals.pending(waiting["c2"])["parameters"]["properties"]["amount"]
    assert approvals.pending(waiting["c3"])["why"] == "50 is more than 10"

    decide(kernel, waiting["c2"], "approve", "invoice checked", arguments={"amount": 4})
    world.run()
    assert tasks(kernel, session_id, "agent:billing")[0].status is Status.WAITING
    assert world.effects == ["lookup:ana"]  # nothing runs until every call is decided
    decide(kernel, waiting["c3"], "deny", "refunds go through finance")
    world.run()

    assert world.effects == ["lookup:ana", "pay:4"]
    told = returns(world.requests[-1])
    assert told["c2"] == "paid 4"
    assert told["c3"] == "The tool call was denied: refunds go through finance"
    stored = kernel.storage.submission(submission)
    assert stored is not None and stored.status is SubmissionStatus.ANSWERED
    (turn,) = tasks(kernel, session_id, "agent:billing")
    assert turn.outcome["result"]["output"] == "Done."
    assert turn.outcome["result"]["usage"]["requests"] == 2  # over both segments
    shown = results(kernel, conversation)
    assert shown["c2"]["approval"]["by"] == "user:olga"
    assert shown["c2"]["approval"]["edited"] is True and shown["c2"]["result"] == "paid 4"
    assert shown["c3"]["denied"] is True and "finance" in shown["c3"]["error"]
    assert len(world.requests) == 2  # the first response was not requested again


def test_a_crash_during_the_approved_unsafe_call_makes_it_uncertain_not_run_twice() -> None:
    world = World(crash_on={"pay"})
    kernel, session_id, conversation, submission = world.start()
    world.run()
    waiting = asked(kernel, session_id)
    decide(kernel, waiting["c2"], "approve", "ok")
    decide(kernel, waiting["c3"], "approve", "ok")
    world.run(crashes_allowed=1)
    (turn,) = tasks(kernel, session_id, "agent:billing")
    assert turn.status is Status.WAITING and turn.wait == {"signal": "resolution:c2:1"}
    assert world.effects.count("pay:5") == 1


def test_a_crash_after_the_decisions_goes_on_from_the_committed_segment() -> None:
    world = World(crash_on={"model:1"})
    kernel, session_id, conversation, submission = world.start()
    world.run()
    for task in asked(kernel, session_id).values():
        decide(kernel, task, "approve", "ok")
    assert world.run(crashes_allowed=1) == 1
    assert sorted(world.effects) == ["lookup:ana", "pay:5", "refund:50"]
    stored = kernel.storage.submission(submission)
    assert stored is not None and stored.status is SubmissionStatus.ANSWERED


def test_a_turn_that_may_end_with_deferred_calls_is_blocked_where_its_agent_may_not() -> None:
    """A turn whose agent's output allows deferred calls records so: taken over by a
    worker whose agent's output no longer lists ``DeferredToolRequests``, the next call
    that needs approval would fail the turn where it waited for an operator (and a
    segment cut between its deferred calls and their commit would fail on its replay),
    so the turn is blocked, naming it, and its decisions wait to be applied."""
    from kernel import Worker
    from kernel.environment import BLOCKED_DOCUMENT

    world = World()
    kernel, session_id, conversation, submission = world.start()
    world.run()
    for task in asked(kernel, session_id).values():
        decide(kernel, task, "approve", "ok")
        assert Worker(kernel, "w1").advance(task.id)  # it ends; the turn is woken
    (turn,) = tasks(kernel, session_id, "agent:billing")
    assert turn.status is Status.PENDING

    world.output_type = str
    changed = world.kernel()
    assert not Worker(changed, "w2").advance(turn.id)
    (difference,) = changed.document(session_id, BLOCKED_DOCUMENT, turn.id)["differences"]
    assert difference == ("output ends with deferred calls: missing here (it was started "
                          "with allowed)")
    assert world.effects == ["lookup:ana"] and len(world.requests) == 1

    world.output_type = [str, DeferredToolRequests]
    world.run()
    assert sorted(world.effects) == ["lookup:ana", "pay:5", "refund:50"]


def test_the_timeout_denies_a_deferred_call() -> None:
    world = World()
    kernel, session_id, conversation, submission = world.start()
    world.run()
    world.clock.advance(timedelta(seconds=601))
    world.run()
    told = returns(world.requests[-1])
    assert told["c2"] == "The tool call was denied: no operator decided within 600 s"
    assert world.effects == ["lookup:ana"]


def test_an_approval_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="approval_timeout"):
        register_agent(Registry(), "billing", World().agent(), approval_timeout=0)


@pytest.mark.parametrize(("decision", "receipt", "told"), [
    ("happened", {"result": "shipped by the warehouse"}, "shipped by the warehouse"),
    ("not_done", None, "The call did not take effect: the warehouse is closed"),
])
def test_a_call_deferred_outside_waits_for_its_result_as_a_resolution(
    decision: str, receipt: Any, told: str
) -> None:
    """``CallDeferred``: the turn waits, holding no worker (after the approvals), on the
    call's resolution; what the operator (or a program) records reaches the model as
    the call's result, as Pydantic AI's ``DeferredToolResults.calls`` carries it."""
    world = World()

    def ship(parcel: str) -> str:
        raise CallDeferred(metadata={"parcel": parcel})

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        world.requests.append(list(messages))
        if sum(1 for m in messages if m.kind == "response") == 0:
            return ModelResponse(parts=[ToolCallPart("ship", {"parcel": "p1"},
                                                     tool_call_id="c9")])
        return ModelResponse(parts=[TextPart("Done.")])

    registry = Registry()
    register_agent(registry, "billing",
                   Agent(FunctionModel(model), name="billing", output_type=[str,
                         DeferredToolRequests], capabilities=[KernelDurability()],
                         tools=[ship]))
    kernel = Kernel(world.storage, registry, world.clock)
    handle = kernel.create_session()
    draft = Draft()
    conversation = draft.create_conversation()
    handle.commit(draft)
    submitted = submit(handle, conversation, {"text": "Ship p1", "agent": "billing"}, "r")
    assert submitted.submission is not None
    Scheduler(kernel, "w").run_until_idle()
    (turn,) = tasks(kernel, handle.id, "agent:billing")
    assert turn.status is Status.WAITING and turn.lease_owner is None
    assert turn.wait == {"signal": "resolution:c9:external"}
    draft = Draft(actor="user:olga")
    payload: dict[str, Any] = {"decision": decision, "by": "user:olga",
                               "reason": "the warehouse is closed"}
    if receipt is not None:
        payload["receipt"] = receipt
    draft.signal(turn.id, "resolution:c9:external", payload, step_epoch=turn.epoch)
    kernel.open(handle.id).commit(draft)
    Scheduler(kernel, "w").run_until_idle()
    assert returns(world.requests[-1])["c9"] == told
    (turn,) = tasks(kernel, handle.id, "agent:billing")
    assert turn.outcome is not None and turn.outcome["result"]["output"] == "Done."
    shown = results(kernel, conversation)["c9"]
    assert shown["resolved"]["by"] == "user:olga"



def pays_twice(world: World) -> tuple[Kernel, str, str]:
    """An agent whose approved call leads it to a second call that needs approval (two
    rounds of approvals in one turn), submitted: the kernel, session and conversation."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        world.requests.append(list(messages))
        step = sum(1 for m in messages if m.kind == "response")
        if step < 2:
            return ModelResponse(parts=[ToolCallPart("pay", {"amount": step + 1},
                                                     tool_call_id=f"c{step + 1}")])
        return ModelResponse(parts=[TextPart("Done.")])

    agent = Agent(FunctionModel(model), name="billing", output_type=[str, DeferredToolRequests],
                  capabilities=[KernelDurability()])

    @agent.tool_plain(requires_approval=True)
    def pay(amount: int) -> str:
        world.effects.append(f"pay:{amount}")
        return f"paid {amount}"

    registry = Registry()
    register_agent(registry, "billing", agent)
    kernel = Kernel(world.storage, registry, world.clock)
    handle = kernel.create_session()
    draft = Draft()
    conversation = draft.create_conversation()
    handle.commit(draft)
    submitted = submit(handle, conversation, {"text": "Pay twice", "agent": "billing"}, "r")
    assert submitted.submission is not None
    return kernel, handle.id, conversation


def test_a_second_round_of_approvals_in_one_turn_is_given_only_its_own_decisions() -> None:
    """A call approved in the turn's second segment makes another one that needs
    approval: the third segment goes on with that decision alone, as a plain run given
    the second round's results would (the framework refuses results for calls its last
    response did not make)."""
    world = World()
    kernel, session_id, conversation = pays_twice(world)
    for call_id in ("c1", "c2"):
        Scheduler(kernel, "w").run_until_idle()
        decide(kernel, asked(kernel, session_id)[call_id], "approve", "ok")
    Scheduler(kernel, "w").run_until_idle()
    (turn,) = tasks(kernel, session_id, "agent:billing")
    assert turn.outcome is not None and turn.outcome["kind"] == "succeeded", turn.outcome
    assert turn.outcome["result"]["output"] == "Done."
    assert world.effects == ["pay:1", "pay:2"]
    assert returns(world.requests[-1]) == {"c1": "paid 1", "c2": "paid 2"}
    shown = results(kernel, conversation)
    assert shown["c2"]["approval"]["by"] == "user:olga"


@pytest.mark.parametrize("rounds_decided", [0, 1])
def test_a_turn_cancelled_while_its_calls_wait_for_approval_leaves_each_message_once(
    rounds_decided: int
) -> None:
    """Cancelled while a segment's calls wait for decisions (the first segment's, or a
    later one's), the turn leaves the next one its messages as the segment ended, each
    response once, its waiting call answered as cancelled."""
    from pydantic_ai.messages import ModelMessagesTypeAdapter

    from kernel.hosts.pydantic_ai import HISTORY

    world = World()
    kernel, session_id, conversation = pays_twice(world)
    Scheduler(kernel, "w").run_until_idle()
    for call_id in ("c1", "c2")[:rounds_decided]:
        decide(kernel, asked(kernel, session_id)[call_id], "approve", "ok")
        Scheduler(kernel, "w").run_until_idle()
    (turn,) = tasks(kernel, session_id, "agent:billing")
    assert turn.status is Status.WAITING
    draft = Draft(actor="user:olga")
    draft.cancel(turn.id, "wrong invoice")
    kernel.open(session_id).commit(draft)
    Scheduler(kernel, "w").run_until_idle()
    (turn,) = tasks(kernel, session_id, "agent:billing")
    assert turn.outcome is not None and turn.outcome["kind"] == "cancelled"
    left = ModelMessagesTypeAdapter.validate_python(
        kernel.document(session_id, HISTORY, conversation)["messages"])
    calls = [p.tool_call_id for m in left if isinstance(m, ModelResponse)
             for p in m.parts if isinstance(p, ToolCallPart)]
    assert calls == ["c1", "c2"][:rounds_decided + 1]
    told = [(p.tool_call_id, p.content) for m in left if isinstance(m, ModelRequest)
            for p in m.parts if isinstance(p, ToolReturnPart)]
    assert [call_id for call_id, _ in told] == calls
    assert told[:-1] == [("c1", "paid 1")][:rounds_decided]
    assert told[-1][1]["cancelled"] is True and "wrong invoice" in told[-1][1]["reason"]


def test_a_turn_cancelled_after_its_decisions_tells_the_next_turn_a_denial_as_a_denial() -> None:
    """Cancelled while the segment the decisions started is under way (here: waiting on
    an approved call a crash cut mid-way), the turn leaves the denied call answered with
    its denial, as the framework answered it, not as a call the cancel cut."""
    from pydantic_ai.messages import ModelMessagesTypeAdapter

    from kernel.hosts.pydantic_ai import HISTORY

    world = World(crash_on={"pay"})
    kernel, session_id, conversation, submission = world.start()
    world.run()
    waiting = asked(kernel, session_id)
    decide(kernel, waiting["c2"], "approve", "ok")
    decide(kernel, waiting["c3"], "deny", "refunds go through finance")
    world.run(crashes_allowed=1)
    (turn,) = tasks(kernel, session_id, "agent:billing")
    assert turn.status is Status.WAITING and turn.wait == {"signal": "resolution:c2:1"}
    draft = Draft(actor="user:olga")
    draft.cancel(turn.id, "wrong customer")
    kernel.open(session_id).commit(draft)
    world.run()
    left = ModelMessagesTypeAdapter.validate_python(
        kernel.document(session_id, HISTORY, conversation)["messages"])
    told = returns(left)
    assert told["c3"] == {"error": "The tool call was denied: refunds go through finance"}
    assert told["c2"]["cancelled"] is True and "wrong customer" in told["c2"]["reason"]
    shown = results(kernel, conversation)
    assert shown["c3"]["denied"] is True and "finance" in shown["c3"]["error"]
    assert not shown["c3"].get("cancelled")
