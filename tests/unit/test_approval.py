"""The approval gate on the reference storage: a gated call waits (holding no worker) for
an operator's decision, runs only with the approved arguments, is denied with the reason
the model is given, and times out into a denial; crashes around the approval never run
the tool twice (the process "dies" by raising Crash; a new scheduler resumes from
storage alone)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest

from kernel import (
    CommitRejected,
    Draft,
    InMemoryStorage,
    Kernel,
    ManualClock,
    Registry,
    Run,
    Status,
    SubmissionStatus,
    Task,
    Transition,
)
from kernel.agent import (
    Gate,
    ModelRequest,
    ModelResponse,
    Replay,
    ScriptedProvider,
    Tool,
    Toolbox,
    ToolCall,
    digest,
    register_agent,
    submit,
)
from kernel.agent import approval as approvals
from kernel.run import Lease
from tests.unit.crashes import Crash, CrashPoints, run_across_crashes

RECIPIENTS = ["ana@example.com", "ben@example.com", "cai@example.com"]
NUMBER = {"type": "object", "properties": {"amount": {"type": "number"}},
          "required": ["amount"], "additionalProperties": False}


def more_than_two(arguments: Any) -> str | None:
    count = len(arguments["recipients"])
    return f"{count} recipients, more than 2" if count > 2 else None


@dataclass
class World(CrashPoints):
    calls: list[ToolCall]
    effects: list[str] = field(default_factory=list)
    storage: InMemoryStorage = field(default_factory=InMemoryStorage)
    clock: ManualClock = field(default_factory=ManualClock)
    requests: list[ModelRequest] = field(default_factory=list)

    def script(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        results = [m for m in request.messages if m["role"] == "tool"]
        if results:
            return ModelResponse(f"done: {[m['content'] for m in results]}")
        return ModelResponse("", tuple(self.calls))

    def kernel(self) -> Kernel:
        world = self
        registry = Registry()

        @registry.task("fake-batch")
        class FakeBatch:
            initial = "send"

            def send(self, run: Run) -> Transition:
                world.effects.extend(f"sent:{to}" for to in run.input["recipients"])
                return run.succeed({"sent": len(run.input["recipients"])})

        def charge(run: Run, args: dict[str, Any]) -> Any:
            world.effects.append(f"charge:{args['amount']}")
            world.maybe_crash("charge")
            return {"charged": args["amount"]}

        def broken(arguments: Any) -> bool:
            raise KeyError("amount")

        toolbox = Toolbox()
        toolbox.add(Tool(
            "send_notices", "Send",
            {"type": "object", "properties": {"recipients": {"type": "array",
                                                             "items": {"type": "string"}}},
             "required": ["recipients"]},
            task_kind="fake-batch", gate=Gate(more_than_two, timeout=600),
        ))
        toolbox.add(Tool("charge", "Pay", NUMBER, Replay.UNSAFE, run=charge,
                         gate=Gate(lambda a: a["amount"] > 100, timeout=600)))
        toolbox.add(Tool("refund", "Refund", NUMBER, Replay.UNSAFE, run=charge,
                         gate=Gate(broken)))
        toolbox.add(Tool("always", "Always asked", NUMBER, Replay.SAFE, run=charge,
                         gate=Gate()))
        register_agent(registry, {"scripted": ScriptedProvider(self.script)}, toolbox,
                       "scripted")
        return Kernel(self.storage, registry, self.clock)

    def run(self, crashes_allowed: int = 0, advance_clock: bool = False) -> int:
        # the dead worker's lease runs out before anyone else may claim its task
        return run_across_crashes(self.kernel, self.clock, crashes_allowed=crashes_allowed,
                                  advance_clock=advance_clock,
                                  lease_lapse=timedelta(minutes=5))

    def start(self) -> Any:
        kernel = self.kernel()
        handle = kernel.create_session()
        draft = Draft()
        conversation = draft.create_conversation()
        handle.commit(draft)
        submitted = submit(handle, conversation, {"text": "go"}, "req-1")
        return kernel, handle, conversation, submitted

    def tool_tasks(self, kernel: Kernel) -> dict[str, Task]:
        found = [t for s in self.storage._sessions for t in self.storage.session_tasks(s)
                 if t.kind == "agent-tool"]
        return {t.input["call"]["name"]: t for t in found}

    def decide(self, kernel: Kernel, task: Task, decision: str, **kw: Any) -> None:
        draft = Draft(actor="user:olga")
        seen = kw.pop("seen", None) or task.checkpoint["approval"]["digest"]
        approvals.decide(draft, task.id, decision, by="user:olga", reason=kw.pop("reason"),
                         seen=seen, **kw)
        kernel.open(task.session_id).commit(draft)


def results(kernel: Kernel, conversation: str) -> dict[str, Any]:
    return {e.payload["name"]: e.payload for e in kernel.entries(conversation)
            if e.kind == "tool_result"}


def test_a_gated_call_waits_without_a_worker_and_survives_a_new_process() -> None:
    world = World([ToolCall("c1", "send_notices", {"recipients": RECIPIENTS})])
    kernel, handle, conversation, submitted = world.start()
    world.run()
    world.run()  # another process finds it waiting too, and leaves it so
    task = world.tool_tasks(kernel)["send_notices"]
    assert task.status is Status.SLEEPING and task.phase == approvals.PHASE
    assert task.lease_owner is None
    requested = approvals.pending(task)
    assert requested is not None
    assert requested["name"] == "send_notices"
    assert requested["arguments"] == {"recipients": RECIPIENTS}
    assert requested["digest"] == digest({"recipients": RECIPIENTS})
    assert requested["why"] == "3 recipients, more than 2"
    assert world.effects == []
    assert kernel.storage.submission(submitted.submission.id).status is SubmissionStatus.PLACED


def test_a_call_the_predicate_lets_through_runs_at_once() -> None:
    world = World([ToolCall("c1", "send_notices", {"recipients": RECIPIENTS[:2]}),
                   ToolCall("c2", "charge", {"amount": 5})])
    kernel, handle, conversation, submitted = world.start()
    world.run()
    assert sorted(world.effects) == ["charge:5", *[f"sent:{to}" for to in RECIPIENTS[:2]]]
    assert all("approval" not in r for r in results(kernel, conversation).values())
    assert kernel.storage.submission(submitted.submission.id).status is \
        SubmissionStatus.ANSWERED


def test_approve_runs_the_call_once_and_records_who_approved_on_what() -> None:
    world = World([ToolCall("c1", "send_notices", {"recipients": RECIPIENTS})])
    kernel, handle, conversation, submitted = world.start()
    world.run()
    task = world.tool_tasks(kernel)["send_notices"]
    world.decide(kernel, task, approvals.APPROVE, reason="checked the list")
    world.run()
    assert world.effects == [f"sent:{to}" for to in RECIPIENTS]
    result = results(kernel, conversation)["send_notices"]
    assert result["result"] == {"sent": 3}
    assert result["approval"]["by"] == "user:olga"
    assert result["approval"]["reason"] == "checked the list"
    assert result["approval"]["digest"] == task.checkpoint["approval"]["digest"]
    assert kernel.storage.submission(submitted.submission.id).status is \
        SubmissionStatus.ANSWERED


def test_approve_with_edited_arguments_runs_exactly_those_and_keeps_both() -> None:
    world = World([ToolCall("c1", "charge", {"amount": 500})])
    kernel, handle, conversation, submitted = world.start()
    world.run()
    task = world.tool_tasks(kernel)["charge"]
    world.decide(kernel, task, approvals.APPROVE, reason="too much; 150 agreed",
                 arguments={"amount": 150})
    world.run()
    assert world.effects == ["charge:150"]
    done = kernel.task(task.id)
    assert done.checkpoint["intent"]["arguments"] == {"amount": 150}
    assert done.checkpoint["approval"]["arguments"] == {"amount": 500}  # what was proposed
    result = results(kernel, conversation)["charge"]
    assert result["approval"]["edited"] is True
    assert result["approval"]["arguments_digest"] == digest({"amount": 150})
    assert result["approval"]["proposed_digest"] == digest({"amount": 500})
    tool_message = next(m for m in world.requests[-1].messages if m["role"] == "tool")
    assert tool_message["content"]["arguments"] == {"amount": 150}  # the model is told


def test_edited_arguments_that_do_not_fit_the_schema_do_not_run() -> None:
    world = World([ToolCall("c1", "charge", {"amount": 500})])
    kernel, handle, conversation, submitted = world.start()
    world.run()
    task = world.tool_tasks(kernel)["charge"]
    world.decide(kernel, task, approvals.APPROVE, reason="r", arguments={"amount": "x"})
    world.run()
    assert world.effects == []
    assert "invalid approved arguments" in results(kernel, conversation)["charge"]["error"]


def test_deny_gives_the_model_the_reason_and_runs_nothing() -> None:
    world = World([ToolCall("c1", "charge", {"amount": 500})])
    kernel, handle, conversation, submitted = world.start()
    world.run()
    world.decide(kernel, world.tool_tasks(kernel)["charge"], approvals.DENY,
                 reason="no refunds above 100 without a ticket")
    world.run()
    assert world.effects == []
    result = results(kernel, conversation)["charge"]
    assert result["denied"] is True
    assert result["approval"]["decision"] == approvals.DENY
    assert "no refunds above 100 without a ticket" in result["error"]
    tool_message = next(m for m in world.requests[-1].messages if m["role"] == "tool")
    assert "no refunds above 100 without a ticket" in tool_message["content"]["error"]
    assert kernel.storage.submission(submitted.submission.id).status is \
        SubmissionStatus.ANSWERED


def test_the_timeout_denies_the_call_durably() -> None:
    world = World([ToolCall("c1", "charge", {"amount": 500})])
    kernel, handle, conversation, submitted = world.start()
    world.run()
    world.clock.advance(timedelta(seconds=599))
    world.run()
    assert world.tool_tasks(kernel)["charge"].status is Status.SLEEPING
    world.run(advance_clock=True)  # past the timeout
    assert world.effects == []
    result = results(kernel, conversation)["charge"]
    assert result["approval"]["decision"] == approvals.TIMED_OUT
    assert "no operator decided within 600 s" in result["error"]
    task = world.tool_tasks(kernel)["charge"]
    with pytest.raises(CommitRejected):  # too late: the task has ended
        world.decide(kernel, task, approvals.APPROVE, reason="late")
    assert world.effects == []


def test_a_second_decision_is_refused_and_the_first_is_applied_once() -> None:
    world = World([ToolCall("c1", "charge", {"amount": 500})])
    kernel, handle, conversation, submitted = world.start()
    world.run()
    task = world.tool_tasks(kernel)["charge"]
    world.decide(kernel, task, approvals.APPROVE, reason="ok")
    with pytest.raises(CommitRejected):
        world.decide(kernel, task, approvals.DENY, reason="no")
    with pytest.raises(CommitRejected):
        world.decide(kernel, task, approvals.APPROVE, reason="ok")  # the same, again
    world.run()
    assert world.effects == ["charge:500"]


def test_woken_without_a_decision_it_waits_on_until_the_same_time() -> None:
    world = World([ToolCall("c1", "charge", {"amount": 500})])
    kernel, handle, conversation, submitted = world.start()
    world.run()
    task = world.tool_tasks(kernel)["charge"]
    draft = Draft(actor="user:olga")
    draft.wake(task.id)
    kernel.open(task.session_id).commit(draft)
    world.run()
    again = kernel.task(task.id)
    assert again.status is Status.SLEEPING and again.wake_at == task.wake_at
    assert world.effects == []


def test_a_call_started_again_from_its_approval_is_asked_again_with_a_new_deadline() -> None:
    """Started again from the phase that waits for approval (after its deadline, say), the
    call asks again, for its full timeout, with a request of its own: it is not denied at
    once for a deadline nobody was asked by, and a decision then lets it run."""
    from kernel.forks import phase_entries

    world = World([ToolCall("c1", "charge", {"amount": 500})])
    kernel, handle, conversation, submitted = world.start()
    world.run()
    task = world.tool_tasks(kernel)["charge"]
    asked = task.checkpoint["approval"]
    # Past its deadline, before a worker has run its timeout: it still sleeps.
    world.clock.advance(timedelta(seconds=700))
    entered = [e for e in phase_entries(task.id, kernel.storage.commits_after(
        handle.id, 0, 1000)) if e.phase == approvals.PHASE]
    draft = Draft(actor="user:olga")
    draft.restart(task.id, entered[-1], expected_seq=kernel.task(task.id).updated_seq)
    kernel.open(handle.id).commit(draft)
    world.run()
    again = kernel.task(task.id)
    requested = approvals.pending(again)
    assert requested is not None, again.outcome
    assert requested["until"] == (world.clock.now() + timedelta(seconds=600)).isoformat()
    assert requested["arguments"] == asked["arguments"] and requested != asked
    world.decide(kernel, again, approvals.APPROVE, reason="now it is fine")
    world.run()
    assert world.effects == ["charge:500"]


def test_an_ended_call_does_not_start_again_the_model_has_its_answer() -> None:
    """A call whose task ended has its answer in the conversation (a denial here): started
    again from a phase, it would run (or ask) anew and answer the same call twice."""
    from kernel.forks import phase_entries

    world = World([ToolCall("c1", "charge", {"amount": 500}),
                   ToolCall("c2", "always", {"amount": 1})])
    kernel, handle, conversation, submitted = world.start()
    world.run()
    task = world.tool_tasks(kernel)["charge"]
    world.decide(kernel, task, approvals.DENY, reason="not yet")
    world.run()  # c1 answered as denied; the turn waits on c2
    ended = kernel.task(task.id)
    assert ended.terminal
    entered = [e for e in phase_entries(task.id, kernel.storage.commits_after(
        handle.id, 0, 1000)) if e.phase == approvals.PHASE]
    draft = Draft(actor="user:olga")
    draft.restart(task.id, entered[-1], expected_seq=ended.updated_seq)
    with pytest.raises(CommitRejected, match="has ended: its call is answered"):
        kernel.open(handle.id).commit(draft)
    assert kernel.task(task.id).updated_seq == ended.updated_seq
    world.run()
    assert world.effects == []


def test_a_gate_that_cannot_decide_asks_for_approval() -> None:
    world = World([ToolCall("c1", "refund", {"amount": 1})])
    kernel, handle, conversation, submitted = world.start()
    world.run()
    requested = approvals.pending(world.tool_tasks(kernel)["refund"])
    assert requested is not None and "could not decide" in requested["why"]
    assert world.effects == []


def crash_once_committing_from(phase: str, monkeypatch: pytest.MonkeyPatch, *,
                               after: bool = False) -> list[str]:
    """The process dies at its first commit from ``phase``: just before it lands, or
    (``after``) just after."""
    real = Lease.commit
    died: list[str] = []

    def commit(self: Lease, transition: Any) -> Any:
        if self.task.phase == phase and not died and not after:
            died.append(phase)
            raise Crash()
        written = real(self, transition)
        if self.task.phase != phase and not died and after:
            died.append(phase)
            raise Crash()
        return written

    monkeypatch.setattr(Lease, "commit", commit)
    return died


@pytest.mark.parametrize("after", [False, True])
def test_a_crash_between_the_approval_and_the_intent_never_runs_the_call_twice(
    monkeypatch: pytest.MonkeyPatch, after: bool
) -> None:
    world = World([ToolCall("c1", "always", {"amount": 1})])
    kernel, handle, conversation, submitted = world.start()
    world.run()
    world.decide(kernel, world.tool_tasks(kernel)["always"], approvals.APPROVE, reason="ok")
    died = crash_once_committing_from(approvals.PHASE, monkeypatch, after=after)
    assert world.run(crashes_allowed=1) == 1 and died
    assert world.effects == ["charge:1"]  # a safe tool: its intent ran it once either way
    assert results(kernel, conversation)["always"]["result"] == {"charged": 1}


@pytest.mark.parametrize("after", [False, True])
def test_a_crash_before_an_approved_batch_is_spawned_sends_once(
    monkeypatch: pytest.MonkeyPatch, after: bool
) -> None:
    world = World([ToolCall("c1", "send_notices", {"recipients": RECIPIENTS})])
    kernel, handle, conversation, submitted = world.start()
    world.run()
    world.decide(kernel, world.tool_tasks(kernel)["send_notices"], approvals.APPROVE,
                 reason="ok")
    died = crash_once_committing_from(approvals.PHASE, monkeypatch, after=after)
    assert world.run(crashes_allowed=1) == 1 and died
    assert world.effects == [f"sent:{to}" for to in RECIPIENTS]
    assert kernel.storage.submission(submitted.submission.id).status is \
        SubmissionStatus.ANSWERED


def test_a_crash_during_the_approved_unsafe_call_never_runs_it_again() -> None:
    world = World([ToolCall("c1", "charge", {"amount": 500})], crash_on={"charge"})
    kernel, handle, conversation, submitted = world.start()
    world.run()
    world.decide(kernel, world.tool_tasks(kernel)["charge"], approvals.APPROVE,
                 reason="ok", arguments={"amount": 120})
    assert world.run(crashes_allowed=1) == 1
    assert world.effects == ["charge:120"]
    result = results(kernel, conversation)["charge"]
    assert result["interrupted"] is True
    assert result["approval"]["by"] == "user:olga"  # still says who let it run


def test_a_gate_needs_a_positive_timeout() -> None:
    with pytest.raises(ValueError, match="timeout"):
        Gate(timeout=0)
    assert Gate(False).needed({}) is None
    assert Gate().needed({}) is not None
