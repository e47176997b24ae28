"""The agent loop on the reference storage: submissions, turns, tools, and crashes at
the points that matter (the process "dies" by raising Crash, and a new scheduler
resumes from storage alone)."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from kernel import (
    Draft,
    Kernel,
    SubmissionStatus,
    Worker,
)
from kernel.agent import (
    ModelRequest,
    ModelResponse,
    Pending,
    PermanentModelError,
    ScriptedProvider,
    ToolCall,
    TransientModelError,
    WhenBusy,
    check_options,
    submit,
)
from kernel.agent.context import CANCELLED_NOTE, INTERRUPTED_NOTE, LOST_RESULT, messages
from kernel.records import Entry
from tests.unit.agent_world import RECIPIENTS, World, kinds, two_rounds
from tests.unit.crashes import Crash


def test_the_model_calls_the_batch_tool_and_answers_with_the_receipts() -> None:
    world = World(two_rounds())
    kernel, handle, conversation, submitted = world.start()
    assert submitted.outcome == "placed"
    world.run()
    stored = kernel.storage.submission(submitted.submission.id)
    assert stored.status is SubmissionStatus.ANSWERED
    answer = next(e for e in kernel.entries(conversation) if e.id == stored.answer_entry_id)
    assert all(f"msg-{to}" in answer.payload["text"] for to in RECIPIENTS)
    assert world.effects == [f"sent:{to}" for to in RECIPIENTS]
    assert kinds(kernel, conversation) == [
        "user",
        "model_response",
        "tool_result",
        "model_response",
    ]
    usage = kernel.document(handle.id, "agent-usage", "session")
    assert usage["total"] == {"input_tokens": 30, "output_tokens": 12}
    assert usage["conversations"][conversation]["input_tokens"] == 30
    # The conversation's own running totals, per model: what its transcript's total reads.
    own = kernel.document(handle.id, "agent-usage", f"conversation:{conversation}")
    assert own == {"models": {"scripted": {"input_tokens": 30, "output_tokens": 12}}}
    assert kernel.document(handle.id, "agent-conversation", conversation)["active"] is None


def test_a_crash_during_the_model_request_is_recorded_and_retried() -> None:
    provider = two_rounds()
    real = provider.generate
    calls: list[int] = []

    def crash_first(request: ModelRequest, on_text: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            on_text("I will now call the tool with recip")  # partial text, then death
            raise Crash()
        return real(request, on_text)

    provider.generate = crash_first  # type: ignore[method-assign]
    world = World(provider)
    kernel, handle, conversation, submitted = world.start()
    assert world.run(crashes_allowed=1) == 1
    assert kinds(kernel, conversation) == [
        "user",
        "interruption",
        "model_response",
        "tool_result",
        "model_response",
    ]
    assert world.effects == [f"sent:{to}" for to in RECIPIENTS]  # once, not from partial text
    assert kernel.storage.submission(submitted.submission.id).status is SubmissionStatus.ANSWERED


def test_a_crash_after_the_response_commit_runs_the_tools_once_without_asking_again() -> None:
    world = World(two_rounds())
    kernel, handle, conversation, submitted = world.start()
    turn = kernel.document(handle.id, "agent-conversation", conversation)["active"]
    worker = Worker(world.kernel(), "w0")
    worker.advance(turn)  # prepare -> request -> response committed with its tool task + wait
    assert len(world.provider.requests) == 1
    assert kinds(kernel, conversation) == ["user", "model_response"]
    world.run()  # a new process: the tool runs, then the second round
    assert world.effects == [f"sent:{to}" for to in RECIPIENTS]
    assert len(world.provider.requests) == 2


def test_replay_policies_decide_what_an_interrupted_tool_does() -> None:
    calls = [ToolCall("c1", "lookup", {"q": "x"}), ToolCall("c2", "charge", {"amount": 5})]

    def script(request: ModelRequest) -> ModelResponse:
        tools = [m for m in request.messages if m["role"] == "tool"]
        if tools:
            return ModelResponse(f"done: {[t['content'] for t in tools]}")
        return ModelResponse("", tuple(calls))

    world = World(ScriptedProvider(script), crash_on={"lookup", "charge"})
    kernel, handle, conversation, submitted = world.start()
    assert world.run(crashes_allowed=2) == 2
    assert world.effects.count("lookup:x") == 2  # safe: ran again
    assert world.effects.count("charge:5") == 1  # unsafe: never twice
    results = {
        e.payload["name"]: e.payload
        for e in kernel.entries(conversation)
        if e.kind == "tool_result"
    }
    assert results["lookup"]["result"] == {"found": "x"}
    assert results["charge"]["interrupted"] is True
    final = world.provider.requests[-1].messages
    charge = next(m for m in final if m["role"] == "tool" and m["name"] == "charge")
    assert charge["content"]["interrupted"] is True
    assert kernel.storage.submission(submitted.submission.id).status is SubmissionStatus.ANSWERED


def test_a_safe_call_cut_midway_runs_again_as_the_tool_runs_now() -> None:
    """A safe call cut while it ran in its call's task runs again on recovery; where a
    deploy made the tool a task of its own meanwhile, it runs again as that task (its
    replay policy allows it), not as a function the tool no longer has."""
    calls = [ToolCall("c1", "lookup", {"q": "x"})]

    def script(request: ModelRequest) -> ModelResponse:
        tools = [m for m in request.messages if m["role"] == "tool"]
        if tools:
            return ModelResponse(f"done: {[t['content'] for t in tools]}")
        return ModelResponse("", tuple(calls))

    world = World(ScriptedProvider(script), crash_on={"lookup"})
    kernel, handle, conversation, submitted = world.start()
    with pytest.raises(Crash):
        world.run()
    world.crash_on = set()
    world.lookup_kind = "lookup-task"
    world.run()
    assert world.effects == ["lookup:x", "lookup:x"]
    (result,) = [e.payload for e in kernel.entries(conversation) if e.kind == "tool_result"]
    assert result["result"] == {"found": "x"}
    assert kernel.storage.submission(submitted.submission.id).status is SubmissionStatus.ANSWERED


def test_a_tool_that_kills_its_worker_every_time_fails_at_the_restart_limit() -> None:
    world = World(
        ScriptedProvider(
            responses=[
                ModelResponse("", (ToolCall("c", "die", {}),)),
                ModelResponse("the tool failed"),
            ]
        )
    )
    kernel, handle, conversation, submitted = world.start()
    world.run(crashes_allowed=10)
    tool = next(t for t in kernel.storage.session_tasks(handle.id) if t.kind == "agent-tool")
    assert tool.outcome["kind"] == "failed"
    assert "restart limit is 3" in tool.outcome["error"]
    assert world.effects.count("die") == 4
    told = next(m for m in world.provider.requests[-1].messages if m["role"] == "tool")
    assert told["content"] == {
        "interrupted": True,
        "partial": None,
        "note": INTERRUPTED_NOTE,
        "error": f"the tool task failed: {tool.outcome['error']}",
    }


def test_a_background_response_is_polled_by_its_handle_after_a_restart() -> None:
    provider = ScriptedProvider(lambda request: Pending("resp_42"))
    world = World(provider)
    kernel, handle, conversation, submitted = world.start()
    world.run(advance_clock=False)  # requested, polled once, now sleeping before the next poll
    turn = kernel.task(kernel.document(handle.id, "agent-conversation", conversation)["active"])
    assert turn.phase == "poll" and turn.checkpoint["handle"] == "resp_42"
    provider.background["resp_42"] = ModelResponse("finished in the background")
    world.clock.advance(5)
    world.run()  # a new process, as after a restart
    assert len(provider.requests) == 1  # polled, never requested again
    assert kernel.storage.submission(submitted.submission.id).status is SubmissionStatus.ANSWERED


def test_transient_errors_back_off_and_permanent_ones_leave_the_input_unanswered() -> None:
    failures = [TransientModelError("rate limited"), TransientModelError("503")]

    def flaky(request: ModelRequest) -> ModelResponse:
        if failures:
            raise failures.pop(0)
        return ModelResponse("fine")

    world = World(ScriptedProvider(flaky))
    kernel, _, _, submitted = world.start()
    world.run()
    assert kernel.storage.submission(submitted.submission.id).status is SubmissionStatus.ANSWERED

    def refuse(request: ModelRequest) -> ModelResponse:
        raise PermanentModelError("context too long")

    world = World(ScriptedProvider(refuse))
    kernel, _, _, submitted = world.start()
    world.run()
    stored = kernel.storage.submission(submitted.submission.id)
    assert stored.status is SubmissionStatus.UNANSWERED
    assert "context too long" in stored.reason


def test_a_turn_waits_at_least_as_long_as_the_server_asked() -> None:
    """A 429's Retry-After outlasts the turn's own backoff: the turn sleeps that long
    (holding no worker), then asks again."""
    failures = [TransientModelError("429", retry_after=120)]

    def limited(request: ModelRequest) -> ModelResponse:
        if failures:
            raise failures.pop(0)
        return ModelResponse("fine")

    world = World(ScriptedProvider(limited))
    kernel, handle, conversation, submitted = world.start()
    world.run(advance_clock=False)
    turn = kernel.task(kernel.document(handle.id, "agent-conversation", conversation)["active"])
    assert (turn.phase, turn.status.value) == ("request", "sleeping")
    assert turn.wake_at is not None
    assert (turn.wake_at - world.clock.now()).total_seconds() == pytest.approx(120)
    assert turn.checkpoint["last_error"] == "429"
    world.run()
    assert kernel.storage.submission(submitted.submission.id).status is SubmissionStatus.ANSWERED


def test_a_servers_retry_after_is_honoured_up_to_a_limit() -> None:
    from kernel.agent.requests import LONGEST_RETRY_AFTER, backoff

    assert backoff(1) == 1.0 and backoff(1, TransientModelError("x")) == 1.0
    assert backoff(1, TransientModelError("x", retry_after=0.2)) == 1.0  # never shorter
    assert backoff(1, TransientModelError("x", retry_after=45)) == 45
    assert backoff(1, TransientModelError("x", retry_after=10**6)) == LONGEST_RETRY_AFTER


def test_submissions_are_idempotent_and_respect_when_busy() -> None:
    world = World(ScriptedProvider(lambda r: ModelResponse(f"answer {len(r.messages)}")))
    kernel, handle, conversation, first = world.start(request_id="a")
    again = submit(handle, conversation, {"text": "other"}, "a")
    assert (again.outcome, again.submission) == ("duplicate", first.submission)
    head = handle.kernel.storage.session(handle.id).head_seq
    refused = submit(handle, conversation, {"text": "x"}, "b", WhenBusy.REJECT)
    assert refused.outcome == "rejected" and "busy" in refused.reason
    assert handle.kernel.storage.session(handle.id).head_seq == head
    queued = submit(handle, conversation, {"text": "then this"}, "c", WhenBusy.FOLLOW_UP)
    steered = submit(handle, conversation, {"text": "and mind this"}, "d", WhenBusy.STEER)
    assert (queued.outcome, steered.outcome) == ("queued", "steered")
    world.run()
    statuses = {s: kernel.storage.submission_by_request(handle.id, s).status for s in "acd"}
    assert set(statuses.values()) == {SubmissionStatus.ANSWERED}
    texts = [e.payload["text"] for e in kernel.entries(conversation) if e.kind == "user"]
    assert texts == ["Send the approved notice and summarise", "and mind this", "then this"]
    with pytest.raises(ValueError, match="text"):
        submit(handle, conversation, {"nope": 1}, "e")


def test_context_puts_results_after_their_calls_and_fills_lost_ones() -> None:
    def entry(kind: str, payload: dict[str, Any], seq: int) -> Entry:
        return Entry(f"e{seq}", "s", "c", seq, 0, kind, payload, "a", None)  # type: ignore[arg-type]

    calls = [{"id": "1", "name": "a", "arguments": {}}, {"id": "2", "name": "b", "arguments": {}}]
    built = messages(
        [
            entry("user", {"text": "go"}, 1),
            entry("model_response", {"text": "", "tool_calls": calls}, 2),
            entry("user", {"text": "steer"}, 3),
            entry("tool_result", {"call_id": "1", "name": "a", "result": 7}, 4),
        ]
    )
    assert [m["role"] for m in built] == ["user", "assistant", "tool", "tool", "user"]
    assert built[2]["content"] == {"result": 7}
    assert built[3]["content"] == {"error": LOST_RESULT}


def numbers_its_calls_per_response(request: ModelRequest) -> ModelResponse:
    """Looks up each user message once, under the call id ``call_0`` every time (as models
    that number their calls per response do), then answers."""
    asked = max(i for i, m in enumerate(request.messages) if m["role"] == "user")
    text = request.messages[asked]["content"]
    if not any(m["role"] == "tool" for m in request.messages[asked + 1:]):
        return ModelResponse("", (ToolCall("call_0", "lookup", {"q": text}),))
    return ModelResponse(f"looked up {text}")


@pytest.mark.parametrize("tool", ["charge_unstorably", "charge_unstorably_whole"])
def test_a_call_that_ran_but_whose_result_cannot_be_stored_tells_the_model_it_ran(
    tool: str,
) -> None:
    """The tool took effect and returned a value no storage holds (a NUL), measured for
    an artifact or kept whole: the model is told the call ran and why its result is not
    shown, not that it may not have run (and may be tried again)."""

    def script(request: ModelRequest) -> ModelResponse:
        results = [m["content"] for m in request.messages if m["role"] == "tool"]
        if results:
            return ModelResponse(f"told {results[0]}")
        return ModelResponse("", (ToolCall("c1", tool, {"amount": 5}),))

    world = World(ScriptedProvider(script))
    kernel, handle, conversation, submitted = world.start("pay")
    world.run()
    assert world.effects == ["charge:5"]  # once
    [result] = [e.payload for e in kernel.entries(conversation) if e.kind == "tool_result"]
    assert "interrupted" not in result
    assert result["error"].startswith("the call ran, but its result cannot be stored")
    assert "NUL" in result["error"]
    told = next(m for m in world.provider.requests[-1].messages if m["role"] == "tool")
    assert told["content"] == {"error": result["error"]}
    assert kernel.storage.submission(submitted.submission.id).status is SubmissionStatus.ANSWERED


def test_a_call_id_reused_by_a_later_response_is_answered_by_each_calls_own_result() -> None:
    world = World(ScriptedProvider(numbers_its_calls_per_response))
    kernel, handle, conversation, _ = world.start("first")
    world.run()
    submit(handle, conversation, {"text": "second"}, "req-2")
    world.run()
    sent = world.provider.requests[-1].messages
    calls = [m["tool_calls"][0]["arguments"]["q"] for m in sent if m.get("tool_calls")]
    results = [m["content"]["result"]["found"] for m in sent if m["role"] == "tool"]
    assert calls == ["first", "second"]
    assert results == ["first", "second"]  # each call followed by its own result
    assert [e.payload.get("response") for e in kernel.entries(conversation)
            if e.kind == "tool_result"] == [e.id for e in kernel.entries(conversation)
                                            if e.kind == "model_response"
                                            and e.payload.get("tool_calls")]


def test_a_result_naming_its_response_answers_that_call_not_an_earlier_one_of_its_id() -> None:
    def entry(kind: str, payload: dict[str, Any], seq: int) -> Entry:
        return Entry(f"e{seq}", "s", "c", seq, 0, kind, payload, "a", None)  # type: ignore[arg-type]

    call = [{"id": "call_0", "name": "a", "arguments": {}}]
    built = messages([
        entry("user", {"text": "go"}, 1),
        entry("model_response", {"text": "", "tool_calls": call}, 2),  # its result: lost
        entry("user", {"text": "again"}, 3),
        entry("model_response", {"text": "", "tool_calls": call}, 4),
        entry("tool_result", {"call_id": "call_0", "name": "a", "response": "e4",
                              "result": 7}, 5),
    ])
    assert [m["role"] for m in built] == ["user", "assistant", "tool", "user", "assistant",
                                          "tool"]
    assert built[2]["content"] == {"error": LOST_RESULT}
    assert built[5]["content"] == {"result": 7}


def test_polling_errors_back_off_on_the_same_handle_and_a_failed_response_ends_the_turn() -> None:
    outcomes: list[Any] = [TransientModelError("502"), None, ModelResponse("late but fine")]
    provider = ScriptedProvider(lambda request: Pending("resp_7"))
    polled: list[str] = []

    def poll(handle: str) -> ModelResponse | None:
        polled.append(handle)
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    provider.poll = poll  # type: ignore[method-assign]
    world = World(provider)
    kernel, handle, conversation, submitted = world.start()
    world.run()
    assert polled == ["resp_7"] * 3 and len(provider.requests) == 1
    assert kernel.storage.submission(submitted.submission.id).status is SubmissionStatus.ANSWERED

    def refuse(handle: str) -> ModelResponse | None:
        raise PermanentModelError("background response resp_7 ended failed")

    provider = ScriptedProvider(lambda request: Pending("resp_7"))
    provider.poll = refuse  # type: ignore[method-assign]
    world = World(provider)
    kernel, handle, conversation, submitted = world.start()
    world.run()
    stored = kernel.storage.submission(submitted.submission.id)
    assert stored.status is SubmissionStatus.UNANSWERED and "ended failed" in stored.reason
    assert kernel.document(handle.id, "agent-conversation", conversation)["active"] is None


def test_streamed_text_is_previewed_live_folded_into_the_next_commit_and_lost_in_a_crash(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("kernel.agent.turn.PROGRESS_EVERY", 0.0)
    provider = ScriptedProvider(lambda request: ModelResponse("All done."))
    answer = provider.generate
    world = World(provider)
    session: list[str] = []

    def generate(request: ModelRequest, on_text: Any) -> Any:
        attempt = len(world.previews) + 1
        before = world.storage.session(session[0]).head_seq
        on_text(f"partial {attempt} ")
        assert world.storage.session(session[0]).head_seq == before  # a preview commits nothing
        if attempt == 1:
            raise Crash()  # the preview dies with the process
        if attempt == 2:
            raise TransientModelError("503")  # the backoff's commit folds the preview in
        return answer(request, on_text)

    provider.generate = generate  # type: ignore[method-assign]
    kernel, handle, conversation, submitted = world.start()
    session.append(handle.id)
    world.run(crashes_allowed=1)
    turn = next(t for t in kernel.storage.session_tasks(handle.id) if t.kind == "agent-turn")
    assert [(p.task_id, p.kind, p.path) for p in world.previews] == [
        (turn.id, "agent-progress", ("text",))
    ] * 4
    assert [p.value for p in world.previews] == [
        "partial 1 ", "partial 2 ", "partial 3 ", "partial 3 All done."
    ]
    versions = range(1, kernel.document_version(handle.id, "agent-progress", turn.id) + 1)
    stored = [
        kernel.document(handle.id, "agent-progress", turn.id, v).get("text") for v in versions
    ]
    assert stored == ["partial 2 ", "All done."]  # never the crashed attempt's text
    assert kernel.storage.submission(submitted.submission.id).status is SubmissionStatus.ANSWERED


def test_a_model_request_that_kills_its_worker_every_time_ends_the_turn() -> None:
    provider = two_rounds()

    def die(request: ModelRequest, on_text: Any) -> Any:
        provider.requests.append(request)
        raise Crash()

    provider.generate = die  # type: ignore[method-assign]
    world = World(provider)
    kernel, handle, conversation, submitted = world.start()
    assert world.run(crashes_allowed=20) == 6
    stored = kernel.storage.submission(submitted.submission.id)
    assert stored.status is SubmissionStatus.UNANSWERED
    assert stored.reason == "the model request was interrupted 6 times"
    assert kinds(kernel, conversation) == ["user"] + ["interruption"] * 6
    assert kernel.document(handle.id, "agent-conversation", conversation)["active"] is None


# -- model options: an allow-list of keys, types and ranges -------------------------------


@pytest.mark.parametrize(
    "options",
    [{}, {"temperature": 0}, {"temperature": 2.0, "top_p": 0.5, "max_tokens": 32768},
     {"presence_penalty": -2, "frequency_penalty": 1.5, "seed": 7}, {"max_tokens": 3.0}],
)
def test_options_the_allow_list_names_are_kept(options: dict[str, Any]) -> None:
    assert check_options(options) == options
    assert all(type(v) is int for k, v in check_options(options).items()
               if k in ("max_tokens", "seed"))


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"model": "other"}, "options.model"),  # the turn's model, never an option
        ({"messages": []}, "options.messages"),
        ({"n": 5}, "options.n"),
        ({"stream": False}, "options.stream"),
        ({"temperature": 2.5}, "options.temperature"),
        ({"temperature": -0.1}, "options.temperature"),
        ({"temperature": "1"}, "options.temperature"),
        ({"temperature": True}, "options.temperature"),
        ({"temperature": float("nan")}, "options.temperature"),
        ({"max_tokens": 0}, "options.max_tokens"),
        ({"max_tokens": 10**30}, "options.max_tokens"),
        ({"max_tokens": 1.5}, "options.max_tokens"),
        ({"top_p": None}, "options.top_p"),
    ],
)
def test_options_outside_the_allow_list_are_refused_naming_them(
    options: dict[str, Any], named: str
) -> None:
    with pytest.raises(ValueError, match=named.replace(".", r"\.")):
        check_options(options)
    world = World(ScriptedProvider(responses=[ModelResponse("hi")]))
    kernel = world.kernel()
    handle = kernel.create_session()
    draft = Draft()
    conversation = draft.create_conversation()
    handle.commit(draft)
    with pytest.raises(ValueError, match=named.replace(".", r"\.")):
        submit(handle, conversation, {"text": "x", "options": options}, "r")
    assert kernel.storage.session(handle.id).head_seq == 1


def test_a_turn_with_options_outside_the_allow_list_fails_without_asking_the_model() -> None:
    world = World(ScriptedProvider(responses=[ModelResponse("hi")]))
    kernel = world.kernel()
    handle = kernel.create_session()
    draft = Draft()
    conversation = draft.create_conversation()
    turn = draft.create_task(
        "agent-turn", {"conversation_id": conversation, "submissions": [],
                       "options": {"model": "expensive", "n": 50}})
    handle.commit(draft)
    world.run()
    assert world.provider.requests == []
    assert "options.model" in kernel.task(turn).outcome["error"]


def test_allowed_options_reach_the_model() -> None:
    world = World(ScriptedProvider(responses=[ModelResponse("hi")]))
    kernel, handle, conversation, _ = world.start()
    submit(handle, conversation, {"text": "more", "options": {"temperature": 0.2}}, "r2")
    world.run()
    assert [r.options for r in world.provider.requests] == [{}, {"temperature": 0.2}]


def test_a_follow_up_queued_while_the_turn_reads_its_conversation_is_placed() -> None:
    """A turn that ends reads its conversation and writes it back checked against the
    version it read. A follow-up committed between that read and the turn's release
    must make the release conflict and read again: were the value and the version read
    apart, the version would already count the follow-up while the value (an empty
    queue) did not, and the follow-up would stay queued on an idle conversation."""
    world = World(ScriptedProvider(lambda r: ModelResponse(f"answer {len(r.messages)}")))
    kernel, handle, conversation, first = world.start(request_id="a")
    storage = world.storage
    real = storage.document_head
    raced: list[Any] = []
    racing: list[bool] = []

    def in_release() -> bool:
        frame = sys._getframe(2)
        while frame is not None:
            if frame.f_code.co_name == "release":
                return True
            frame = frame.f_back  # type: ignore[assignment]
        return False

    def document_head(session_id: str, kind: str, key: str) -> Any:
        head = real(session_id, kind, key)
        if not racing and kind == "agent-conversation" and in_release():
            racing.append(True)
            raced.append(submit(handle, conversation, {"text": "then this"}, "b"))
        return head

    storage.document_head = document_head  # type: ignore[method-assign]
    world.run()
    assert [r.outcome for r in raced] == ["queued"]
    follow_up = kernel.storage.submission_by_request(handle.id, "b")
    assert follow_up.status is SubmissionStatus.ANSWERED, follow_up
    assert kernel.document(handle.id, "agent-conversation", conversation)["active"] is None


SLOW = ToolCall("call_slow", "send_slowly", {"recipients": RECIPIENTS})


def each_message_calls_the_tool(request: ModelRequest) -> ModelResponse:
    """Calls ``send_slowly`` for each user message, then answers with the result it got."""
    asked = max(i for i, m in enumerate(request.messages) if m["role"] == "user")
    results = [m for m in request.messages[asked + 1:] if m["role"] == "tool"]
    if results:
        return ModelResponse(f"got {results[-1]['content']}")
    return ModelResponse("", (ToolCall(f"call_{asked}", "send_slowly", SLOW.arguments),))


@pytest.mark.parametrize("cancelled", ["agent-tool", "slow-batch"])
def test_a_cancelled_tool_call_gives_the_model_its_committed_partial_output(
    cancelled: str,
) -> None:
    """The call's tool task, or the task it runs, is cancelled (the turn goes on)."""
    world = World(ScriptedProvider(each_message_calls_the_tool))
    kernel, handle, conversation, submitted = world.start()
    world.run()  # the batch sent to the first recipient and waits
    assert world.effects == [f"sent:{RECIPIENTS[0]}"]
    cancel = Draft(actor="user:op")
    task = next(t for t in kernel.storage.session_tasks(handle.id) if t.kind == cancelled)
    cancel.cancel(task.id, "wrong list")
    handle.commit(cancel)
    world.run()

    [result] = [e.payload for e in kernel.entries(conversation) if e.kind == "tool_result"]
    [response] = [e.id for e in kernel.entries(conversation) if e.kind == "model_response"
                  and e.payload.get("tool_calls")]
    partial = {"sent": RECIPIENTS[:1], "unsent": RECIPIENTS[1:]}
    assert result == {
        "call_id": "call_0", "name": "send_slowly", "response": response, "cancelled": True,
        "by": "user:op", "reason": "wrong list", "partial": partial,
    }
    told = next(m for m in world.provider.requests[-1].messages if m["role"] == "tool")
    assert told["content"] == {
        "cancelled": True,
        "reason": "cancelled by user:op: wrong list",
        "partial": partial,
        "note": CANCELLED_NOTE,
    }
    assert kernel.storage.submission(submitted.submission.id).status is SubmissionStatus.ANSWERED
    assert world.effects == [f"sent:{RECIPIENTS[0]}"]


