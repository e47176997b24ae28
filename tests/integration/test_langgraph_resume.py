"""An interrupted LangGraph run resumed through the API, on Postgres: the interrupt's value
is on the task, the resume value is checked against the schema the node declared, the
resume is one commit naming the operator, and a stale or repeated resume changes nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from controlplane.worker.runtime import runtime
from kernel import Kernel, Status, Worker
from tests.langgraph_graphs import APPROVAL, PAYMENT, TWICE, Payment, runs

from .api_kinds import start
from .clients import client_for, post

pytestmark = pytest.mark.django_db(transaction=True)


def advance(kernel: Kernel, task_id: str) -> None:
    assert Worker(kernel, "test-worker", 30).advance(task_id)


def resume(client: Any, task_id: str, action_id: str, checkpoint_id: str, value: Any,
           **more: Any) -> Any:
    return post(client, f"/api/tasks/{task_id}/resume",
                {"action_id": action_id, "reason": "read the draft", "checkpoint_id":
                 checkpoint_id, "value": value, **more})


def test_an_operator_resumes_an_interrupt_through_the_api(graphs: Path) -> None:
    kernel = runtime().kernel
    session, task_id = start(kernel, APPROVAL, {"input": {"text": "notice"}})  # runs it
    olga = client_for("olga", "operator")
    shown = olga.get(f"/api/tasks/{task_id}").json()
    assert shown["status"] == "waiting"
    waiting = shown["checkpoint"]["interrupted"]
    assert waiting["interrupts"][0]["value"]["text"] == "draft of notice"
    checkpoint_id = waiting["checkpoint_id"]
    seen = {"interrupt_ids": [waiting["interrupts"][0]["id"]]}

    assert resume(client_for("vic", "viewer"), task_id, "v1", checkpoint_id,
                  {"approved": True}, **seen).status_code == 403
    bad = resume(olga, task_id, "a0", checkpoint_id, {"approved": "maybe"}, **seen)
    assert bad.status_code == 422 and "value" in bad.json()["detail"], bad.json()
    stale = resume(olga, task_id, "a1", "1f0-not-this-one", {"approved": True}, **seen)
    assert stale.status_code == 409, stale.json()
    (shown_interrupt,) = olga.get(f"/api/sessions/{session}/graph").json()["interrupts"]
    assert shown_interrupt["interrupt_ids"] == [waiting["interrupts"][0]["id"]]
    other_question = resume(olga, task_id, "a3", checkpoint_id, {"approved": True},
                            interrupt_ids=["0" * 32])  # one answered before, say
    assert other_question.status_code == 409, other_question.json()
    assert kernel.task(task_id).signals == {}  # refused ones changed nothing

    done = resume(olga, task_id, "a2", checkpoint_id, {"approved": True},
                  interrupt_ids=shown_interrupt["interrupt_ids"])
    assert done.status_code == 200, done.json()
    again = resume(olga, task_id, "a2", checkpoint_id, {"approved": True},
                   interrupt_ids=shown_interrupt["interrupt_ids"])
    assert again.json()["replayed"] is True and again.json()["seq"] == done.json()["seq"]
    other = resume(client_for("ola", "operator"), task_id, "b1", checkpoint_id,
                   {"approved": False}, **seen)
    assert other.status_code == 409  # answered already

    commit = next(c for c in kernel.commits_after(session, 0) if c.seq == done.json()["seq"])
    assert commit.actor == "user:olga"
    advance(kernel, task_id)
    task = kernel.task(task_id)
    assert task.status is Status.TERMINAL and task.outcome is not None
    assert task.outcome["result"]["output"]["approved"] == {"approved": True}
    assert runs(graphs) == ["draft", "approve", "approve", "publish"]


def test_a_resume_names_the_question_it_answers_or_is_422(graphs: Path) -> None:
    """A node that asks again after its first answer waits at the same checkpoint: a
    resume naming only the checkpoint would answer a question the operator never saw."""
    kernel = runtime().kernel
    session, task_id = start(kernel, TWICE, {"input": {"text": "notice"}})
    olga = client_for("olga", "operator")
    (first,) = olga.get(f"/api/sessions/{session}/graph").json()["interrupts"]
    checkpoint_id = kernel.task(task_id).checkpoint["interrupted"]["checkpoint_id"]
    done = resume(olga, task_id, "a1", checkpoint_id, {"answer": "yes"},
                  interrupt_ids=first["interrupt_ids"])
    assert done.status_code == 200, done.json()
    advance(kernel, task_id)
    waiting = kernel.task(task_id).checkpoint["interrupted"]
    assert waiting["interrupts"][0]["value"]["question"] == "delete the draft?"
    head = kernel.storage.session(session).head_seq

    unnamed = resume(olga, task_id, "a2", checkpoint_id, {"answer": "yes"})
    assert unnamed.status_code == 422 and "interrupt_ids" in unnamed.content.decode()
    stale = resume(olga, task_id, "a3", checkpoint_id, {"answer": "yes"},
                   interrupt_ids=first["interrupt_ids"])
    assert stale.status_code in (409, 422) and kernel.storage.session(session).head_seq == head


def test_the_response_schema_is_shown_checked_and_a_value_the_node_refuses_is_asked_again(
    graphs: Path,
) -> None:
    """``interrupt(..., response_schema=Payment)``: the thread shows that schema, a value
    it refuses is 422 naming the field, and one the node's validation refuses all the
    same (past the model's own limit) leaves the run waiting for another answer, saying
    why, instead of failing it."""
    kernel = runtime().kernel
    session, task_id = start(kernel, PAYMENT, {"input": {"paid": 0}})
    olga = client_for("olga", "operator")
    (shown,) = olga.get(f"/api/sessions/{session}/graph").json()["interrupts"]
    assert shown["resume_schema"] == Payment.model_json_schema()
    assert shown["refused"] is None
    seen = {"interrupt_ids": shown["interrupt_ids"]}
    bad = resume(olga, task_id, "p0", shown["checkpoint_id"], {"amount": "lots"}, **seen)
    assert bad.status_code == 422 and "value['amount']" in bad.json()["detail"], bad.json()

    assert resume(olga, task_id, "p1", shown["checkpoint_id"], {"amount": 500},
                  **seen).status_code == 200
    advance(kernel, task_id)
    assert kernel.task(task_id).status is Status.WAITING
    (again,) = olga.get(f"/api/sessions/{session}/graph").json()["interrupts"]
    assert again["interrupt_ids"] == shown["interrupt_ids"]
    assert "at most 100" in again["refused"]
    page = olga.get(f"/sessions/{session}/")
    assert b"refused the last resume value" in page.content

    assert resume(olga, task_id, "p2", again["checkpoint_id"], {"amount": 50},
                  **seen).status_code == 200
    advance(kernel, task_id)
    task = kernel.task(task_id)
    assert task.outcome is not None and task.outcome["result"]["output"] == {"paid": 50}
