"""Compaction under real worker kills (SIGKILL): during the summary request, and after
its summary is committed (during the request it was made for). The model is a loopback
stand-in that records every request and can hold one open; the turn is made to compact
by the model's context-overflow answer."""

from __future__ import annotations

from typing import Any

import pytest

from kernel import Status, Task
from kernel.agent import COMPACTION
from kernel.agent.compaction import SUMMARY_PROMPT
from kernel.agent.context import SUMMARY_INTRO
from kernel.records import SUMMARY
from tests.model_stand_in import Completion, ModelStandIn, posts

from .harness import Stack, wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

OVERFLOW = Completion(
    '{"error": {"message": "too long", "type": "invalid_request_error", '
    '"code": "context_length_exceeded"}}', status=400)


def is_summary_request(body: Any) -> bool:
    return body["messages"][0] == {"role": "system", "content": SUMMARY_PROMPT}


def compactions(stack: Stack, session_id: str) -> list[Task]:
    return [t for t in stack.tasks(session_id) if t.kind == COMPACTION]


def test_killed_during_the_summary_request_and_after_its_commit_one_summary_is_kept(
    agent_stack: Stack, model: ModelStandIn
) -> None:
    stack = agent_stack
    model.completions += [
        Completion("Hello."),  # the first message, answered
        OVERFLOW,  # the second: the context is too long
        Completion("Summary: the user said hi.", hold=True),  # killed in here
        Completion("Summary: the user said hi."),  # asked again by the next worker
        Completion("Answered after the summary.", hold=True),  # killed in here too
        Completion("Answered after the summary."),
    ]
    stack.worker("w1")
    stack.beat()
    session_id, conversation, first = stack.converse("hi", request_id="req-1")
    stack.wait_answered(first.id)
    from kernel.agent import submit

    second = submit(stack.kernel.open(session_id), conversation, {"text": "more",
                                                                   "model": "remote"}, "req-2")
    assert second.submission is not None
    wait_for(lambda: model.held == 1, "the summary request to be in flight")
    (task,) = compactions(stack, session_id)
    task = stack.task(task.id)
    assert (task.status, task.phase, task.checkpoint["in_flight"]) == (
        Status.RUNNING, "summarize", 1)
    stack.holder(task.id).kill()
    # The held answer goes to a dead socket: nothing was committed. Only that request:
    # the turn's request after the summary is held in its turn, for the second kill.
    model.release(later=False)
    assert not [e for e in stack.entries(conversation) if e.kind == SUMMARY]

    stack.worker("w2")
    wait_for(lambda: model.held == 2, "the turn's request after the summary")
    [summary] = [e for e in stack.entries(conversation) if e.kind == SUMMARY]
    turn = next(t for t in stack.tasks(session_id) if t.kind == "agent-turn"
                and t.input["submissions"] == [second.submission.id])
    stack.holder(turn.id).kill()  # after the summary's commit
    model.release()

    stack.worker("w3")
    stack.wait_answered(second.submission.id)
    assert [e.kind for e in stack.entries(conversation) if e.kind == SUMMARY] == [SUMMARY]
    assert summary.payload["reason"] == "overflow"
    assert stack.task(task.id).outcome["kind"] == "succeeded"
    sent = posts(model)
    summary_requests = [b for b in sent if is_summary_request(b)]
    assert len(summary_requests) == 2  # the killed one, then its retry
    assert summary_requests[0]["messages"] == summary_requests[1]["messages"]
    last = sent[-1]["messages"]
    assert last[0] == {"role": "user", "content": SUMMARY_INTRO + "Summary: the user said hi."}
    assert last[-1] == {"role": "user", "content": "more"}
    assert len(compactions(stack, session_id)) == 1  # the overflow compacted once