def test_after_a_cancelled_turn_the_next_message_calls_the_tool_again_knowing_what_went_out(
) -> None:
    world = World(ScriptedProvider(each_message_calls_the_tool))
    kernel, handle, conversation, first = world.start()
    world.run()
    turn = kernel.document(handle.id, "agent-conversation", conversation)["active"]
    cancel = Draft(actor="user:ann")
    cancel.cancel(turn, "stop")
    handle.commit(cancel)
    world.run()
    assert kernel.storage.submission(first.submission.id).status is SubmissionStatus.CANCELLED
    [cancelled] = [e.payload for e in kernel.entries(conversation) if e.kind == "tool_result"]
    assert cancelled["cancelled"] is True
    assert cancelled["partial"] == {"sent": RECIPIENTS[:1], "unsent": RECIPIENTS[1:]}

    second = submit(handle, conversation, {"text": "try again"}, "req-2")
    world.run()  # the tool is called again, and waits again
    asked = world.provider.requests[-1].messages
    assert [m["role"] for m in asked] == ["user", "assistant", "tool", "user"]
    assert asked[2]["content"]["cancelled"] is True
    assert asked[2]["content"]["partial"] == cancelled["partial"]
    assert world.effects == [f"sent:{RECIPIENTS[0]}"] * 2
    go = Draft(actor="user:ann")
    go.signal(tool_child(kernel, handle), "go", {})
    handle.commit(go)
    world.run()
    assert kernel.storage.submission(second.submission.id).status is SubmissionStatus.ANSWERED
    answer = [e for e in kernel.entries(conversation) if e.kind == "model_response"][-1]
    assert answer.payload["text"] == f"got {{'result': {{'sent': {RECIPIENTS!r}}}}}"


