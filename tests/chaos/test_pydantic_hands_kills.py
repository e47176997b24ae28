"""A Pydantic AI agent whose tools run on the hands queue
(:mod:`tests.chaos.pydantic_hands_agent`), on real Celery workers and Postgres: one
worker takes the brain queue, another the hands queue, and the hands worker is
SIGKILLed inside the unsafe tool after its first message.

The turn waits, holding no lease, while its calls run on the hands worker; the killed
call is an uncertain step of its hands task, which no worker calls again: an operator
resolves it through the API and the run completes. Counted at the model: no committed
response is requested again; at the provider: the one message sent before the kill.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controlplane.worker.runtime import runtime
from kernel import Status, Task

from .harness import Stack, lines, operator_client, wait_for
from .pydantic_agent import RECIPIENTS
from .pydantic_runs import agent_stack_of, delivered, kill_at, model_steps, runs, start, turn_of

pytestmark = [pytest.mark.chaos, pytest.mark.slow]
AGENT = "tests.chaos.pydantic_hands_agent.agent"
HANDS_KIND = "agent-tool:support"


@pytest.fixture
def hands_stack(tmp_path: Path, transactional_db: None) -> Iterator[Stack]:
    with agent_stack_of(tmp_path, {"support": AGENT}) as running:
        yield running


def hands_task(stack: Stack, session_id: str, call_id: str) -> Task:
    return next(t for t in stack.tasks(session_id)
                if t.kind == HANDS_KIND and t.input["call"]["id"] == call_id)


def test_a_hands_worker_killed_in_an_unsafe_call_leaves_an_uncertain_step_not_a_second_call(
    hands_stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    stack = hands_stack
    monkeypatch.setattr(runtime().dispatcher, "deliver", stack.deliver)
    brain = stack.worker("brain", queues="default,brain")
    first_hands = stack.worker("hands1", queues="hands")
    stack.beat()
    session_id, conversation, submission = start(stack)
    killed = kill_at(stack, "tool:send_notice")
    assert killed is first_hands
    # While the call ran there, the turn waited holding no lease.
    turn = turn_of(stack, session_id)
    assert turn.status is Status.WAITING and turn.lease_owner is None
    send = hands_task(stack, session_id, "call_send")
    assert send.queue == "hands" and send.parent_id == turn.id
    assert send.checkpoint["intents"]["call_send"]["attempt"] == 1

    stack.worker("hands2", queues="hands")
    send = wait_for(lambda: (t := hands_task(stack, session_id, "call_send")).status
                    is Status.WAITING and t, "the hands task to wait for an operator",
                    timeout=60)
    assert send.wait == {"signal": "resolution:call_send:1"}
    assert runs(stack)["send_notice"] == 1 and delivered(stack) == Counter(RECIPIENTS[:1])
    assert turn_of(stack, session_id).status is Status.WAITING

    operator = operator_client("olga")
    shown: Any = operator.get(f"/api/tasks/{send.id}").json()
    assert [d["name"] for d in shown["decisions"]] == ["happened", "run_again", "not_done"]
    answer = operator.post(f"/api/tasks/{send.id}/resolve", {
        "action_id": "olga-1", "reason": "ana's arrived; ben's did not go out",
        "decision": "happened", "receipt": {"result": "sent to ana only"},
        "signal": "resolution:call_send:1", "epoch": send.epoch,
    }, content_type="application/json")
    assert answer.status_code == 200, answer.content

    stack.wait_answered(submission, timeout=90)
    turn = stack.wait_terminal(turn_of(stack, session_id).id)
    assert turn.outcome is not None and turn.outcome["kind"] == "succeeded", turn.outcome
    assert model_steps(stack) == [0, 1, 2]  # no committed response asked again
    assert runs(stack)["send_notice"] == 1  # never called a second time
    assert delivered(stack) == Counter(RECIPIENTS[:1])
    # Each call ran in a hands worker, never in the brain worker.
    pids = {line.split()[1] for line in lines(stack, "runs")
            if line.split()[0] in ("lookup", "send_notice")}
    assert str(brain.pid) not in pids
    results = {e.payload["call_id"]: e.payload for e in stack.entries(conversation)
               if e.kind == "tool_result"}
    assert results["call_send"]["result"] == "sent to ana only"
    assert results["call_send"]["resolved"]["by"] == "user:olga"
    assert results["call_lookup"]["replay"] == "safe"


@pytest.mark.parametrize(
    ("point", "killed_queue", "steps", "tool_runs"),
    [
        # the safe call's hands worker dies: its task runs the call again elsewhere
        ("tool:lookup", "hands", [0, 1, 2], {"lookup": 2, "send_notice": 1, "validate": 1}),
        # the brain dies asking the second request: asked again, but the safe call's
        # result was committed by its own task, so it does not run again
        ("model:1", "brain", [0, 1, 1, 2], {"lookup": 1, "send_notice": 1, "validate": 1}),
    ],
)
def test_killed_in_a_window_the_run_resumes_and_each_call_runs_on_hands(
    hands_stack: Stack, monkeypatch: pytest.MonkeyPatch, point: str, killed_queue: str,
    steps: list[int], tool_runs: dict[str, int],
) -> None:
    stack = hands_stack
    monkeypatch.setattr(runtime().dispatcher, "deliver", stack.deliver)
    brain = stack.worker("brain1", queues="default,brain")
    hands = stack.worker("hands1", queues="hands")
    stack.beat()
    session_id, conversation, submission = start(stack)
    killed = kill_at(stack, point)
    assert killed is (hands if killed_queue == "hands" else brain)
    if killed_queue == "hands":
        stack.worker("hands2", queues="hands")
    else:
        brain = stack.worker("brain2", queues="default,brain")
    stack.wait_answered(submission, timeout=90)
    turn = stack.wait_terminal(turn_of(stack, session_id).id)
    assert turn.outcome is not None and turn.outcome["kind"] == "succeeded", turn.outcome
    assert turn.outcome["result"]["output"] == {"customer": "ana", "notified": RECIPIENTS}
    assert model_steps(stack) == steps
    assert runs(stack) == Counter(tool_runs)
    assert delivered(stack) == Counter(RECIPIENTS)  # one message per recipient
    brains = {str(p.pid) for p in stack.processes if p.name.startswith("brain")}
    assert not brains & {line.split()[1] for line in lines(stack, "runs")
                         if line.split()[0] in ("lookup", "send_notice")}
