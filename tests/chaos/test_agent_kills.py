"""The agent loop under real worker kills (SIGKILL) at the points that matter.

Workers ask a loopback model stand-in (``tests.model_stand_in``) that records every
request and can hold one open, and run the killable tools of
``tests.chaos.agent_tools``; the tests assert on what the stand-in received, what
the tools recorded from inside the workers, and the committed tasks and entries.
"""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.worker.runtime import runtime
from kernel import Status, SubmissionStatus, Task
from tests.model_stand_in import (
    Completion,
    ModelStandIn,
    by_round,
    models_env,
    posts,
    tool_outputs,
)

from .harness import Stack, operator_client, wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.slow]


def call(name: str, value: str, hold: bool = False) -> dict[str, Any]:
    arguments: dict[str, Any] = {"value": value, **({"hold": True} if hold else {})}
    return {"id": f"call_{name}", "name": name, "arguments": arguments}


def kinds(stack: Stack, conversation: str) -> list[str]:
    return [e.kind for e in stack.entries(conversation)]


def of_kind(stack: Stack, session_id: str, kind: str) -> list[Task]:
    return [t for t in stack.tasks(session_id) if t.kind == kind]


def test_killed_during_the_model_request_the_attempt_is_recorded_and_retried(
    agent_stack: Stack, model: ModelStandIn
) -> None:
    """(a) The stand-in streams half an answer that announces a tool call, then holds.
    The worker dies there: the next one records the unfinished attempt and asks again;
    no tool runs from the partial text."""
    stack = agent_stack
    model.completions += [
        Completion("I will charge ana now, calling charge", (call("charge", "5"),), hold=True),
        Completion("Nothing was charged."),
    ]
    stack.worker("w1")
    stack.beat()
    session_id, conversation, submission = stack.converse("Charge ana 5")
    wait_for(lambda: model.held == 1, "the model request to be in flight")
    (turn,) = of_kind(stack, session_id, "agent-turn")
    turn = stack.task(turn.id)
    assert (turn.status, turn.phase, turn.checkpoint["in_flight"]) == (Status.RUNNING, "request", 1)
    stack.holder(turn.id).kill()
    model.release()  # the held answer now goes to a dead socket

    stack.worker("w2")
    stack.wait_answered(submission.id)
    assert kinds(stack, conversation) == ["user", "interruption", "model_response"]
    interruption = stack.entries(conversation)[1].payload
    assert (interruption["turn"], interruption["attempt"]) == (turn.id, 1)
    assert "during the model request" in interruption["reason"]
    answer = stack.entries(conversation)[2].payload
    assert (answer["text"], answer["tool_calls"], answer["attempt"]) == (
        "Nothing was charged.", [], 2
    )
    first, second = posts(model)
    assert first["messages"] == second["messages"] == [
        {"role": "user", "content": "Charge ana 5"}
    ]  # the partial text never entered the context
    assert of_kind(stack, session_id, "agent-tool") == [] and stack.tool_runs() == []


def test_killed_after_the_response_commit_the_tools_run_once_and_the_model_is_not_asked_again(
    agent_stack: Stack, model: ModelStandIn
) -> None:
    """(b) A brain-only worker commits the response with its tool tasks and dies before
    any hands worker took them."""
    stack = agent_stack
    model.script = by_round(
        Completion("", (call("probe", "stock"), call("charge", "5"))),
        Completion("Probed and charged."),
    )
    brain = stack.worker("b1", queues="default,brain")
    stack.beat()
    session_id, conversation, submission = stack.converse("Check stock, then charge 5")
    tools = wait_for(lambda: len(of_kind(stack, session_id, "agent-tool")) == 2
                     and of_kind(stack, session_id, "agent-tool"), "the tool tasks")
    (turn,) = of_kind(stack, session_id, "agent-turn")
    wait_for(lambda: stack.task(turn.id).status is Status.WAITING, "the turn to wait on its tools")
    # The dispatches go to Redis just after the commit lands (a moment after it is visible).
    wait_for(lambda: sorted(stack.queued("hands")) == sorted(t.id for t in tools),
             "both tool tasks to be queued for hands")
    assert kinds(stack, conversation) == ["user", "model_response"]
    brain.kill()

    stack.worker("w2")
    stack.wait_answered(submission.id)
    assert sorted(stack.tool_runs()) == ["charge", "probe"]  # once each
    first, second = posts(model)  # the first round was not asked again
    assert tool_outputs(first) == []
    assert tool_outputs(second) == [{"result": {"probed": "stock"}}, {"result": {"charged": "5"}}]
    assert kinds(stack, conversation) == [
        "user", "model_response", "tool_result", "tool_result", "model_response"
    ]