def tool_child(kernel: Kernel, handle: Any) -> str:
    return next(
        t.id for t in kernel.storage.session_tasks(handle.id)
        if t.kind == "slow-batch" and not t.terminal
    )


def test_a_failed_call_gives_the_model_what_it_did_report() -> None:
    def entry(kind: str, payload: dict[str, Any], seq: int) -> Entry:
        return Entry(f"e{seq}", "s", "c", seq, 0, kind, payload, "a", None)  # type: ignore[arg-type]

    calls = [{"id": "1", "name": "a", "arguments": {}}, {"id": "2", "name": "b", "arguments": {}}]
    built = messages([
        entry("user", {"text": "go"}, 1),
        entry("model_response", {"text": "", "tool_calls": calls}, 2),
        entry("tool_result", {"call_id": "1", "name": "a", "error": "failed: 1 of 2 not sent",
                              "result": {"sent": 1, "unsent": ["b"]}}, 3),
        entry("tool_result", {"call_id": "2", "name": "b", "error": "faulted: stuck",
                              "result": None, "partial": {"sent": 0}}, 4),
    ])
    assert built[2]["content"] == {"error": "failed: 1 of 2 not sent",
                                   "result": {"sent": 1, "unsent": ["b"]}}
    assert built[3]["content"] == {"error": "faulted: stuck", "partial": {"sent": 0}}


def test_a_partial_that_cannot_be_read_still_answers_the_cancelled_call() -> None:
    world = World(ScriptedProvider(each_message_calls_the_tool), partial_fails=True)
    kernel, handle, conversation, submitted = world.start()
    world.run()
    cancel = Draft(actor="user:op")
    cancel.cancel(next(t.id for t in kernel.storage.session_tasks(handle.id)
                       if t.kind == "agent-tool"), "stop")
    handle.commit(cancel)
    world.run()
    [result] = [e.payload for e in kernel.entries(conversation) if e.kind == "tool_result"]
    assert result["cancelled"] is True and result["partial"] is None
    assert result["partial_error"] == "RuntimeError: the plan cannot be read"
    told = next(m for m in world.provider.requests[-1].messages if m["role"] == "tool")
    assert told["content"]["partial_error"] == result["partial_error"]
    assert kernel.storage.submission(submitted.submission.id).status is SubmissionStatus.ANSWERED
