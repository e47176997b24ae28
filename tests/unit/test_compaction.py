"""Compaction on the reference storage: the older part of a conversation summarized by
the model as a durable task, a context-overflow answer compacted once, crashes during
and after the summary request, a fork after a compaction, an operator's request."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from kernel import DocumentConflict, Draft, Kernel, Scheduler, SubmissionStatus
from kernel.agent import (
    COMPACTION,
    Compaction,
    ContextOverflowError,
    ModelRequest,
    ModelResponse,
    Pending,
    ScriptedProvider,
    ToolCall,
    submit,
)
from kernel.agent.compaction import STARTED, estimate_tokens, plan, start
from kernel.agent.context import SUMMARY_INTRO, messages
from kernel.records import SUMMARY, Entry, position

from .agent_world import World
from .crashes import Crash

PAGES = 2
WINDOW = 20_000
USAGE = {"input_tokens": 10, "output_tokens": 2}
SUMMARY_USAGE = {"input_tokens": 50, "output_tokens": 5}


def reader(request: ModelRequest) -> ModelResponse:
    """Reads PAGES pages for each user message (each a 5 KB tool result), then answers;
    a summary request is answered with how many pages the part it covers holds."""
    if request.purpose == "compaction":
        pages = sum(1 for m in request.messages if m["role"] == "tool")
        return ModelResponse(f"the user asked for pages; {pages} were read", (), SUMMARY_USAGE)
    asked = max(i for i, m in enumerate(request.messages) if m["role"] == "user")
    text = request.messages[asked]["content"]
    read = sum(1 for m in request.messages[asked + 1:] if m["role"] == "tool")
    if read < PAGES:
        call = ToolCall(f"{text}-{read}", "page", {"n": f"{text}-{read}"})
        return ModelResponse("", (call,), USAGE)
    return ModelResponse(f"read {text}", (), USAGE)


def converse(world: World, messages: int) -> tuple[Kernel, Any, str]:
    kernel, handle, conversation, _ = world.start("m0", request_id="req-0")
    world.run()
    for number in range(1, messages):
        submit(handle, conversation, {"text": f"m{number}"}, f"req-{number}")
        world.run()
    return kernel, handle, conversation


def summaries(kernel: Kernel, conversation: str) -> list[Entry]:
    return [e for e in kernel.entries(conversation) if e.kind == SUMMARY]


def turn_requests(world: World) -> list[ModelRequest]:
    return [r for r in world.provider.requests if r.purpose == "turn"]


def assert_whole_calls(kernel: Kernel, conversation: str, summary: Entry) -> None:
    """Every call the summary covers has its result covered too, and the reverse."""
    last = summary.payload["covers"]["last"]
    end = (last["seq"], last["ordinal"])
    entries = kernel.entries(conversation)
    covered = {e.id for e in entries if e.kind != SUMMARY and position(e) <= end}
    for entry in entries:
        for call in entry.payload.get("tool_calls", []) if entry.kind == "model_response" else []:
            result = next(e for e in entries if e.kind == "tool_result"
                          and e.payload["call_id"] == call["id"])
            assert (entry.id in covered) == (result.id in covered)


def test_a_context_past_the_threshold_is_summarized_and_later_requests_start_with_it() -> None:
    world = World(ScriptedProvider(reader), compaction=Compaction({"scripted": WINDOW}))
    kernel, handle, conversation = converse(world, 10)
    made = summaries(kernel, conversation)
    assert made, "ten messages of two 5 KB pages each pass 80% of a 20,000-token window"
    for summary in made:
        assert_whole_calls(kernel, conversation, summary)
        assert summary.payload["reason"] == "threshold"
        assert summary.payload["covers"]["first"]["id"] == kernel.entries(conversation)[0].id
    # No turn request was sent past the threshold; the ones after a summary open with it.
    sent = turn_requests(world)
    assert all(estimate_tokens([r.messages, r.tools]) <= WINDOW * 0.8 for r in sent)
    latest = kernel.context(conversation)
    assert latest[0].id == made[-1].id
    assert sent[-1].messages[0]["content"] == SUMMARY_INTRO + made[-1].payload["text"]
    # The transcript keeps every entry; each message was answered.
    assert sum(e.kind == "tool_result" for e in kernel.entries(conversation)) == 10 * PAGES
    subs = [kernel.storage.submission_by_request(handle.id, f"req-{n}") for n in range(1, 10)]
    assert all(s.status is SubmissionStatus.ANSWERED for s in subs)
    # The summary requests' tokens are counted with the conversation's.
    usage = kernel.document(handle.id, "agent-usage", "session")
    assert usage["total"]["input_tokens"] == 10 * len(sent) + 50 * len(made)
    own = kernel.document(handle.id, "agent-usage", f"conversation:{conversation}")
    assert own["models"]["scripted"]["input_tokens"] == 10 * len(sent) + 50 * len(made)


def overflowing(limit: int, always: bool = False) -> ScriptedProvider:
    def script(request: ModelRequest) -> ModelResponse:
        if request.purpose == "turn" and (
            always or estimate_tokens([request.messages, request.tools]) > limit
        ):
            raise ContextOverflowError("model server answered 400 (context_length_exceeded)")
        return reader(request)

    return ScriptedProvider(script)


def test_a_context_overflow_answer_is_compacted_and_asked_again_once() -> None:
    world = World(overflowing(9_000))  # no window configured: the model's answer tells
    kernel, handle, conversation = converse(world, 6)
    made = summaries(kernel, conversation)
    assert made and all(s.payload["reason"] == "overflow" for s in made)
    subs = [kernel.storage.submission_by_request(handle.id, f"req-{n}") for n in range(1, 6)]
    assert all(s.status is SubmissionStatus.ANSWERED for s in subs)
    tasks = [t for t in kernel.storage.session_tasks(handle.id) if t.kind == COMPACTION]
    assert len(tasks) == len(made)  # one compaction per overflow answer


def test_each_compaction_started_is_named_and_a_start_expecting_an_older_one_is_refused(
) -> None:
    """A turn's compaction names itself in the conversation's record of compactions
    started, in the commit that creates it; an operator's start that read that record
    before (two asked at once, or a turn's started meanwhile) is refused and writes
    nothing, so the same entries are not summarized twice."""
    world = World(overflowing(9_000))
    kernel, handle, conversation = converse(world, 6)
    tasks = [t for t in kernel.storage.session_tasks(handle.id) if t.kind == COMPACTION]
    assert len(tasks) >= 2
    record, version = kernel.versioned_document(handle.id, STARTED, conversation)
    assert version == len(tasks)
    assert record == {"task": tasks[-1].id, "reason": "overflow", "by": tasks[-1].input["by"]}

    head = kernel.storage.session(handle.id).head_seq
    stale = Draft(actor="user:op")
    start(stale, conversation, {"reason": "operator", "by": "user:op"},
          expected_version=version - 1)
    with pytest.raises(DocumentConflict, match=f"at version {version}"):
        handle.commit(stale)
    assert kernel.storage.session(handle.id).head_seq == head
    current = Draft(actor="user:op")
    made = start(current, conversation, {"reason": "operator", "by": "user:op"},
                 expected_version=version)
    handle.commit(current)
    assert kernel.document(handle.id, STARTED, conversation)["task"] == made
    assert kernel.task(made).input == {"reason": "operator", "by": "user:op",
                                       "conversation_id": conversation}


def test_a_context_still_too_long_after_compaction_ends_the_turn_after_one_compaction() -> None:
    world = World(overflowing(0, always=True))
    kernel, handle, conversation, submitted = world.start("m0")
    world.run()
    tasks = [t for t in kernel.storage.session_tasks(handle.id) if t.kind == COMPACTION]
    assert len(tasks) == 1
    turn_asks = turn_requests(world)
    assert len(turn_asks) == 2  # asked, compacted (nothing to summarize yet), asked once more
    stored = kernel.storage.submission(submitted.submission.id)
    assert stored.status is SubmissionStatus.UNANSWERED
    assert "too long for the model even after compaction" in (stored.reason or "")


def crash_on_summary(provider: ScriptedProvider, when: str) -> list[str]:
    """The first summary request kills its process ``before`` or ``after`` the model
    answered; returns the log of summary requests."""
    real = provider.generate
    log: list[str] = []

    def generate(request: ModelRequest, on_text: Any) -> Any:
        if request.purpose != "compaction":
            return real(request, on_text)
        log.append("asked")
        if len(log) == 1 and when == "before":
            raise Crash()
        answer = real(request, on_text)
        if len(log) == 1 and when == "after":
            raise Crash()  # the answer is lost with the process: nothing was committed
        return answer

    provider.generate = generate  # type: ignore[method-assign]
    return log


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_crash_during_the_summary_request_asks_again_and_commits_one_summary(
    when: str,
) -> None:
    world = World(ScriptedProvider(reader), compaction=Compaction({"scripted": WINDOW}))
    log = crash_on_summary(world.provider, when)
    kernel, handle, conversation, _ = world.start("m0", request_id="req-0")
    crashes = world.run(crashes_allowed=1)
    for number in range(1, 10):
        submit(handle, conversation, {"text": f"m{number}"}, f"req-{number}")
        crashes += world.run(crashes_allowed=1 - crashes)
    assert crashes == 1
    made = summaries(kernel, conversation)
    assert made
    first_task = made[0].payload["task"]
    # The interrupted request was sent again; no summary came of the lost one.
    assert len(log) == len(made) + 1
    task = kernel.task(first_task)
    assert task.outcome is not None and task.outcome["kind"] == "succeeded"
    assert task.outcome["result"]["summaries"][0] == made[0].id
    assert task.checkpoint["attempt"] == 0 and task.checkpoint["passes"] >= 1
    usage = kernel.document(handle.id, "agent-usage", "session")
    # Only the answered, committed summary requests are counted.
    assert usage["total"]["input_tokens"] == 10 * len(turn_requests(world)) + 50 * len(made)


def test_a_crash_right_after_the_summary_commit_keeps_exactly_that_summary() -> None:
    world = World(ScriptedProvider(reader), compaction=Compaction({"scripted": WINDOW}))
    armed: list[bool] = []
    real = world.provider.generate

    def generate(request: ModelRequest, on_text: Any) -> Any:
        answer = real(request, on_text)
        if request.purpose == "compaction" and not armed:
            armed.append(True)  # the next commit is the summary's: die just after it
        return answer

    world.provider.generate = generate  # type: ignore[method-assign]

    def fault(point: str) -> None:
        if point == "after_commit" and armed == [True]:
            armed.append(False)
            raise Crash()

    world.storage.fault = fault
    kernel, handle, conversation = converse_crashing(world, 10)
    assert armed == [True, False]
    made = summaries(kernel, conversation)
    summary_requests = [r for r in world.provider.requests if r.purpose == "compaction"]
    assert len(summary_requests) == len(made)  # the committed summary was not asked again
    subs = [kernel.storage.submission_by_request(handle.id, f"req-{n}") for n in range(1, 10)]
    assert all(s.status is SubmissionStatus.ANSWERED for s in subs)


def converse_crashing(world: World, messages: int) -> tuple[Kernel, Any, str]:
    kernel, handle, conversation, _ = world.start("m0", request_id="req-0")
    crashes = world.run(crashes_allowed=1)
    for number in range(1, messages):
        submit(handle, conversation, {"text": f"m{number}"}, f"req-{number}")
        crashes += world.run(crashes_allowed=1 - crashes)
    return kernel, handle, conversation


def test_a_fork_after_a_compaction_starts_from_the_summary() -> None:
    world = World(ScriptedProvider(reader), compaction=Compaction({"scripted": WINDOW}))
    kernel, handle, conversation = converse(world, 10)
    [*_, summary] = summaries(kernel, conversation)
    last = kernel.entries(conversation)[-1]
    draft = Draft()
    fork = draft.create_conversation(fork_of=conversation, fork_entry_id=last.id)
    handle.commit(draft)
    assert kernel.context(fork)[0].id == summary.id  # inherited, up to the fork point
    asked_before = len(turn_requests(world))
    submitted = submit(handle, fork, {"text": "f1"}, "req-fork")
    world.run()
    assert kernel.storage.submission(submitted.submission.id).status is SubmissionStatus.ANSWERED
    first = turn_requests(world)[asked_before]
    assert first.messages[0]["content"] == SUMMARY_INTRO + summary.payload["text"]
    assert first.messages[-1]["content"] == "f1"
    # Whatever the fork summarized since is its own: the origin's summaries are unchanged.
    assert summaries(kernel, conversation)[-1].id == summary.id
    assert all(e.conversation_id == fork for e in summaries(kernel, fork)[-1:]
               if e.id != summary.id)
    # The origin's context holds nothing the fork added.
    assert all(e.conversation_id == conversation for e in kernel.context(conversation))


def test_an_operator_asks_for_a_compaction() -> None:
    world = World(ScriptedProvider(reader))  # no window: only asked for
    kernel, handle, conversation = converse(world, 3)
    assert not summaries(kernel, conversation)
    draft = Draft(actor="user:op")
    draft.create_task(COMPACTION, {"conversation_id": conversation, "reason": "operator",
                                   "by": "user:op"})
    handle.commit(draft)
    Scheduler(world.kernel(), "w-op").run_until_idle()
    [summary] = summaries(kernel, conversation)
    assert summary.payload["reason"] == "operator"
    assert_whole_calls(kernel, conversation, summary)
    assert kernel.context(conversation)[0].id == summary.id
    assert len(kernel.context(conversation)) < len(kernel.entries(conversation))


def test_a_compaction_measures_the_context_with_the_tool_schemas_a_turn_sends() -> None:
    """A context that fits under the threshold only without the tool schemas is still
    due: the compaction summarizes again, as the turn that asked for it measures."""
    world = World(ScriptedProvider(reader), page_manual="x" * 32_000)
    kernel, handle, conversation = converse(world, 10)
    tools = turn_requests(world)[-1].tools
    window = 32_000  # the context alone is under its threshold after one pass, not with tools
    world.compaction = Compaction({"scripted": window}, keep=0.1, cover=0.1)
    draft = Draft(actor="user:op")
    draft.create_task(COMPACTION, {"conversation_id": conversation, "model": "scripted",
                                   "reason": "threshold", "by": "test"})
    handle.commit(draft)
    Scheduler(world.kernel(), "w-compact").run_until_idle()
    assert summaries(kernel, conversation)
    context = messages(kernel.context(conversation))
    assert not world.compaction.due("scripted", context, tools)


def entry(kind: str, seq: int, **payload: Any) -> Entry:
    return Entry(f"e{seq}", "s", "c", seq, 0, kind, payload, "system",
                 datetime(2026, 1, 1, tzinfo=UTC))


def test_the_cut_never_separates_a_call_from_its_result() -> None:
    big = "x" * 4000
    context = [
        entry("user", 1, text="go"),
        entry("model_response", 2, text="", tool_calls=[
            {"id": "a", "name": "t", "arguments": {}}, {"id": "b", "name": "t", "arguments": {}}]),
        entry("tool_result", 3, call_id="b", result=big),
        entry("tool_result", 4, call_id="a", result=big),
        entry("model_response", 5, text="done " + big),
        entry("user", 6, text="again"),
        entry("model_response", 7, text="", tool_calls=[{"id": "c", "name": "t",
                                                         "arguments": {}}]),
        entry("tool_result", 8, call_id="c", result=big),
        entry("model_response", 9, text="", tool_calls=[{"id": "d", "name": "t",
                                                         "arguments": {}}]),
    ]  # d has no result yet: its round is under way
    cuts = set()
    for keep in range(0, 8000, 50):
        found = plan(context, keep)
        if found is None:
            continue
        covered = {e.id for e in found.covered}
        cuts.add(len(covered))
        assert found.covers["last"]["id"] == found.covered[-1].id
        for e in context:
            for call in e.payload.get("tool_calls", []):
                result = next((r for r in context if r.payload.get("call_id") == call["id"]),
                              None)
                if e.id in covered:
                    assert result is not None and result.id in covered
        assert "e9" not in covered  # the open call, and always the newest entry
    # Cuts after e2 or e3 would split a and b from their results, after e7 c from its;
    # the small entries e6 and e7 are kept with the large one after them (cut 5), and a
    # want of 2 or 3 falls back to the legal cut 1.
    assert cuts == {1, 4, 5, 8}


def test_the_cut_keeps_an_open_call_whose_id_an_earlier_round_used() -> None:
    """Models that number their calls per response use one id in every round: the call
    under way is open even though an earlier call of its id has a result."""
    big = "x" * 4000
    call = [{"id": "call_0", "name": "t", "arguments": {}}]
    context = [
        entry("user", 1, text="go"),
        entry("model_response", 2, text="", tool_calls=call),
        entry("tool_result", 3, call_id="call_0", result=big),
        entry("model_response", 4, text="done " + big),
        entry("user", 5, text="again"),
        entry("model_response", 6, text="", tool_calls=call),  # its round is under way
        entry("user", 7, text="steered in meanwhile"),
    ]
    found = plan(context, keep_tokens=10)
    assert found is not None
    assert [e.id for e in found.covered] == ["e1", "e2", "e3", "e4", "e5"]


def test_a_round_is_cut_whole_where_each_round_reuses_one_call_id() -> None:
    """The call of an earlier round and its result may be covered while a later round's
    call of the same id and its result stay."""
    big = "x" * 4000
    call = [{"id": "call_0", "name": "t", "arguments": {}}]
    context = [
        entry("user", 1, text="go"),
        entry("model_response", 2, text="", tool_calls=call),
        entry("tool_result", 3, call_id="call_0", result=big),
        entry("model_response", 4, text="done"),
        entry("user", 5, text="again " + big),
        entry("model_response", 6, text="", tool_calls=call),
        entry("tool_result", 7, call_id="call_0", result=big),
        entry("model_response", 8, text="done"),
    ]
    found = plan(context, keep_tokens=1100)
    assert found is not None
    assert [e.id for e in found.covered] == ["e1", "e2", "e3", "e4", "e5"]


def test_an_earlier_summary_is_folded_into_the_next() -> None:
    earlier = entry(SUMMARY, 10, text="before", covers={
        "first": {"id": "e0", "seq": 0, "ordinal": 0},
        "last": {"id": "e1", "seq": 1, "ordinal": 0}})
    context = [earlier, entry("user", 2, text="a" * 4000), entry("user", 3, text="b" * 4000),
               entry("user", 4, text="c")]
    found = plan(context, keep_tokens=10)
    assert found is not None
    assert found.covered[0] is earlier
    assert found.covers == {"first": {"id": "e0", "seq": 0, "ordinal": 0},
                            "last": {"id": "e3", "seq": 3, "ordinal": 0}}
    assert plan(context[:2], keep_tokens=10) is None  # one entry beside it: nothing to cut


def test_a_turn_due_a_compaction_while_an_operators_is_under_way_waits_for_it() -> None:
    """An operator's compaction is under way (its summary request answered in the
    background) when a turn's request passes the threshold: the turn waits for that
    compaction instead of starting a second one over the same entries, then asks with
    its summary."""
    handles: list[str] = []

    def script(request: ModelRequest) -> ModelResponse | Pending:
        if request.purpose == "compaction":
            handles.append(f"h{len(handles)}")
            world.provider.background.pop(handles[-1], None)
            return Pending(handles[-1])
        return reader(request)

    world = World(ScriptedProvider(script))  # no window while the conversation grows
    kernel, handle, conversation = converse(world, 8)
    world.compaction = Compaction({"scripted": WINDOW})
    kernel = world.kernel()
    operator = Draft(actor="user:op")
    started_by_op = start(operator, conversation, {"reason": "operator", "by": "user:op"},
                          expected_version=kernel.document_version(handle.id, STARTED,
                                                                   conversation))
    handle.commit(operator)
    submit(handle, conversation, {"text": "m8"}, "req-8")
    world.run(advance_clock=False)  # the summary is not in yet: both wait

    tasks = [t for t in kernel.storage.session_tasks(handle.id) if t.kind == COMPACTION]
    assert [t.id for t in tasks] == [started_by_op]
    assert kernel.document(handle.id, STARTED, conversation)["task"] == started_by_op
    assert handles == ["h0"]  # one summary request, the operator's

    world.provider.background["h0"] = ModelResponse("the earlier pages", (), SUMMARY_USAGE)
    world.run()
    [summary] = summaries(kernel, conversation)
    assert summary.payload["task"] == started_by_op
    last = turn_requests(world)[-1]
    assert last.messages[0]["content"] == SUMMARY_INTRO + "the earlier pages"
    assert estimate_tokens([last.messages, last.tools]) <= WINDOW * 0.8
    answered = kernel.storage.submission_by_request(handle.id, "req-8")
    assert answered.status is SubmissionStatus.ANSWERED


def test_an_operators_compaction_started_after_the_turn_looked_is_waited_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The operator's compaction is committed after the turn found none under way and
    before the turn's own start: that start expects the record it read, so it is
    refused, and the turn, looking again, waits for the operator's."""
    from kernel.agent import turn

    handles: list[str] = []

    def script(request: ModelRequest) -> ModelResponse | Pending:
        if request.purpose == "compaction":
            handles.append(f"h{len(handles)}")
            return Pending(handles[-1])
        return reader(request)

    world = World(ScriptedProvider(script))
    kernel, handle, conversation = converse(world, 8)
    world.compaction = Compaction({"scripted": WINDOW})
    looked = turn.under_way
    landed: list[str] = []

    def look_then_an_operator_starts(run: Any, conversation_id: str) -> Any:
        seen = looked(run, conversation_id)
        if not landed:
            operator = Draft(actor="user:op")
            landed.append(start(operator, conversation, {"reason": "operator",
                                                         "by": "user:op"},
                                expected_version=seen[1]))
            handle.commit(operator)
        return seen

    monkeypatch.setattr(turn, "under_way", look_then_an_operator_starts)
    submit(handle, conversation, {"text": "m8"}, "req-8")
    world.run(advance_clock=False)
    tasks = [t.id for t in kernel.storage.session_tasks(handle.id) if t.kind == COMPACTION]
    assert tasks == landed
    assert handles == ["h0"]
    world.provider.background["h0"] = ModelResponse("the earlier pages", (), SUMMARY_USAGE)
    world.run()
    [summary] = summaries(kernel, conversation)
    assert summary.payload["task"] == landed[0]
    answered = kernel.storage.submission_by_request(handle.id, "req-8")
    assert answered.status is SubmissionStatus.ANSWERED
    assert not [e for e in kernel.entries(conversation) if e.kind == "interruption"]
