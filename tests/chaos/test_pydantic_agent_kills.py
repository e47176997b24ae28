"""A Pydantic AI agent (``tests.chaos.pydantic_agent``) on real Celery workers and
Postgres, SIGKILLed in each window that matters, and resumed by another worker.

Counted at the model (each request's step, from inside the workers): a response once
committed is never requested again. Counted at the email provider: one message per
recipient. An unsafe call cut mid-way is an uncertain step an operator resolves through
the API, and the run then completes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controlplane.worker.runtime import runtime
from kernel import Status, SubmissionStatus, Task

from .harness import Stack, operator_client, wait_for
from .pydantic_agent import RECIPIENTS
from .pydantic_runs import agent_stack_of, delivered, kill_at, model_steps, runs, start, turn_of

pytestmark = [pytest.mark.chaos, pytest.mark.slow]
AGENT = "tests.chaos.pydantic_agent.agent"


@pytest.fixture
def agent_stack(tmp_path: Path, transactional_db: None) -> Iterator[Stack]:
    with agent_stack_of(tmp_path, {"support": AGENT}) as running:
        yield running


def assert_completed(stack: Stack, session_id: str, submission: str) -> Task:
    stack.wait_answered(submission, timeout=90)
    turn = stack.wait_terminal(turn_of(stack, session_id).id)
    assert turn.outcome is not None and turn.outcome["kind"] == "succeeded", turn.outcome
    assert turn.outcome["result"]["output"] == {"customer": "ana", "notified": RECIPIENTS}
    assert delivered(stack) == Counter(RECIPIENTS)  # one message per recipient
    return turn


@pytest.mark.parametrize(
    ("point", "steps", "tool_runs"),
    [
        # the request in flight was never committed: asked again, the others once
        ("model:0", [0, 0, 1, 2], {"lookup": 1, "send_notice": 1, "validate": 1}),
        # the safe tool's result was to ride with response 1, which the kill cut short:
        # the tool runs again (a safe tool may), request 1 is asked again
        ("model:1", [0, 1, 1, 2], {"lookup": 2, "send_notice": 1, "validate": 1}),
        # response 0 committed, its (safe) tool not started: not asked again
        ("before:lookup", [0, 1, 2], {"lookup": 1, "send_notice": 1, "validate": 1}),
        # the safe tool runs again; no committed response is asked again
        ("tool:lookup", [0, 1, 2], {"lookup": 2, "send_notice": 1, "validate": 1}),
        # every unit is committed: only the framework's own validation runs again
        ("validate", [0, 1, 2], {"lookup": 1, "send_notice": 1, "validate": 2}),
    ],
)
def test_killed_in_a_window_the_run_resumes_on_another_worker(
    agent_stack: Stack, point: str, steps: list[int], tool_runs: dict[str, int]
) -> None:
    stack = agent_stack
    first = stack.worker("w1")
    stack.beat()
    session_id, conversation, submission = start(stack)
    killed = kill_at(stack, point)
    stack.worker("w2")
    turn = assert_completed(stack, session_id, submission)
    assert model_steps(stack) == steps
    assert runs(stack) == Counter(tool_runs)
    assert killed is first and turn.epoch >= 2  # taken over by w2
    results = {e.payload["call_id"]: e.payload for e in stack.entries(conversation)
               if e.kind == "tool_result"}
    assert results["call_lookup"]["replay"] == "safe"
    assert results["call_send"]["replay"] == "unsafe"


def test_an_unsafe_call_cut_midway_waits_for_the_operator_then_the_run_completes(
    agent_stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker dies inside ``send_notice`` after its first message: the next worker
    does not call it again but waits; the operator (through the API) has it run again,
    which the provider's idempotency keys make harmless: one message per recipient."""
    stack = agent_stack
    monkeypatch.setattr(runtime().dispatcher, "deliver", stack.deliver)
    stack.worker("w1")
    stack.beat()
    session_id, conversation, submission = start(stack)
    kill_at(stack, "tool:send_notice")
    stack.worker("w2")
    turn = wait_for(lambda: (t := turn_of(stack, session_id)).status is Status.WAITING and t,
                    "the run to wait for an operator", timeout=60)
    assert turn.wait == {"signal": "resolution:call_send:1"}
    assert runs(stack)["send_notice"] == 1 and delivered(stack) == Counter(RECIPIENTS[:1])
    assert stack.submission(submission).status is SubmissionStatus.PLACED

    operator = operator_client("olga")
    shown: Any = operator.get(f"/api/tasks/{turn.id}").json()
    assert [d["name"] for d in shown["decisions"]] == ["happened", "run_again", "not_done"]
    answer = operator.post(f"/api/tasks/{turn.id}/resolve", {
        "action_id": "olga-1", "reason": "the provider dedups by key", "decision": "run_again",
        "signal": "resolution:call_send:1", "epoch": turn.epoch,
    }, content_type="application/json")
    assert answer.status_code == 200, answer.content
    assert_completed(stack, session_id, submission)
    assert runs(stack)["send_notice"] == 2  # run again only because the operator said so
    assert model_steps(stack) == [0, 1, 2]
