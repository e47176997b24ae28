"""The approval gate with real workers: a gated call waits across a restart of every
process, holding no worker; an approval is applied once although the worker is killed
(SIGKILL) in the commit that follows it, or during the approved call; the timeout
denies it durably. Runs are counted from inside the workers (``tests.chaos.agent_tools``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controlplane.reads.approvals import request_identity
from kernel import Status, Task
from tests.model_stand_in import (
    Completion,
    ModelStandIn,
    by_round,
    tool_outputs,
)

from .harness import (
    Stack,
    backends_gone,
    gated_stack,
    lock_waiters,
    operator_client,
    session_lock,
    wait_for,
)

pytestmark = [pytest.mark.chaos, pytest.mark.slow]
PAY = {"id": "call_pay", "name": "pay", "arguments": {"value": "5"}}


@pytest.fixture
def stack(tmp_path: Path, transactional_db: None, model: ModelStandIn) -> Iterator[Stack]:
    yield from gated_stack(tmp_path, model)


def pay_task(stack: Stack, session_id: str) -> Task:
    return next(t for t in stack.tasks(session_id) if t.kind == "agent-tool")


def waiting_for_approval(stack: Stack, session_id: str) -> Task:
    return wait_for(
        lambda: any(t.kind == "agent-tool" for t in stack.tasks(session_id))
        and (t := pay_task(stack, session_id)).status is Status.SLEEPING
        and t.phase == "approval" and t,
        "the pay call to wait for approval")


def approve(session_id: str, task: Task, **body: Any) -> None:
    answer = operator_client("olga").post(
        f"/api/sessions/{session_id}/calls/call_pay/approve",
        {"action_id": "a1", "reason": "invoice checked",
         "digest": task.checkpoint["approval"]["digest"],
         "expected_request": request_identity(task.checkpoint["approval"]), **body},
        content_type="application/json")
    assert answer.status_code == 200, answer.content


def test_a_gated_call_waits_across_restarts_and_an_approved_call_killed_runs_once(
    stack: Stack, model: ModelStandIn
) -> None:
    model.script = by_round(
        Completion("", ({**PAY, "arguments": {"value": "5", "hold": True}},)),
        Completion("The payment may or may not have gone out."),
    )
    stack.worker("w1")
    stack.beat()
    session_id, conversation, submission = stack.converse("Pay the supplier 5")
    task = waiting_for_approval(stack, session_id)
    assert task.lease_owner is None
    for process in list(stack.processes):  # every process restarts
        process.kill()
    stack.worker("w2")
    stack.beat("beat2")
    time.sleep(2)
    assert pay_task(stack, session_id).status is Status.SLEEPING and stack.tool_runs() == []

    approve(session_id, task, arguments={"value": "4", "hold": True})  # edited
    wait_for(lambda: stack.tool_runs() == ["pay"], "the approved call to run")
    stack.holder(task.id).kill()  # during the approved (unsafe) call
    stack.worker("w3")
    stack.wait_answered(submission.id)
    assert stack.tool_runs() == ["pay"]  # never twice
    done = stack.task(task.id)
    assert done.checkpoint["intent"]["arguments"] == {"value": "4", "hold": True}
    result = next(e.payload for e in stack.entries(conversation) if e.kind == "tool_result")
    assert result["interrupted"] is True and result["approval"]["by"] == "user:olga"
    assert tool_outputs([r.body for r in model.received if r.method == "POST"][-1])[0][
        "interrupted"] is True


def test_killed_in_the_commit_after_the_approval_the_call_runs_once(
    stack: Stack, model: ModelStandIn
) -> None:
    model.script = by_round(Completion("", (PAY,)), Completion("Paid."))
    stack.worker("w1", queues="default,brain")  # no hands worker yet
    stack.beat()
    session_id, conversation, submission = stack.converse("Pay the supplier 5")
    hands = stack.worker("h0", queues="hands")
    task = waiting_for_approval(stack, session_id)
    hands.kill()
    approve(session_id, task)
    with session_lock(session_id) as lock:
        hands = stack.worker("h1", queues="hands")
        waiters = wait_for(
            lambda: stack.task(task.id).status is Status.RUNNING and lock_waiters(lock),
            "the approved call's intent commit to block on the session lock")
        assert stack.task(task.id).phase == "approval"
        hands.kill()  # between the approval's commit and the tool's intent
    wait_for(lambda: backends_gone(waiters), "the killed worker's backend to end")
    assert stack.tool_runs() == []
    stack.worker("h2", queues="hands")
    stack.wait_answered(submission.id, timeout=90)
    # The approval left phase ``approval`` once: by the killed worker's intent commit
    # (its writes and COMMIT were already at the server, which finished it once the
    # lock was free) or by the recovery's, never both.
    history = stack.history(task.id)
    assert history.count(("running", "execute")) == 1, history
    result = next(e.payload for e in stack.entries(conversation) if e.kind == "tool_result")
    assert result["approval"]["reason"] == "invoice checked"
    if result.get("interrupted"):  # the killed run's intent landed: unsafe, not run again
        assert stack.tool_runs() == []
    else:  # nothing of it landed: the recovery ran the approved call, once
        assert stack.tool_runs() == ["pay"] and result["result"] == {"paid": "5"}


def test_the_timeout_denies_the_call_durably(
    tmp_path: Path, transactional_db: None, model: ModelStandIn
) -> None:
    for stack in gated_stack(tmp_path, model, GATE_TIMEOUT="3"):
        model.script = by_round(Completion("", (PAY,)), Completion("Not paid."))
        stack.worker("w1")
        stack.beat()
        session_id, conversation, submission = stack.converse("Pay the supplier 5")
        stack.wait_answered(submission.id, timeout=60)
        result = next(e.payload for e in stack.entries(conversation)
                      if e.kind == "tool_result")
        assert result["denied"] is True and result["approval"]["decision"] == "timeout"
        assert stack.tool_runs() == []
