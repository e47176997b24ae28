"""Hosted LangGraph graphs with real workers: an agent (``create_react_agent`` with
langchain_core's fake chat model) whose worker is SIGKILLed in the middle of a super-step,
and an interrupt that waits across a restart of every process.

The model asks for two tools at once, so the tools step runs two nodes side by side:
``lookup_recipients`` returns at once and its writes are committed; ``send_notice`` is
held by the provider at its third message (a stall before the store) when the worker is
killed. Another worker resumes the thread from its last checkpoint: the lookup's saved
writes are applied, not run again; ``send_notice`` runs again and sends each recipient's
message under the same key, so the provider holds one message per recipient. The model
is asked twice in all: once before the kill, once after the tools.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings

from kernel import Draft, Status
from kernel.hosts.langgraph import SessionStoreSaver
from tests.langgraph_graphs import AGENT, APPROVAL, RECIPIENTS, runs

from .harness import Stack, chaos_stack, operator_client, wait_for

MODULE = "tests.langgraph_graphs.register"
STALLED = RECIPIENTS[2]
pytestmark = [pytest.mark.chaos, pytest.mark.slow]


@pytest.fixture
def graph_stack(
    tmp_path: Path, transactional_db: None, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Stack]:
    monkeypatch.setattr(settings, "KERNEL_TASK_MODULES", [MODULE])  # this process's registry
    env = {"KERNEL_TASK_MODULES": MODULE, "LANGGRAPH_RUNS": str(tmp_path / "graph-runs")}
    with chaos_stack(tmp_path, env=env) as running:
        yield running


def test_an_agent_killed_mid_step_resumes_on_another_worker_and_sends_once_each(
    graph_stack: Stack, tmp_path: Path
) -> None:
    stack = graph_stack
    recorded = tmp_path / "graph-runs"
    stack.admin.set_faults(stall={"to": STALLED, "ms": 30_000, "when": "before_store"})
    first = stack.worker("w1")
    stack.beat()
    handle = stack.kernel.create_session(metadata={"title": "langgraph chaos"})
    draft = Draft(actor="user:chaos")
    task_id = draft.create_task(AGENT, {"input": {"messages": [["user", "Send the notice."]]}})
    handle.commit(draft)

    wait_for(lambda: stack.admin.faults()["fired"]["stall"] == 1,
             "the provider to hold the third message of send_notice", timeout=60)
    assert Counter(runs(recorded)) == Counter(
        ["model", "lookup", f"send {RECIPIENTS[0]}", f"send {RECIPIENTS[1]}", f"send {STALLED}"])
    saver = SessionStoreSaver(stack.kernel)
    try:
        mid_step = saver.get_tuple({"configurable": {"thread_id": handle.id}})
        assert mid_step is not None
        saved = [value for _task, channel, value in mid_step.pending_writes or []
                 if channel == "messages"]
        assert [m.name for batch in saved for m in batch] == ["lookup_recipients"], saved
    finally:
        saver.close()
    task = stack.task(task_id)
    assert task.status is Status.RUNNING and task.checkpoint["langgraph"]["step"] == 1
    first.kill()

    stack.admin.set_faults()  # later sends are not held (the stalled one stays held)
    stack.worker("w2")
    done = stack.wait_terminal(task_id, timeout=90)
    assert done.outcome is not None and done.outcome["kind"] == "succeeded", done.outcome
    assert done.epoch == 2  # claimed twice: by the killed worker, then by w2

    messages = stack.admin.messages()
    assert sorted(m["to"] for m in messages) == sorted(RECIPIENTS), messages
    seen = Counter(runs(recorded))
    assert seen["model"] == 2 and seen["lookup"] == 1, seen
    assert seen[f"send {RECIPIENTS[0]}"] == 2 and seen[f"send {RECIPIENTS[4]}"] == 1, seen
    final = done.outcome["result"]["output"]["messages"][-1]
    assert final["kwargs"]["content"] == "Sent the notice to five customers."

    stack.admin.end_stalls()  # the killed worker's held request: a duplicate of its key
    wait_for(lambda: any(r["to"] == STALLED and r["faults"] == ["stall"]
                         and r["outcome"] == "duplicate" for r in stack.admin.requests()),
             "the stalled request to reach the store")
    assert len(stack.admin.messages()) == len(RECIPIENTS)


def test_an_interrupt_waits_across_a_restart_of_every_process_and_resumes_from_the_api(
    graph_stack: Stack, tmp_path: Path
) -> None:
    """The interrupted run holds no worker while it waits: every process (workers, beat)
    is killed and new ones started, and it still waits, with nothing run again; a resume
    through the API then lets a new worker finish it, with the operator's value."""
    stack = graph_stack
    recorded = tmp_path / "graph-runs"
    stack.worker("w1")
    stack.beat()
    handle = stack.kernel.create_session(metadata={"title": "langgraph interrupt"})
    draft = Draft(actor="user:chaos")
    task_id = draft.create_task(APPROVAL, {"input": {"text": "notice"}})
    handle.commit(draft)
    task = wait_for(lambda: (t := stack.task(task_id)).status is Status.WAITING and t,
                    "the graph to stop at its interrupt", timeout=60)
    assert task.lease_owner is None
    waiting = task.checkpoint["interrupted"]
    assert waiting["interrupts"][0]["value"]["text"] == "draft of notice"

    for process in list(stack.processes):  # every process restarts
        process.kill()
    stack.worker("w2")
    stack.beat("beat2")
    time.sleep(2)  # a chance for a wrong claim to happen before we look
    assert stack.task(task_id).status is Status.WAITING
    assert runs(recorded) == ["draft", "approve"]

    answer = operator_client("olga").post(
        f"/api/tasks/{task_id}/resume",
        {"action_id": "r1", "reason": "read the draft", "checkpoint_id":
         waiting["checkpoint_id"], "value": {"approved": True},
         "interrupt_ids": [i["id"] for i in waiting["interrupts"]]},
        content_type="application/json")
    assert answer.status_code == 200, answer.content
    done = stack.wait_terminal(task_id, timeout=90)
    assert done.outcome is not None and done.outcome["kind"] == "succeeded", done.outcome
    assert done.outcome["result"]["output"]["approved"] == {"approved": True}
    # The interrupted node runs again from its start on resume; nothing else does.
    assert runs(recorded) == ["draft", "approve", "approve", "publish"]
