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

from kernel import Status, Task
from kernel.environment import BLOCKED_DOCUMENT
from tests.model_stand_in import Completion, ModelStandIn, by_round

from .harness import Stack, operator_client, wait_for
from .test_approval_kills import gated_stack

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
         "digest": task.checkpoint["approval"]["digest"]},
        content_type="application/json")
    assert answer.status_code == 200, answer.content


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
    report = wait_for(
        lambda: stack.task(calls["pay"].id).lease_owner is None
        and stack.kernel.document(session_id, BLOCKED_DOCUMENT, calls["pay"].id) or None,
        "the worker to report the pay call blocked and give it back")
    assert report["worker"] == changed.lease_owner
    [difference] = report["differences"]
    assert difference.startswith("tool pay: ") and "it was started with" in difference
    pay = stack.task(calls["pay"].id)
    assert pay.status is Status.PENDING and pay.lease_owner is None
    assert stack.tool_runs() == ["refund"]  # never continued silently

    page = olga.get(f"/tasks/{pay.id}/").content.decode()
    assert "Environment changed" in page and "tool pay: " in page
    assert 'name="expected_seq"' in page
    api = olga.get(f"/api/tasks/{pay.id}").json()
    assert "tool pay: " in api["blocked"]

    answer = olga.post(f"/api/tasks/{pay.id}/migrate",
                       {"action_id": "m1", "reason": "the new schema only adds a field",
                        "expected_seq": pay.updated_seq}, content_type="application/json")
    assert answer.status_code == 200, answer.content
    stack.wait_answered(submission.id)
    assert sorted(stack.tool_runs()) == ["pay", "refund"]
    done = stack.task(pay.id)
    assert done.outcome["kind"] == "succeeded"
    assert "tool pay: " not in (olga.get(f"/api/tasks/{pay.id}").json()["blocked"] or "")
    results = [e.payload for e in stack.entries(conversation) if e.kind == "tool_result"]
    assert sorted(r["name"] for r in results) == ["pay", "refund"]
