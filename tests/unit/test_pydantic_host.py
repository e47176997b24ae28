"""A Pydantic AI agent on the reference storage through the kernel's capability: every
model request and tool call a durable unit, and crashes at the points that matter (the
process "dies" by raising Crash; a new scheduler resumes from storage alone)."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_ai import Agent, ModelRetry, RunContext
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import UsageLimits

from kernel import (
    Draft,
    InMemoryStorage,
    Kernel,
    ManualClock,
    Registry,
    Scheduler,
    Status,
    SubmissionStatus,
)
from kernel.agent import submit
from kernel.hosts.pydantic_ai import SAFE, KernelDurability, register_agent
from tests.unit.crashes import Crash, CrashPoints, run_across_crashes


class Ticket(BaseModel):
    customer: str
    notified: bool


@dataclass
class World(CrashPoints):
    model_calls: list[int] = field(default_factory=list)
    effects: list[str] = field(default_factory=list)
    storage: InMemoryStorage = field(default_factory=InMemoryStorage)
    clock: ManualClock = field(default_factory=ManualClock)
    reject_first_output: bool = False
    limits: UsageLimits | None = None
    output_type: Any = Ticket
    options: dict[str, Any] = field(default_factory=dict)
    """More of the agent's constructor arguments (instructions, model_settings...)."""
    notify_options: dict[str, Any] = field(default_factory=dict)
    final_call: bool = False
    """Whether the answer comes with a lookup of ben's, which the end strategy decides."""

    def model(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        step = sum(1 for m in messages if m.kind == "response")
        self.model_calls.append(step)
        self.maybe_crash(f"model:{step}")
        usage_parts: list[Any]
        if step == 0:
            usage_parts = [ToolCallPart("lookup", {"customer": "ana"}, tool_call_id="c1")]
        elif step == 1:
            usage_parts = [ToolCallPart("notify", {"to": "ana@example.com"}, tool_call_id="c2")]
        else:
            usage_parts = [TextPart("Done."), ToolCallPart(
                info.output_tools[0].name, {"customer": "ana", "notified": True},
                tool_call_id=f"out{step}")]
            if self.final_call:
                usage_parts.append(ToolCallPart("lookup", {"customer": "ben"},
                                                tool_call_id=f"ben{step}"))
        return ModelResponse(parts=usage_parts)

    def agent(self) -> Agent[None, Any]:
        agent = Agent(FunctionModel(self.model), name="support", output_type=self.output_type,
                      capabilities=[KernelDurability()], **self.options)
        world = self

        @agent.tool_plain(metadata=SAFE)
        def lookup(customer: str) -> str:
            world.effects.append(f"lookup:{customer}")
            world.maybe_crash("lookup")
            return f"{customer} <ana@example.com>"

        @agent.tool_plain(**self.notify_options)
        def notify(to: str) -> str:
            world.effects.append(f"notify:{to}")
            world.maybe_crash("notify")
            return f"sent to {to}"

        @agent.output_validator
        def check(ctx: RunContext[None], output: Any) -> Any:
            world.effects.append("validate")
            world.maybe_crash("validate")
            answers = sum(1 for m in ctx.messages if m.kind == "response")
            if world.reject_first_output and answers < 4:  # the first answer (step 2)
                raise ModelRetry("say it again")
            return output

        return agent

    def kernel(self) -> Kernel:
        registry = Registry()
        register_agent(registry, "support", self.agent(), usage_limits=self.limits)
        return Kernel(self.storage, registry, self.clock)

    def run(self, crashes_allowed: int = 0) -> int:
        return run_across_crashes(self.kernel, self.clock, crashes_allowed=crashes_allowed,
                                  advance_clock=True)

    def start(self, text: str = "Notify ana") -> tuple[Kernel, str, str, str]:
        kernel = self.kernel()
        handle = kernel.create_session()
        draft = Draft()
        conversation = draft.create_conversation()
        handle.commit(draft)
        submitted = submit(handle, conversation, {"text": text, "agent": "support"}, "req-1")
        assert submitted.submission is not None
        return kernel, handle.id, conversation, submitted.submission.id


def turn_of(kernel: Kernel, session_id: str) -> Any:
    (turn,) = [t for t in kernel.storage.session_tasks(session_id)
               if t.kind == "agent:support"]
    return turn


def kinds(kernel: Kernel, conversation: str) -> list[str]:
    return [e.kind for e in kernel.entries(conversation)]


def test_a_run_records_each_request_and_call_and_answers_with_the_structured_output() -> None:
    world = World()
    kernel, session_id, conversation, submission = world.start()
    world.run()
    assert world.model_calls == [0, 1, 2]
    assert world.effects == ["lookup:ana", "notify:ana@example.com", "validate"]
    stored = kernel.storage.submission(submission)
    assert stored is not None and stored.status is SubmissionStatus.ANSWERED
    turn = turn_of(kernel, session_id)
    assert turn.outcome["result"]["output"] == {"customer": "ana", "notified": True}
    assert kinds(kernel, conversation) == [
        "user", "model_response", "tool_result", "model_response", "tool_result",
        "model_response", "tool_result",
    ]
    results = {e.payload["call_id"]: e.payload for e in kernel.entries(conversation)
               if e.kind == "tool_result"}
    assert results["c1"]["replay"] == "safe" and results["c2"]["replay"] == "unsafe"
    assert results["c2"]["result"] == "sent to ana@example.com"
    assert results["out2"]["by"] == "framework"
    answer = next(e for e in kernel.entries(conversation) if e.id == stored.answer_entry_id)
    assert answer.payload["text"] == "Done."


def turn_commits(kernel: Kernel, session_id: str) -> list[Any]:
    turn = turn_of(kernel, session_id)
    return [c for c in kernel.storage.commits_after(session_id, 0, 1000)
            if c.actor == f"task:{turn.id}"]


def test_a_safe_step_costs_one_commit_and_an_unsafe_one_two() -> None:
    """Response 0 (its safe call's result waits for the next commit); response 1 with
    lookup's result and the intent of its unsafe call; that call's result; response 2
    (the answer, committed before its output is validated); the turn's end."""
    world = World()
    kernel, session_id, conversation, submission = world.start()
    world.run()
    written = [sorted(e.kind for e in kernel.entries(conversation) if e.seq == c.seq)
               for c in turn_commits(kernel, session_id)]
    assert written == [
        ["model_response"],
        ["model_response", "tool_result"],
        ["tool_result"],
        ["model_response"],
        ["tool_result"],  # the output tool's result, with the end
    ], written


def test_outside_a_kernel_run_the_capability_is_transparent() -> None:
    world = World()
    assert world.agent().run_sync("Notify ana").output == Ticket(customer="ana", notified=True)


@pytest.mark.parametrize("point", ["model:1", "lookup", "validate"])
def test_a_crash_never_requests_a_committed_response_again(point: str) -> None:
    world = World(crash_on={point})
    kernel, session_id, conversation, submission = world.start()
    assert world.run(crashes_allowed=1) == 1
    stored = kernel.storage.submission(submission)
    assert stored is not None and stored.status is SubmissionStatus.ANSWERED
    # Each step's request is made once, but the one the crash interrupted (not committed).
    interrupted = [int(point.split(":")[1])] if point.startswith("model") else []
    assert sorted(world.model_calls) == sorted([0, 1, 2, *interrupted])
    assert world.effects.count("notify:ana@example.com") == 1
    # A safe tool may run again: when it was cut, or when its result was still waiting
    # for the next commit (the response of request 1) that the crash prevented.
    expected_lookups = 2 if point in ("lookup", "model:1") else 1
    assert world.effects.count("lookup:ana") == expected_lookups


def test_an_unsafe_call_cut_midway_waits_for_an_operator_and_never_runs_twice() -> None:
    world = World(crash_on={"notify"})
    kernel, session_id, conversation, submission = world.start()
    world.run(crashes_allowed=1)
    turn = turn_of(kernel, session_id)
    assert turn.status is Status.WAITING and turn.wait == {"signal": "resolution:c2:1"}
    assert [d.name for d in kernel.registry.decisions(turn)] == [
        "happened", "run_again", "not_done"]
    draft = Draft(actor="user:op")
    draft.signal(turn.id, "resolution:c2:1",
                 {"decision": "happened", "by": "user:op", "reason": "seen in the outbox",
                  "receipt": {"result": "sent (checked)"}}, step_epoch=turn.epoch)
    kernel.open(session_id).commit(draft)
    world.run()
    assert world.effects.count("notify:ana@example.com") == 1
    assert world.model_calls == [0, 1, 2]
    stored = kernel.storage.submission(submission)
    assert stored is not None and stored.status is SubmissionStatus.ANSWERED
    result = next(e.payload for e in kernel.entries(conversation)
                  if e.kind == "tool_result" and e.payload["call_id"] == "c2")
    assert result["result"] == "sent (checked)" and result["resolved"]["by"] == "user:op"


def test_run_again_calls_the_tool_again_and_not_done_tells_the_model() -> None:
    for decision, notifies in (("run_again", 2), ("not_done", 1)):
        world = World(crash_on={"notify"})
        kernel, session_id, conversation, submission = world.start()
        world.run(crashes_allowed=1)
        turn = turn_of(kernel, session_id)
        draft = Draft(actor="user:op")
        draft.signal(turn.id, "resolution:c2:1",
                     {"decision": decision, "by": "user:op", "reason": "checked"},
                     step_epoch=turn.epoch)
        kernel.open(session_id).commit(draft)
        world.run()
        assert world.effects.count("notify:ana@example.com") == notifies, decision
        result = next(e.payload for e in kernel.entries(conversation)
                      if e.kind == "tool_result" and e.payload["call_id"] == "c2")
        if decision == "not_done":
            assert "did not take effect" in result["error"]
        assert turn_of(kernel, session_id).outcome["kind"] == "succeeded"


def test_an_output_validation_retry_survives_a_crash() -> None:
    world = World(crash_on={"validate"}, reject_first_output=True)
    kernel, session_id, conversation, submission = world.start()
    world.run(crashes_allowed=1)
    # The validator rejects the first answer on the replay too: one more request, once.
    assert sorted(world.model_calls) == [0, 1, 2, 3]
    turn = turn_of(kernel, session_id)
    assert turn.outcome["kind"] == "succeeded"
    retried = next(e.payload for e in kernel.entries(conversation)
                   if e.kind == "tool_result" and e.payload["call_id"] == "out2")
    assert "say it again" in str(retried["error"])


def test_usage_limits_hold_across_a_crash() -> None:
    world = World(crash_on={"lookup"}, limits=UsageLimits(request_limit=2))
    kernel, session_id, conversation, submission = world.start()
    world.run(crashes_allowed=1)
    turn = turn_of(kernel, session_id)
    assert turn.outcome["kind"] == "failed" and "request_limit" in turn.outcome["error"]
    assert world.model_calls == [0, 1]  # the limit counted the replayed requests too
    stored = kernel.storage.submission(submission)
    assert stored is not None and stored.status is SubmissionStatus.UNANSWERED


def test_a_submission_naming_no_registered_agent_is_refused() -> None:
    world = World()
    kernel = world.kernel()
    handle = kernel.create_session()
    draft = Draft()
    conversation = draft.create_conversation()
    handle.commit(draft)
    with pytest.raises(ValueError, match="agent: no agent 'billing' is registered"):
        submit(handle, conversation, {"text": "hi", "agent": "billing"}, "req-1")


class ThreadsSeen(InMemoryStorage):
    """The reference storage, noting the thread of every commit."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: set[int] = set()

    def commit(self, *args: Any, **kwargs: Any) -> Any:
        self.threads.add(threading.get_ident())
        return super().commit(*args, **kwargs)


def async_world(threads: set[int]) -> World:
    """A world whose model is a coroutine (it runs on the agent's loop), noting its thread."""
    world = World(storage=ThreadsSeen())
    model = world.model

    async def on_loop(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        threads.add(threading.get_ident())
        return model(messages, info)

    world.model = on_loop  # type: ignore[method-assign,assignment]
    return world


def test_the_agent_loop_runs_on_the_phase_thread_and_commits_there() -> None:
    """No hop between threads per unit: the run's loop is the phase's thread's, and every
    commit is made there (a sync tool still runs in a thread of its own)."""
    loop_threads: set[int] = set()
    world = async_world(loop_threads)
    kernel, session_id, conversation, submission = world.start()
    world.run()
    assert isinstance(world.storage, ThreadsSeen)
    assert loop_threads == world.storage.threads == {threading.get_ident()}
    stored = kernel.storage.submission(submission)
    assert stored is not None and stored.status is SubmissionStatus.ANSWERED


def test_a_phase_inside_a_running_loop_runs_the_agent_on_a_thread_of_its_own() -> None:
    loop_threads: set[int] = set()
    world = async_world(loop_threads)
    kernel, session_id, conversation, submission = world.start()

    async def inside() -> None:
        world.run()  # blocks this loop: the agent's needs another

    asyncio.run(inside())
    assert isinstance(world.storage, ThreadsSeen)
    assert world.storage.threads == {threading.get_ident()}
    assert loop_threads and threading.get_ident() not in loop_threads
    assert world.model_calls == [0, 1, 2]
    assert world.effects.count("notify:ana@example.com") == 1
    stored = kernel.storage.submission(submission)
    assert stored is not None and stored.status is SubmissionStatus.ANSWERED


class DiesEnding(InMemoryStorage):
    """The reference storage in a process that dies building the commit that ends a task
    (once), before anything of it is written."""

    armed = True

    def commit(self, session_id: str, build: Any, *args: Any, **kwargs: Any) -> Any:
        def built(reads: Any) -> Any:
            write_set = build(reads)
            if self.armed and any(t.status is Status.TERMINAL for t in write_set.updated_tasks):
                self.armed = False
                raise Crash()
            return write_set

        return super().commit(session_id, built, *args, **kwargs)


@dataclass
class Noted:
    asked: list[int] = field(default_factory=list)
    ran: list[str] = field(default_factory=list)
    clock: ManualClock = field(default_factory=ManualClock)


def text_world(storage: InMemoryStorage, noted: Noted, validated: list[str] | None = None
               ) -> Kernel:
    """An agent that calls an unsafe tool once, then answers in text; with an output
    validator when ``validated`` is given (each validation noted in it). What the model
    was asked and what the tool ran is noted in ``noted``."""
    asked, ran = noted.asked, noted.ran

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        step = sum(1 for m in messages if m.kind == "response")
        asked.append(step)
        if step == 0:
            return ModelResponse(parts=[ToolCallPart("notify", {"to": "ana"}, tool_call_id="c1")])
        return ModelResponse(parts=[TextPart("Done.")])

    agent = Agent(FunctionModel(model), name="support", capabilities=[KernelDurability()])

    @agent.tool_plain
    def notify(to: str) -> str:
        ran.append(to)
        return "sent"

    if validated is not None:
        @agent.output_validator
        def check(output: str) -> str:
            validated.append(output)
            return output

    registry = Registry()
    register_agent(registry, "support", agent)
    return Kernel(storage, registry, noted.clock)


def started(kernel: Kernel) -> tuple[str, str, str]:
    handle = kernel.create_session()
    draft = Draft()
    conversation = draft.create_conversation()
    handle.commit(draft)
    submitted = submit(handle, conversation, {"text": "Notify ana", "agent": "support"}, "r")
    assert submitted.submission is not None
    return handle.id, conversation, submitted.submission.id


def test_an_answer_is_committed_with_the_runs_end_when_no_validator_runs_between() -> None:
    """Nothing of the user's runs between a text answer and the run's end: one commit
    holds both. With an output validator, the answer is committed before it runs."""
    for validated in (None, []):
        kernel = text_world(InMemoryStorage(), Noted(), validated)
        session_id, conversation, submission = started(kernel)
        Scheduler(kernel, "w").run_until_idle()
        written = [sorted(e.kind for e in kernel.entries(conversation) if e.seq == c.seq)
                   for c in turn_commits(kernel, session_id)]
        ending = [["model_response"], []] if validated is not None else [["model_response"]]
        assert written == [["model_response"], ["tool_result"], *ending], written
        stored = kernel.storage.submission(submission)
        assert stored is not None and stored.status is SubmissionStatus.ANSWERED
        assert stored.answer_entry_id == kernel.entries(conversation)[-1].id  # the answer


def test_a_crash_before_a_held_answer_is_committed_asks_the_model_again_and_nothing_else() -> None:
    storage, noted = DiesEnding(), Noted()
    kernel = text_world(storage, noted)
    session_id, conversation, submission = started(kernel)
    crashes = run_across_crashes(lambda: text_world(storage, noted), noted.clock,
                                 crashes_allowed=1, advance_clock=True)
    assert crashes == 1
    assert noted.asked == [0, 1, 1]  # the answer, never committed, is asked again
    stored = kernel.storage.submission(submission)
    assert stored is not None and stored.status is SubmissionStatus.ANSWERED
    assert noted.ran == ["ana"]  # the unsafe call ran once
    assert [e.kind for e in kernel.entries(conversation)] == [
        "user", "model_response", "tool_result", "model_response"]


class EntriesRead(InMemoryStorage):
    """The reference storage, noting every entry a read of a conversation returns."""

    def __init__(self) -> None:
        super().__init__()
        self.read: list[str] = []
        self.inside = False  # the reference's range read filters a whole read itself

    def conversation_entries(self, conversation_id: str) -> list[Any]:
        found = super().conversation_entries(conversation_id)
        if not self.inside:
            self.read += [e.id for e in found]
        return found

    def context_entries(self, *args: Any, **kwargs: Any) -> list[Any]:
        self.inside = True
        try:
            found = super().context_entries(*args, **kwargs)
        finally:
            self.inside = False
        self.read += [e.id for e in found]
        return found


def test_a_turn_reads_its_own_units_not_the_conversations_earlier_turns() -> None:
    """The journal of a turn is read from the commit that created it: the entries of the
    turns before it (a long conversation's history) are not read again at each phase."""
    storage, noted = EntriesRead(), Noted()
    kernel = text_world(storage, noted)
    session_id, conversation, first = started(kernel)
    Scheduler(kernel, "w").run_until_idle()
    earlier = {e.id for e in kernel.entries(conversation)}
    handle = kernel.open(session_id)
    again = submit(handle, conversation, {"text": "And bo", "agent": "support"}, "r2")
    assert again.submission is not None
    storage.read.clear()
    Scheduler(kernel, "w").run_until_idle()
    stored = kernel.storage.submission(again.submission.id)
    assert stored is not None and stored.status is SubmissionStatus.ANSWERED
    assert noted.ran == ["ana"] and noted.asked == [0, 1, 2]  # it answers from the history
    assert storage.read and not earlier & set(storage.read)


def history_bytes_after(turns: int, artifact_above: int | None = None,
                        whole_first: bool = False) -> tuple[int, list[Any]]:
    """Bytes written for a conversation's history document over ``turns`` turns of an
    agent that answers each in about a kilobyte (stand-ins counted as what they stand
    for: an artifact is stored too), and the history the last turn left."""
    from kernel.documents import weight
    from kernel.hosts.pydantic_ai import HISTORY

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=[TextPart(f"answer {len(messages)} " + "x" * 1000)])

    storage = InMemoryStorage()
    registry = Registry()
    register_agent(registry, "support",
                   Agent(FunctionModel(model), name="support", capabilities=[KernelDurability()]))
    kernel = Kernel(storage, registry, ManualClock(), artifact_above=artifact_above)
    handle = kernel.create_session()
    draft = Draft()
    conversation = draft.create_conversation()
    handle.commit(draft)
    if whole_first:  # a history set whole (as before appends), stored apart as an artifact
        from pydantic_ai.messages import ModelMessagesTypeAdapter, ModelRequest

        draft = Draft()
        draft.set(HISTORY, conversation, ["messages"], ModelMessagesTypeAdapter.dump_python(
            [ModelRequest.user_text_prompt("hello"),
             ModelResponse(parts=[TextPart("y" * 2000)])], mode="json"))
        handle.commit(draft)
    for n in range(turns):
        submit(handle, conversation, {"text": f"question {n}", "agent": "support"}, f"r{n}")
        Scheduler(kernel, "w").run_until_idle()
    head = storage.document_head(handle.id, HISTORY, conversation)
    assert head is not None
    written = storage._versions[head.id]  # every version the reference storage holds
    total = sum(weight(v.ops) + (weight(v.baseline) if v.has_baseline else 0) for v in written)
    sets = [op for v in written for op in v.ops if op["op"] == "set"]
    # The first turn's value (or the whole set before it) is the first version's baseline,
    # kept once (kernel.storage.as_stored); every later turn appends.
    assert written[0].has_baseline and not sets, sets
    return total, kernel.document(handle.id, HISTORY, conversation)["messages"]


def test_a_conversations_history_costs_what_each_turn_adds_not_itself_again() -> None:
    """Each turn appends its messages to the history document: over twice the turns,
    about twice the bytes (whole values at each turn would be about four times), and
    the history read back is every message of every turn, in order."""
    short, _ = history_bytes_after(20)
    long, messages = history_bytes_after(40)
    assert long < 2.6 * short, (short, long)
    assert len(messages) == 80
    prompts = [p["content"] for m in messages if m["kind"] == "request" for p in m["parts"]]
    assert prompts == [f"question {n}" for n in range(40)]


def test_turns_append_to_a_history_stored_whole_apart_and_read_back_every_message() -> None:
    """A conversation whose history was set whole and stored apart (an artifact: what
    earlier turns left) takes the next turns' messages as appends: the stand-in is read
    back where a baseline is due, and the history read back holds it all, in order."""
    _, messages = history_bytes_after(12, artifact_above=1000, whole_first=True)
    assert len(messages) == 2 + 24
    assert messages[1]["parts"][0]["content"] == "y" * 2000
    prompts = [p["content"] for m in messages[2:] if m["kind"] == "request"
               for p in m["parts"]]
    assert prompts == [f"question {n}" for n in range(12)]


def test_a_turn_is_blocked_where_a_tool_it_was_started_with_is_gone_or_changed() -> None:
    """A turn records its agent's model and function tools; a worker whose agent lacks
    a tool, or takes other arguments for it, or replays it otherwise, or has another
    model, leaves the turn blocked for an operator (its journal holds calls made for the
    tools as they were, and that model's answers) without asking the model; a tool added
    is compatible."""
    from kernel import Worker
    from kernel.environment import BLOCKED_DOCUMENT

    world = World()
    kernel, session_id, conversation, submission = world.start()
    turn = turn_of(kernel, session_id).id

    def deployed(notify: Any, extra: Any = None, model_name: str | None = None) -> Kernel:
        agent = Agent(FunctionModel(world.model, model_name=model_name), name="support",
                      output_type=Ticket, capabilities=[KernelDurability()])

        @agent.tool_plain(metadata=SAFE)
        def lookup(customer: str) -> str:
            return f"{customer} <ana@example.com>"

        for tool in (notify, extra):
            if tool is not None:
                options = dict(tool)
                agent.tool_plain(options.pop("function"), **options)
        registry = Registry()
        register_agent(registry, "support", agent)
        return Kernel(world.storage, registry, world.clock)

    def notify(to: str) -> str:
        return f"sent to {to}"

    def notify_cc(to: str, cc: str) -> str:
        return f"sent to {to}, {cc}"

    def close(ticket: str) -> str:
        return ticket

    def blocked(changed: Kernel) -> list[str]:
        assert not Worker(changed, "w2").advance(turn)
        return list(changed.document(session_id, BLOCKED_DOCUMENT, turn)["differences"])

    (gone,) = blocked(deployed(None))
    assert gone.startswith("tool notify: missing here (it was started with parameters ")
    (other,) = blocked(deployed({"function": notify_cc, "name": "notify"}))
    assert other.startswith("tool notify: parameters ") and "replay unsafe" in other
    (replay,) = blocked(deployed({"function": notify, "metadata": SAFE}))
    assert "replay safe, runs in the turn here, it was started with" in replay
    (model,) = blocked(deployed({"function": notify}, model_name="another"))
    assert model.startswith("model: function:another here, it was started with function:")
    assert world.model_calls == [] and world.effects == []

    assert Worker(deployed({"function": notify}, {"function": close}), "w3").advance(turn)
    assert world.model_calls == [0, 1, 2]
    stored = kernel.storage.submission(submission)
    assert stored is not None and stored.status is SubmissionStatus.ANSWERED


class Refund(BaseModel):
    customer: str
    amount: int


def test_a_turn_is_blocked_where_its_agents_output_changed() -> None:
    """A turn records its agent's output (the schema and mode the final answer is
    validated with, whether text may answer): its journal holds an answer given for the
    output as it was, which a replay validates again. A worker whose agent has another
    output leaves the turn blocked, naming the output, and asks the model nothing. Other
    instructions or model settings are what a deploy changes for the requests still to
    come, and deferred calls newly allowed cannot be in a journal made without them: the
    turn goes on from its answer."""
    from datetime import timedelta

    from pydantic_ai import NativeOutput
    from pydantic_ai.tools import DeferredToolRequests

    from kernel import Worker
    from kernel.environment import BLOCKED_DOCUMENT

    world = World(crash_on={"validate"})
    kernel, session_id, conversation, submission = world.start()
    with pytest.raises(Crash):  # the answer is committed; its validation was cut
        world.run()
    world.crash_on = set()
    world.clock.advance(timedelta(hours=1))  # the dead worker's lease has run out
    turn = turn_of(kernel, session_id).id
    asked = list(world.model_calls)

    def blocked(output_type: Any) -> str:
        world.output_type = output_type
        changed = world.kernel()
        assert not Worker(changed, "w2").advance(turn)
        (difference,) = changed.document(session_id, BLOCKED_DOCUMENT, turn)["differences"]
        return str(difference)

    assert blocked(Refund).startswith("output: ")
    assert blocked(NativeOutput(Ticket)).startswith("output: ")
    assert blocked([Ticket, str]).startswith("output: ")
    assert world.model_calls == asked and "validate" not in world.effects[3:]

    world.output_type = [Ticket, DeferredToolRequests]
    world.options = {"instructions": "Be brief.", "model_settings": {"temperature": 0.1}}
    assert Worker(world.kernel(), "w3").advance(turn)
    assert world.model_calls == asked  # the answer was replayed, not asked for again
    assert turn_of(kernel, session_id).outcome["result"]["output"] == {
        "customer": "ana", "notified": True}


def test_a_turn_is_blocked_where_a_tool_it_called_asks_for_approval_first() -> None:
    """A turn records whether each tool asks for approval: its journal holds calls made
    (and run) as the tool was. Replayed where the tool that ran asks for approval first,
    the framework would defer the call that ran and an operator be asked about a call
    already made; the turn is blocked, naming the tool, its model asked nothing."""
    from datetime import timedelta

    from pydantic_ai.tools import DeferredToolRequests

    from kernel import Worker
    from kernel.environment import BLOCKED_DOCUMENT

    world = World(crash_on={"validate"})
    kernel, session_id, conversation, submission = world.start()
    with pytest.raises(Crash):  # notify ran; the answer is committed, its check was cut
        world.run()
    world.crash_on = set()
    world.clock.advance(timedelta(hours=1))
    turn = turn_of(kernel, session_id).id
    asked = list(world.model_calls)

    world.output_type = [Ticket, DeferredToolRequests]
    world.notify_options = {"requires_approval": True}
    changed = world.kernel()
    assert not Worker(changed, "w2").advance(turn)
    (difference,) = changed.document(session_id, BLOCKED_DOCUMENT, turn)["differences"]
    assert difference.startswith("tool notify: ") and "approval" in difference
    assert world.model_calls == asked and world.effects.count("notify:ana@example.com") == 1


def test_a_turn_is_blocked_where_its_agent_ends_on_an_answer_otherwise() -> None:
    """The end strategy decides whether the calls an answer comes with run: a turn whose
    answer is committed, taken over where its agent's strategy is another, would run
    (or skip) calls its run skipped (or ran) on the same answer. It is blocked, naming
    the output; under the same strategy it ends on its answer."""
    from datetime import timedelta

    from kernel import Worker
    from kernel.environment import BLOCKED_DOCUMENT

    world = World(crash_on={"validate"}, final_call=True, options={"end_strategy": "early"})
    kernel, session_id, conversation, submission = world.start()
    with pytest.raises(Crash):  # the answer is committed; its validation was cut
        world.run()
    world.crash_on = set()
    world.clock.advance(timedelta(hours=1))
    turn = turn_of(kernel, session_id).id

    world.options = {"end_strategy": "exhaustive"}
    changed = world.kernel()
    assert not Worker(changed, "w2").advance(turn)
    (difference,) = changed.document(session_id, BLOCKED_DOCUMENT, turn)["differences"]
    assert difference.startswith("output: ")
    assert "lookup:ben" not in world.effects

    world.options = {"end_strategy": "early"}
    assert Worker(world.kernel(), "w3").advance(turn)
    assert "lookup:ben" not in world.effects and world.model_calls == [0, 1, 2]
    assert turn_of(kernel, session_id).outcome["kind"] == "succeeded"


def test_a_hosted_turn_is_not_started_again_from_a_phase_and_says_why() -> None:
    """Run from a phase again, a hosted turn would replay its journal and find its
    conversation's history moved on by its own end (the framework refuses a run whose
    id the history holds already): the restart is refused, and nothing changes."""
    from kernel import IllegalTransition
    from kernel.forks import no_restart, phase_entries

    world = World()
    kernel, session_id, conversation, submission = world.start()
    world.run()
    turn = turn_of(kernel, session_id)
    (entered, *_) = phase_entries(turn.id, kernel.storage.commits_after(session_id, 0, 1000))
    refused = no_restart(turn, kernel.registry.latest(turn.kind))
    assert refused is not None and "Submit the request again" in refused
    draft = Draft(actor="user:olga")
    draft.restart(turn.id, entered, expected_seq=turn.updated_seq)
    with pytest.raises(IllegalTransition, match="does not start again from a phase"):
        kernel.open(session_id).commit(draft)
    assert kernel.task(turn.id) == turn
    assert world.model_calls == [0, 1, 2]


def reused_id_world(storage: InMemoryStorage, noted: Noted, crash_on: set[str]) -> Kernel:
    """An agent whose model numbers its calls per response, so that both of its
    responses call ``notify`` (unsafe) as ``call_0``; then it answers. What the model
    is told of each call, and what each call ran with its operation id, in ``noted``."""
    from kernel.hosts.pydantic_ai import operation_id

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        step = sum(1 for m in messages if m.kind == "response")
        noted.asked.append(step)
        if step < 2:
            return ModelResponse(parts=[ToolCallPart("notify", {"to": ["ana", "bo"][step]},
                                                     tool_call_id="call_0")])
        return ModelResponse(parts=[TextPart("Done.")])

    agent = Agent(FunctionModel(model), name="support", capabilities=[KernelDurability()])

    @agent.tool
    def notify(ctx: RunContext[None], to: str) -> str:
        noted.ran.append(f"{to} {operation_id(ctx)}")
        if to in crash_on:
            crash_on.discard(to)
            raise Crash()
        return f"sent to {to}"

    registry = Registry()
    register_agent(registry, "support", agent)
    return Kernel(storage, registry, noted.clock)


def test_a_call_id_an_earlier_response_used_is_another_call_run_once() -> None:
    """A model may reuse a call id across responses (some number their calls per
    response): the second ``call_0`` is a call of its own, as in a plain run: it runs
    (once, though a crash cuts it), its result is its own, and its operation id is not
    the first one's."""
    storage, noted, crash_on = InMemoryStorage(), Noted(), {"bo"}
    kernel = reused_id_world(storage, noted, crash_on)
    session_id, conversation, submission = started(kernel)
    crashes = run_across_crashes(lambda: reused_id_world(storage, noted, crash_on),
                                 noted.clock, crashes_allowed=1, advance_clock=True)
    assert crashes == 1
    turn = turn_of(kernel, session_id)
    assert turn.status is Status.WAITING and turn.wait == {"signal": "resolution:call_0#2:1"}
    draft = Draft(actor="user:op")
    draft.signal(turn.id, "resolution:call_0#2:1",
                 {"decision": "happened", "by": "user:op", "reason": "seen",
                  "receipt": {"result": "sent to bo (checked)"}}, step_epoch=turn.epoch)
    kernel.open(session_id).commit(draft)
    Scheduler(reused_id_world(storage, noted, crash_on), "w").run_until_idle()
    assert [ran.split()[0] for ran in noted.ran] == ["ana", "bo"]
    first, second = (ran.split()[1] for ran in noted.ran)
    assert first == f"op_{turn.id}_call_0" and second != first
    stored = kernel.storage.submission(submission)
    assert stored is not None and stored.status is SubmissionStatus.ANSWERED
    told = [e.payload.get("result") for e in kernel.entries(conversation)
            if e.kind == "tool_result"]
    assert told == ["sent to ana", "sent to bo (checked)"]
    assert noted.asked == [0, 1, 2]


def test_an_unsafe_result_the_storage_refuses_fails_the_turn_naming_it_asking_nothing_more(
) -> None:
    """The storage refuses the commit of an unsafe call's result (made while the run goes
    on): the turn fails with the storage's error, its submission is released, and the
    model is not asked again for a run that cannot go on."""
    asked: list[int] = []
    armed: dict[str, BaseException] = {}

    def fault(point: str) -> None:
        error = armed.pop(point, None)
        if error is not None:
            raise error

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        asked.append(len(asked))
        if len(asked) == 1:
            return ModelResponse(parts=[ToolCallPart("notify", {"to": "ana"}, tool_call_id="c1")])
        return ModelResponse(parts=[TextPart("Done.")])

    agent = Agent(FunctionModel(model), name="support", capabilities=[KernelDurability()])

    @agent.tool_plain
    def notify(to: str) -> str:
        armed["before_write"] = RuntimeError("the disk is full")  # the result's commit
        return "sent"

    registry = Registry()
    register_agent(registry, "support", agent)
    kernel = Kernel(InMemoryStorage(fault=fault), registry, ManualClock())
    session_id, conversation, submission = started(kernel)
    Scheduler(kernel, "w").run_until_idle()
    turn = turn_of(kernel, session_id)
    assert turn.outcome is not None and turn.outcome["kind"] == "failed"
    assert "the disk is full" in turn.outcome["error"], turn.outcome
    assert asked == [0]
    stored = kernel.storage.submission(submission)
    assert stored is not None and stored.status is SubmissionStatus.FAILED


class Address(BaseModel):
    city: str


@pytest.mark.parametrize("runs", ["in the turn", "on hands"])
def test_an_unsafe_call_with_typed_parameters_runs_and_its_intent_holds_them_as_json(
    runs: str
) -> None:
    """A tool whose parameters validate to values JSON does not hold (a datetime, a
    model, a set) runs as in a plain run: its intent (or its hands task's input) holds
    the arguments as JSON, the tool gets the validated values."""
    from kernel.hosts.pydantic_ai import HANDS

    got: list[Any] = []
    crash_on = {"book"}

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if sum(1 for m in messages if m.kind == "response") == 0:
            return ModelResponse(parts=[ToolCallPart("book", {
                "when": "2024-01-02T10:00:00Z", "to": {"city": "Oslo"}, "tags": ["a"]},
                tool_call_id="c1")])
        return ModelResponse(parts=[TextPart("Done.")])

    storage, clock = InMemoryStorage(), ManualClock()

    def kernel() -> Kernel:
        agent = Agent(FunctionModel(model), name="support", capabilities=[KernelDurability()])

        @agent.tool_plain(metadata=HANDS if runs == "on hands" else None)
        def book(when: datetime, to: Address, tags: set[str]) -> str:
            got.append((when.year, to.city, tags))
            if "book" in crash_on:
                crash_on.discard("book")
                raise Crash()
            return "booked"

        registry = Registry()
        register_agent(registry, "support", agent)
        return Kernel(storage, registry, clock)

    session_id, conversation, submission = started(kernel())
    assert run_across_crashes(kernel, clock, crashes_allowed=1, advance_clock=True) == 1
    (waiting,) = [t for t in storage.session_tasks(session_id) if t.wait is not None
                  and t.wait.get("signal") == "resolution:c1:1"]
    assert waiting.checkpoint["intents"]["c1"]["arguments"] == {
        "when": "2024-01-02T10:00:00Z", "to": {"city": "Oslo"}, "tags": ["a"]}
    draft = Draft(actor="user:op")
    draft.signal(waiting.id, "resolution:c1:1", {"decision": "run_again", "by": "user:op",
                                                 "reason": "not booked"},
                 step_epoch=waiting.epoch)
    kernel().open(session_id).commit(draft)
    Scheduler(kernel(), "w").run_until_idle(advance_clock=True)
    assert got == [(2024, "Oslo", {"a"})] * 2
    stored = storage.submission(submission)
    assert stored is not None and stored.status is SubmissionStatus.ANSWERED


def test_a_turn_cancelled_on_a_reused_call_id_tells_the_next_turn_each_calls_own_outcome(
) -> None:
    """The second ``call_0`` of a turn is cut mid-way and the turn cancelled: the next
    turn's model is told the first call's result for the first and that the second was
    cancelled, not the first one's result for both."""
    from pydantic_ai.messages import ModelMessagesTypeAdapter, ModelRequest, ToolReturnPart

    from kernel.hosts.pydantic_ai import HISTORY

    storage, noted, crash_on = InMemoryStorage(), Noted(), {"bo"}
    kernel = reused_id_world(storage, noted, crash_on)
    session_id, conversation, submission = started(kernel)
    run_across_crashes(lambda: reused_id_world(storage, noted, crash_on), noted.clock,
                       crashes_allowed=1, advance_clock=True)
    turn = turn_of(kernel, session_id)
    assert turn.wait == {"signal": "resolution:call_0#2:1"}
    draft = Draft(actor="user:op")
    draft.cancel(turn.id, "stop")
    kernel.open(session_id).commit(draft)
    Scheduler(reused_id_world(storage, noted, crash_on), "w").run_until_idle(advance_clock=True)
    left = ModelMessagesTypeAdapter.validate_python(
        kernel.document(session_id, HISTORY, conversation)["messages"])
    told = [p.content for m in left if isinstance(m, ModelRequest) for p in m.parts
            if isinstance(p, ToolReturnPart)]
    assert told[0] == {"result": "sent to ana"}
    assert told[1]["cancelled"] is True and told[1]["reason"] == "cancelled by user:op: stop"


@pytest.mark.parametrize("metadata", [SAFE, None], ids=["safe", "unsafe"])
def test_a_call_whose_result_no_storage_holds_is_answered_as_having_run(
    metadata: Any,
) -> None:
    """A tool that returned what no storage holds (text with NUL) has run: the model is
    told so, with why its result is not shown, and the turn goes on, as a native turn's
    call is answered. The turn failed, with the call's result uncommitted: an unsafe call
    that certainly ran was left uncertain, a safe one's next request thrown away."""
    from pydantic_ai.messages import ToolReturnPart

    effects: list[str] = []
    seen: list[Any] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.extend(p for m in messages for p in m.parts if isinstance(p, ToolReturnPart))
        if not any(m.kind == "response" for m in messages):
            return ModelResponse(parts=[ToolCallPart("read", {"path": "a.bin"},
                                                     tool_call_id="c1")])
        return ModelResponse(parts=[TextPart("Done.")])

    agent = Agent(FunctionModel(model), name="support", capabilities=[KernelDurability()])

    @agent.tool_plain(metadata=metadata)
    def read(path: str) -> str:
        effects.append(path)
        return "\x00\x01binary"

    registry = Registry()
    register_agent(registry, "support", agent)
    kernel = Kernel(InMemoryStorage(), registry, ManualClock())
    handle = kernel.create_session()
    draft = Draft()
    conversation = draft.create_conversation()
    handle.commit(draft)
    submitted = submit(handle, conversation, {"text": "read it", "agent": "support"}, "r1")
    assert submitted.submission is not None
    Scheduler(kernel).run_until_idle()
    turn = turn_of(kernel, handle.id)
    assert turn.outcome is not None and turn.outcome["kind"] == "succeeded", turn.outcome
    assert effects == ["a.bin"]
    (told,) = seen
    assert "ran" in str(told.content) and "cannot be stored" in str(told.content)
    (result,) = [e.payload for e in kernel.entries(conversation) if e.kind == "tool_result"]
    assert "cannot be stored" in result["error"] and "NUL" in result["error"]


def test_a_turn_is_blocked_where_a_toolset_of_its_agent_changed() -> None:
    """A turn records the tools of its agent's other toolsets too (a toolset of the
    user's own, wrapped in a prefix), as it does its function tools: its journal may hold
    calls made for them as they were. A worker whose agent lacks the toolset, or offers
    one of its tools with other parameters, leaves the turn blocked naming the toolset
    and asks the model nothing; one offering the same toolset goes on, a toolset added
    beside it being compatible (as every toolset is for a turn that recorded none)."""
    from datetime import timedelta

    from pydantic_ai.toolsets import FunctionToolset

    from kernel import Worker
    from kernel.environment import BLOCKED_DOCUMENT

    def search(query: str) -> str:
        return query

    def search_more(query: str, limit: int) -> str:
        return query

    def crm(*tools: Any) -> list[Any]:
        return [FunctionToolset(list(tools), id="crm").prefixed("crm")]

    world = World(crash_on={"validate"}, options={"toolsets": crm(search)})
    kernel, session_id, conversation, submission = world.start()
    with pytest.raises(Crash):  # the answer is committed; its validation was cut
        world.run()
    world.crash_on = set()
    world.clock.advance(timedelta(hours=1))  # the dead worker's lease has run out
    turn = turn_of(kernel, session_id).id
    asked = list(world.model_calls)

    def blocked(toolsets: list[Any]) -> str:
        world.options = {"toolsets": toolsets}
        changed = world.kernel()
        assert not Worker(changed, "w2").advance(turn)
        (difference,) = changed.document(session_id, BLOCKED_DOCUMENT, turn)["differences"]
        return str(difference)

    search_more.__name__ = "search"
    assert blocked(crm(search_more)).startswith("toolset crm: ")
    assert blocked([]).startswith("toolset crm: missing here")
    assert world.model_calls == asked

    world.options = {"toolsets": [*crm(search), FunctionToolset([search_more], id="docs")]}
    assert Worker(world.kernel(), "w3").advance(turn)
    assert world.model_calls == asked
    assert turn_of(kernel, session_id).outcome["result"]["output"] == {
        "customer": "ana", "notified": True}


def test_a_toolset_is_recorded_as_far_as_it_can_be_read_without_a_connection() -> None:
    """An external toolset's tools are declared where it is registered: one of them
    changed is a difference. An MCP server's tools are listed at a connection, during a
    run: the turn records where the server is (its URL, or its command and arguments),
    and another address is a difference; its tools are not read."""
    from types import SimpleNamespace

    from pydantic_ai.models.test import TestModel
    from pydantic_ai.tools import ToolDefinition
    from pydantic_ai.toolsets import AbstractToolset, ExternalToolset

    from kernel.environment import differences
    from kernel.hosts.pydantic_ai.definition import toolset_needs

    class Server(AbstractToolset[None]):
        """A stand-in for an MCP server's toolset: its client's transport says where it
        is; listing its tools would need a connection."""

        def __init__(self, **transport: Any) -> None:
            self.client = SimpleNamespace(transport=SimpleNamespace(**transport))

        @property
        def id(self) -> str | None:
            return "crm"

        async def get_tools(self, ctx: Any) -> Any:
            raise AssertionError("listed where the agent was registered")

        async def call_tool(self, name: str, tool_args: Any, ctx: Any, tool: Any) -> Any:
            raise AssertionError("called where the agent was registered")

    def needs(*toolsets: Any) -> dict[str, Any]:
        agent = Agent(TestModel(), toolsets=list(toolsets))
        return toolset_needs(agent)

    def asks(**parameters: Any) -> ExternalToolset[None]:
        schema = {"type": "object", "properties": parameters}
        return ExternalToolset(
            [ToolDefinition(name="ask", parameters_json_schema=schema)], id="desk")

    started = needs(asks(question={"type": "string"}),
                    Server(url="https://crm.example/mcp"))
    assert differences(started, needs(asks(question={"type": "string"}),
                                      Server(url="https://crm.example/mcp"))) == []
    (changed,) = differences(started, needs(asks(question={"type": "integer"}),
                                            Server(url="https://crm.example/mcp")))
    assert changed.startswith("toolset desk: ")
    (moved,) = differences(started, needs(asks(question={"type": "string"}),
                                          Server(url="https://crm2.example/mcp")))
    assert moved.startswith("toolset crm: ")
    assert needs(Server(command="uvx", args=["crm-mcp"])) != needs(
        Server(command="uvx", args=["crm-mcp", "--beta"]))
