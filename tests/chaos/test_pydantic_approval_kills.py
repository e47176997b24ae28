"""A Pydantic AI agent's deferred tool (``tests.chaos.pydantic_billing``) on the kernel's
approval gate, with real workers and Postgres: the call waits holding no worker, across
a restart of every process, and goes on after the operator approves through the API
(the tool runs once, the model gets its return); denied, the model gets the operator's
reason as the framework hands a denial over. Counted from inside the workers."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controlplane.reads.approvals import request_identity
from kernel import Draft, Status, SubmissionStatus, Task
from kernel.agent import approval as approvals
from kernel.agent import submit

from .harness import Stack, lines, operator_client, wait_for
from .pydantic_runs import agent_stack_of

pytestmark = [pytest.mark.chaos, pytest.mark.slow]
AGENTS = {"billing": "tests.chaos.pydantic_billing.agent"}


@pytest.fixture
def stack(tmp_path: Path, transactional_db: None) -> Iterator[Stack]:
    with agent_stack_of(tmp_path, AGENTS) as running:
        yield running


def start(stack: Stack) -> tuple[str, str, str]:
    handle = stack.kernel.create_session(metadata={"title": "deferred tool"})
    draft = Draft(actor="user:chaos")
    conversation = draft.create_conversation()
    handle.commit(draft)
    submitted = submit(handle, conversation, {"text": "Pay the supplier", "agent": "billing"},
                       "req-1")
    assert submitted.submission is not None
    return handle.id, conversation, submitted.submission.id


def turn_of(stack: Stack, session_id: str) -> Task:
    (turn,) = [t for t in stack.tasks(session_id) if t.kind == "agent:billing"]
    return turn


def waiting_for_approval(stack: Stack, session_id: str) -> Task:
    def asked() -> Task | None:
        found = [t for t in stack.tasks(session_id) if t.kind == approvals.TASK_KIND]
        return found[0] if found and approvals.pending(found[0]) is not None else None

    return wait_for(asked, "the pay call to wait for approval", timeout=60)


def decide(operator: Any, session_id: str, task: Task, decision: str, reason: str) -> None:
    answer = operator.post(
        f"/api/sessions/{session_id}/calls/call_pay/{decision}",
        {"action_id": f"olga-{decision}", "reason": reason,
         "digest": task.checkpoint["approval"]["digest"],
         "expected_request": request_identity(task.checkpoint["approval"])},
        content_type="application/json")
    assert answer.status_code == 200, answer.content


def test_a_deferred_call_waits_across_restarts_and_runs_once_after_approve(
    stack: Stack,
) -> None:
    stack.worker("w1")
    stack.beat()
    session_id, conversation, submission = start(stack)
    task = waiting_for_approval(stack, session_id)
    turn = wait_for(lambda: (t := turn_of(stack, session_id)).status is Status.WAITING and t,
                    "the turn to wait for the decision")
    assert task.lease_owner is None and turn.lease_owner is None  # no worker held

    operator = operator_client("olga")
    listed: Any = operator.get(f"/api/sessions/{session_id}/approvals").json()
    assert [(p["call_id"], p["name"], p["arguments"], p["who"]) for p in listed] == [
        ("call_pay", "pay", {"amount": 5}, "operators")]

    for process in list(stack.processes):  # every process restarts
        process.kill()
    stack.worker("w2")
    stack.beat("beat2")
    time.sleep(2)
    assert approvals.pending(stack.task(task.id)) is not None
    assert lines(stack, "runs") == [] and lines(stack, "model") == ["0"]

    decide(operator, session_id, task, "approve", "invoice checked")
    stack.wait_answered(submission, timeout=90)
    assert [line.split()[0] for line in lines(stack, "runs")] == ["pay"]  # once
    assert lines(stack, "model") == ["0", "1"]  # the first response not requested again
    assert json.loads(lines(stack, "told")[-1]) == "paid 5"
    done = stack.wait_terminal(turn.id)
    assert done.outcome is not None and done.outcome["result"]["output"] == (
        "The payment call came back: **paid 5**")
    result = next(e.payload for e in stack.entries(conversation)
                  if e.kind == "tool_result" and e.payload["call_id"] == "call_pay")
    assert result["approval"]["by"] == "user:olga" and result["result"] == "paid 5"


def test_deny_reaches_the_model_as_the_calls_return_and_nothing_runs(stack: Stack) -> None:
    stack.worker("w1")
    stack.beat()
    session_id, conversation, submission = start(stack)
    task = waiting_for_approval(stack, session_id)
    decide(operator_client("olga"), session_id, task, "deny", "the supplier was paid last week")
    answered = stack.wait_answered(submission, timeout=90)
    assert answered.status is SubmissionStatus.ANSWERED
    assert lines(stack, "runs") == []
    assert json.loads(lines(stack, "told")[-1]) == (
        "The tool call was denied: the supplier was paid last week")
    result = next(e.payload for e in stack.entries(conversation)
                  if e.kind == "tool_result" and e.payload["call_id"] == "call_pay")
    assert result["denied"] is True and result["approval"]["by"] == "user:olga"
