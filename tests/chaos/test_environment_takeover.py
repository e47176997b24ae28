"""The environment at takeover with real workers: a run started under one worker is
taken over by a worker started with a changed tool schema (``PAY_SCHEMA=2``); the call
that needs that tool is left blocked with the difference on its task page and never
runs silently, the call of an unchanged tool goes on, and an operator's migrate lets the
blocked one continue (counted from inside the workers)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controlplane.reads.approvals import request_identity
from kernel import Status, Task
from kernel.environment import BLOCKED_DOCUMENT
from tests.model_stand_in import Completion, ModelStandIn, by_round

from .harness import Stack, gated_stack, operator_client, wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.slow]
PAY = {"id": "call_pay", "name": "pay", "arguments": {"value": "5"}}
REFUND = {"id": "call_refund", "name": "refund", "arguments": {"value": "2"}}


@pytest.fixture
def stack(tmp_path: Path, transactional_db: None, model: ModelStandIn) -> Iterator[Stack]:
    yield from gated_stack(tmp_path, model)


def tool_task(stack: Stack, session_id: str, name: str) -> Task:
    return next(t for t in stack.tasks(session_id)
                if t.kind == "agent-tool" and t.input["call"]["name"] == name)


def awaiting_approval(stack: Stack, session_id: str) -> dict[str, Task]:
    def both() -> dict[str, Task] | None:
        calls = {t.input["call"]["name"]: t for t in stack.tasks(session_id)
                 if t.kind == "agent-tool"}
        waiting = len(calls) == 2 and all(
            t.status is Status.SLEEPING and t.phase == "approval" for t in calls.values())
        return calls if waiting else None
    return wait_for(both, "both calls to wait for approval")


def approve(client: Any, session_id: str, task: Task, call_id: str) -> None:
    answer = client.post(
        f"/api/sessions/{session_id}/calls/{call_id}/approve",
        {"action_id": f"a-{call_id}", "reason": "checked",
         "digest": task.checkpoint["approval"]["digest"],
         "expected_request": request_identity(task.checkpoint["approval"])},
        content_type="application/json")
    assert answer.status_code == 200, answer.content


def acted(client: Any, path: str, body: dict[str, Any]) -> Any:
    """An operator's action on a task left blocked, taken again while it is refused as
    running: a late message for the task may have the worker that gave it back claim it
    again for a moment (and give it back), and the action is refused meanwhile."""
    tries = iter(range(100))

    def answered() -> Any:
        answer = client.post(path, {**body, "action_id": f"{body['action_id']}-{next(tries)}"},
                             content_type="application/json")
        running = answer.status_code == 409 and b"running" in answer.content
        return None if running else answer

    return wait_for(answered, f"{path} to be taken while the task is not running")


def test_a_worker_with_a_changed_tool_schema_blocks_only_the_run_that_needs_it(
    stack: Stack, model: ModelStandIn
) -> None:
    model.script = by_round(Completion("", (PAY, REFUND)), Completion("Paid and refunded."))
    first = stack.worker("w1")
    stack.beat()
    session_id, conversation, submission = stack.converse("Pay the supplier, refund Ana")
    calls = awaiting_approval(stack, session_id)
    first.kill()
    changed = stack.worker("w2", PAY_SCHEMA="2")

    olga = operator_client("olga")
    approve(olga, session_id, calls["pay"], "call_pay")
    approve(olga, session_id, calls["refund"], "call_refund")
    wait_for(lambda: stack.tool_runs() == ["refund"], "the unaffected call to run")

    def given_back() -> tuple[Task, Any] | None:
        # One read of the task: a late message for it may have the worker claim it again
        # for a moment (and give it back), so a second read could find it held.
        task = stack.task(calls["pay"].id)
        said = stack.kernel.document(session_id, BLOCKED_DOCUMENT, task.id)
        return (task, said) if task.lease_owner is None and said else None

    pay, report = wait_for(given_back, "the worker to report the pay call blocked and give it back")
    assert report["worker"] == changed.lease_owner
    [difference] = report["differences"]
    assert difference.startswith("tool pay: ") and "it was started with" in difference
    assert pay.status is Status.PENDING
    assert stack.tool_runs() == ["refund"]  # never continued silently

    page = olga.get(f"/tasks/{pay.id}/").content.decode()
    assert "Environment changed" in page and "tool pay: " in page
    assert 'name="expected_seq"' in page
    api = olga.get(f"/api/tasks/{pay.id}").json()
    assert "tool pay: " in api["blocked"]
    attention = olga.get("/attention/").content.decode()
    assert f"/tasks/{pay.id}/" in attention and "tool pay: " in attention

    answer = acted(olga, f"/api/tasks/{pay.id}/migrate",
                   {"action_id": "m1", "reason": "the new schema only adds a field",
                    "expected_seq": pay.updated_seq,
                    "expected_report": api["environment_report"]})
    assert answer.status_code == 200, answer.content
    stack.wait_answered(submission.id)
    assert sorted(stack.tool_runs()) == ["pay", "refund"]
    done = stack.task(pay.id)
    assert done.outcome["kind"] == "succeeded"
    assert "tool pay: " not in (olga.get(f"/api/tasks/{pay.id}").json()["blocked"] or "")
    results = [e.payload for e in stack.entries(conversation) if e.kind == "tool_result"]
    assert sorted(r["name"] for r in results) == ["pay", "refund"]


def test_a_fork_starts_the_blocked_call_again_under_the_new_environment(
    stack: Stack, model: ModelStandIn
) -> None:
    model.script = by_round(Completion("", (PAY,)), Completion("Paid."))
    first = stack.worker("w1")
    stack.beat()
    session_id, _, submission = stack.converse("Pay the supplier")
    task = wait_for(
        lambda: any(t.kind == "agent-tool" for t in stack.tasks(session_id))
        and (t := tool_task(stack, session_id, "pay")).status is Status.SLEEPING
        and t.phase == "approval" and t, "the pay call to wait for approval")
    first.kill()
    stack.worker("w2", PAY_SCHEMA="2")
    olga = operator_client("olga")
    approve(olga, session_id, task, "call_pay")
    blocked = wait_for(
        lambda: (t := stack.task(task.id)).lease_owner is None
        and stack.kernel.document(session_id, BLOCKED_DOCUMENT, task.id) and t or None,
        "the worker to report the pay call blocked and give it back")

    points = olga.get(f"/api/tasks/{task.id}/restarts").json()
    assert [p["phase"] for p in points] == ["call", "approval"]
    preview = olga.get(f"/api/tasks/{task.id}/restarts/{points[0]['seq']}").json()
    assert "tool pay: " in preview["environment"]
    answer = acted(olga, f"/api/tasks/{task.id}/restart",
                   {"action_id": "f1", "reason": "ask again under the new schema",
                    "seq": points[0]["seq"], "expected_seq": blocked.updated_seq,
                    "expected_report": preview["expected_report"]})
    assert answer.status_code == 200, answer.content
    # The fork runs under the new environment, from the call: it asks for approval anew
    # (the approval given to the old run does not let it through).
    again = wait_for(
        lambda: (t := stack.task(task.id)).status is Status.SLEEPING
        and t.phase == "approval" and t.updated_seq > blocked.updated_seq and t,
        "the forked call to wait for a new approval")
    assert again.checkpoint["_environment"]["tool pay"] != \
        blocked.checkpoint["_environment"]["tool pay"]
    assert stack.tool_runs() == []
    second = olga.post(f"/api/sessions/{session_id}/calls/call_pay/approve",
                       {"action_id": "a2", "reason": "checked again",
                        "digest": again.checkpoint["approval"]["digest"],
                        "expected_request": request_identity(again.checkpoint["approval"])},
                       content_type="application/json")
    assert second.status_code == 200, second.content
    stack.wait_answered(submission.id)
    assert stack.tool_runs() == ["pay"]