def test_killed_during_tools_a_safe_one_runs_again_an_unsafe_one_is_interrupted(
    agent_stack: Stack, model: ModelStandIn
) -> None:
    """(c) Two hands workers each block inside a tool and are killed: ``probe`` (replay
    safe) runs again; ``charge`` (unsafe) becomes an interrupted result the model sees,
    and the turn goes on to its answer."""
    stack = agent_stack
    model.script = by_round(
        Completion("", (call("probe", "stock", hold=True), call("charge", "5", hold=True))),
        Completion("Charge may or may not have happened; please check."),
    )
    brain, h1, h2 = (stack.worker("b1", queues="default,brain", wait=False),
                     stack.worker("h1", queues="hands", wait=False),
                     stack.worker("h2", queues="hands", wait=False))
    stack.wait_ready(brain, h1, h2)
    stack.beat()
    session_id, conversation, submission = stack.converse("Check stock, then charge 5")
    wait_for(lambda: sorted(stack.tool_runs()) == ["charge", "probe"], "both tools to be running")
    tools = {t.input["call"]["name"]: t for t in of_kind(stack, session_id, "agent-tool")}
    assert {t.phase for t in tools.values()} == {"execute"}  # intents committed, then running
    h1.kill()
    h2.kill()
    stack.release_tools()

    stack.worker("h3", queues="hands")
    stack.wait_answered(submission.id)
    assert sorted(stack.tool_runs()) == ["charge", "probe", "probe"]
    results = {e.payload["name"]: e.payload for e in stack.entries(conversation)
               if e.kind == "tool_result"}
    assert results["probe"]["result"] == {"probed": "stock"}
    assert results["charge"]["interrupted"] is True and "result" not in results["charge"]
    _, second = posts(model)
    charge = next(o for o in tool_outputs(second) if "interrupted" in o)
    assert charge["interrupted"] is True and "may or may not" in charge["note"]
    assert {"result": {"probed": "stock"}} in tool_outputs(second)
    assert stack.entries(conversation)[-1].payload["text"].startswith("Charge may or may not")


def test_killed_while_polling_a_background_response_the_same_handle_is_polled(
    agent_stack: Stack, model: ModelStandIn
) -> None:
    """(d) In background mode the request returns an id at once; the worker dies while a
    poll for it is held open. The next worker polls the same id; no second request."""
    stack = agent_stack
    model.completions.append(Completion("Answered in the background.", polls=1, hold=True))
    w1 = stack.worker("w1", **models_env(model.url, background=True))
    stack.beat()
    session_id, conversation, submission = stack.converse("Take your time")
    wait_for(lambda: model.held == 1, "a poll to be held")
    (turn,) = of_kind(stack, session_id, "agent-turn")
    turn = stack.task(turn.id)
    assert (turn.status, turn.phase) == (Status.RUNNING, "poll")
    assert turn.checkpoint["handle"] == "resp_1"
    w1.kill()
    model.release()

    stack.worker("w2", **models_env(model.url, background=True))
    stack.wait_answered(submission.id)
    requests = model.requests("POST", "")
    assert [r.path for r in requests] == ["/v1/responses"] and requests[0].body["background"]
    polls = model.requests("GET", "")
    assert len(polls) >= 3 and {p.path for p in polls} == {"/v1/responses/resp_1"}
    assert stack.entries(conversation)[-1].payload["text"] == "Answered in the background."
    assert stack.task(turn.id).epoch >= 2  # taken over by the second worker


