"""The black-box scenario of issue 11, with real workers and the API only.

An operator cancels a running agent turn (``POST /api/tasks/{turn}/cancel``) while its
model request is in flight. The turn ends ``cancelled``, its submission says so with
the reason, and the conversation is free again: a ``when_busy=reject`` submission is
accepted (not 409 "busy with the cancelled turn") and answered.
"""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.worker.runtime import runtime
from tests.model_stand_in import Completion, ModelStandIn

from .harness import Stack, operator_client, wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.slow]


def test_a_turn_cancelled_through_the_api_frees_its_conversation(
    agent_stack: Stack, model: ModelStandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    stack = agent_stack
    monkeypatch.setattr(runtime().dispatcher, "deliver", stack.deliver)
    operator = operator_client("olga")

    def last_user_text(body: Any) -> str:
        return next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")

    # The first request hangs (until released); every later one answers at once.
    model.script = lambda body: Completion(
        f"Re: {last_user_text(body)}", hold=last_user_text(body) == "first"
    )
    stack.worker("w1")
    stack.worker("w2")
    stack.beat()
    session_id = operator.post("/api/sessions", {}, content_type="application/json").json()["id"]
    conversation = operator.post(f"/api/sessions/{session_id}/conversations", {},
                                 content_type="application/json").json()["id"]

    def send(request_id: str, text: str, **extra: Any) -> Any:
        body = {"conversation_id": conversation, "request_id": request_id,
                "input": {"text": text, "model": "remote"}, **extra}
        return operator.post(f"/api/sessions/{session_id}/submissions", body,
                             content_type="application/json")

    first = send("r1", "first")
    assert (first.status_code, first.json()["status"]) == (201, "placed")
    wait_for(lambda: model.held == 1, "the model request to be in flight")
    (turn,) = [t for t in stack.tasks(session_id) if t.kind == "agent-turn"]

    cancelled = operator.post(f"/api/tasks/{turn.id}/cancel",
                              {"action_id": "cancel-1", "reason": "wrong question",
                               "expected_run": turn.run},
                              content_type="application/json")
    assert cancelled.status_code == 200, cancelled.content
    ended = stack.wait_terminal(turn.id, timeout=30)
    assert ended.outcome["kind"] == "cancelled"

    settled = operator.get(f"/api/submissions/{first.json()['id']}").json()
    assert settled["status"] == "cancelled"
    assert "wrong question" in settled["reason"] and "olga" in settled["reason"]

    after = send("r2", "second", when_busy="reject")
    assert (after.status_code, after.json()["status"]) == (201, "placed"), after.content
    answered = stack.wait_answered(after.json()["id"], timeout=60)
    reply = next(e for e in stack.entries(conversation) if e.id == answered.answer_entry_id)
    assert reply.payload["text"] == "Re: second"
    model.release()  # let the abandoned request end