def test_a_tool_that_kills_its_worker_every_time_fails_at_the_restart_limit(
    agent_stack: Stack, model: ModelStandIn
) -> None:
    """(e) ``crash`` SIGKILLs whichever worker runs it. Each death is a restart of its
    phase; past the limit the tool task fails with that reason, and the model is told
    that reason as the call's result."""
    stack = agent_stack
    model.script = by_round(Completion("", (call("crash", "x"),)), Completion("It failed."))
    stack.worker("b1", queues="default,brain")
    stack.beat()
    session_id, conversation, submission = stack.converse("Try the crash tool")
    hands = [stack.worker("h1", queues="hands", wait=False)]

    def tool_finished() -> bool:
        tools = of_kind(stack, session_id, "agent-tool")
        if tools and tools[0].status is Status.TERMINAL:
            return True
        if not hands[-1].alive:  # a supervisor would restart it: so do we
            hands.append(stack.worker(f"h{len(hands) + 1}", queues="hands", wait=False))
        return False

    wait_for(tool_finished, "the crashing tool to end", timeout=90)
    (tool,) = of_kind(stack, session_id, "agent-tool")
    assert tool.outcome is not None and tool.outcome["kind"] == "failed"
    assert "interrupted 4 times; restart limit is 3" in tool.outcome["error"]
    assert stack.tool_runs() == ["crash"] * 4
    stack.wait_answered(submission.id)
    _, second = posts(model)
    (told,) = tool_outputs(second)
    assert "interrupted 4 times; restart limit is 3" in told["error"], told
    assert stack.entries(conversation)[-1].payload["text"] == "It failed."


def test_submissions_after_a_crash_are_idempotent_and_reject_writes_nothing(
    agent_stack: Stack, model: ModelStandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(f) Through the API: the worker dies mid-turn; the same request id answers with the
    original submission, a new id makes a new (queued) one, ``when_busy=reject`` writes
    nothing and says why. After recovery both accepted inputs are answered."""
    stack = agent_stack
    monkeypatch.setattr(runtime().dispatcher, "deliver", stack.deliver)
    operator = operator_client("olga")

    def last_user_text(body: Any) -> str:
        return next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")

    model.script = lambda body: Completion(f"Re: {last_user_text(body)}", hold=True)
    stack.worker("w1")
    stack.beat()
    session_id = operator.post("/api/sessions", {}, content_type="application/json").json()["id"]
    conversation = operator.post(f"/api/sessions/{session_id}/conversations", {},
                                 content_type="application/json").json()["id"]
    url = f"/api/sessions/{session_id}/submissions"

    def send(request_id: str, text: str, **extra: Any) -> Any:
        body = {"conversation_id": conversation, "request_id": request_id,
                "input": {"text": text, "model": "remote"}, **extra}
        return operator.post(url, body, content_type="application/json")

    first = send("r1", "first")
    assert (first.status_code, first.json()["status"]) == (201, "placed")
    wait_for(lambda: model.held == 1, "the model request to be in flight")
    (turn,) = of_kind(stack, session_id, "agent-turn")
    stack.holder(turn.id).kill()

    again = send("r1", "first, sent again after the crash")
    assert again.status_code == 200 and again.json() == first.json()
    head = stack.head_seq(session_id)
    refused = send("r2", "interrupting", when_busy="reject")
    assert refused.status_code == 409
    assert f"busy with turn {turn.id}" in refused.json()["detail"]
    assert "nothing was written" in refused.json()["detail"]
    assert stack.head_seq(session_id) == head
    assert stack.kernel.storage.submission_by_request(session_id, "r2") is None
    queued = send("r3", "second")
    assert (queued.status_code, queued.json()["status"]) == (201, "queued")
    assert queued.json()["id"] != first.json()["id"]

    model.release()
    stack.worker("w2")
    answered = [stack.wait_answered(s.json()["id"]) for s in (first, queued)]
    assert [s.status for s in answered] == [SubmissionStatus.ANSWERED] * 2
    texts = [(e.kind, e.payload.get("text")) for e in stack.entries(conversation)]
    assert texts == [
        ("user", "first"), ("interruption", None), ("model_response", "Re: first"),
        ("user", "second"), ("model_response", "Re: second"),
    ]
    assert [last_user_text(b) for b in posts(model)] == ["first", "first", "second"]
