"""Hosted LangGraph graphs on the in-memory storage, run by the in-process scheduler:
checkpoints committed with the task's progress, interrupts as durable waits, forks."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypedDict

import pytest

from kernel import Draft, InMemoryStorage, Kernel, Registry, Scheduler, Status
from kernel.hosts.langgraph import SessionStoreSaver
from kernel.hosts.langgraph.host import fork_input
from kernel.hosts.langgraph.interrupts import resume_signal
from kernel.hosts.langgraph.layout import CHECKPOINT, HOST, INDEX
from kernel.registry import TaskDefinition
from tests.langgraph_graphs import APPROVAL, DECISION, PIPELINE, register_all, runs


@pytest.fixture
def recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "runs"
    monkeypatch.setenv("LANGGRAPH_RUNS", str(path))
    return path


@pytest.fixture
def kernel() -> Kernel:
    registry = Registry()
    made: list[Kernel] = []
    register_all(registry, lambda: made[0])
    made.append(Kernel(InMemoryStorage(), registry))
    return made[0]


def start(kernel: Kernel, kind: str, input: object, session: str | None = None) -> tuple[str, str]:
    handle = kernel.open(session) if session else kernel.create_session()
    draft = Draft(actor="user:test")
    task_id = draft.create_task(kind, input)
    handle.commit(draft)
    return handle.id, task_id


def test_each_checkpoint_is_committed_with_the_tasks_progress(
    kernel: Kernel, recorded: Path
) -> None:
    session, task_id = start(kernel, PIPELINE, {"input": {"messages": [("user", "go")]}})
    Scheduler(kernel).run_until_idle()
    task = kernel.task(task_id)
    assert task.outcome is not None and task.outcome["kind"] == "succeeded", task.outcome
    assert runs(recorded) == ["model"] * 4
    puts = [c for c in kernel.commits_after(session, 0)
            if any(i.get("type") == "document" and i["kind"] == INDEX for i in c.summary)]
    assert len(puts) == 6  # the input, then one after each of the 4 nodes' steps, and the last
    assert all(any(i.get("kind") == CHECKPOINT for i in c.summary) for c in puts)
    for commit in puts:
        assert [i["id"] for i in commit.summary if i.get("type") == "task"] == [task_id]
        assert commit.actor == f"task:{task_id}"
    assert task.checkpoint["langgraph"]["checkpoint_id"] == task.outcome["result"]["checkpoint_id"]


def test_an_interrupt_is_a_durable_wait_and_the_resume_value_reaches_the_node(
    kernel: Kernel, recorded: Path
) -> None:
    session, task_id = start(kernel, APPROVAL, {"input": {"text": "notice"}})
    Scheduler(kernel).run_until_idle()
    task = kernel.task(task_id)
    assert task.status is Status.WAITING and task.lease_owner is None
    waiting = task.checkpoint["interrupted"]
    assert waiting["interrupts"][0]["value"] == {"question": "publish?",
                                                "text": "draft of notice", "schema": DECISION}
    assert task.wait == {"signal": resume_signal(waiting["checkpoint_id"])}

    draft = Draft(actor="user:olga")
    draft.signal(task_id, resume_signal(waiting["checkpoint_id"]), {"value": {"approved": True}},
                 step_epoch=task.epoch)
    kernel.open(session).commit(draft)
    Scheduler(Kernel(kernel.storage, kernel.registry)).run_until_idle()  # a new process
    task = kernel.task(task_id)
    assert task.outcome is not None and task.outcome["kind"] == "succeeded", task.outcome
    assert task.outcome["result"]["output"]["approved"] == {"approved": True}
    # LangGraph re-runs the interrupted node from its start on resume: "approve" twice.
    assert runs(recorded) == ["draft", "approve", "approve", "publish"]


def test_a_fork_from_the_third_checkpoint_runs_only_the_steps_after_it(
    kernel: Kernel, recorded: Path
) -> None:
    session, first = start(kernel, PIPELINE, {"input": {"messages": [("user", "go")]}})
    Scheduler(kernel).run_until_idle()
    assert runs(recorded) == ["model"] * 4
    saver = SessionStoreSaver(kernel)
    history = list(reversed(list(saver.list({"configurable": {"thread_id": session}}))))
    third = history[2]  # the input (step -1), step0 to run (0), step0 done, step1 next (1)
    assert third.metadata["step"] == 1
    assert saver.get_tuple(third.config).checkpoint["versions_seen"].get("step0")
    _, fork = start(kernel, PIPELINE, fork_input(third.config["configurable"]["checkpoint_id"]),
                    session=session)
    Scheduler(kernel).run_until_idle()
    forked = kernel.task(fork)
    assert forked.outcome is not None and forked.outcome["kind"] == "succeeded", forked.outcome
    assert runs(recorded) == ["model"] * 7  # step1, step2 and step3 again; step0 not
    # Both branches stay readable: the original's last checkpoint and the fork's.
    original_end = kernel.task(first).outcome["result"]["checkpoint_id"]
    fork_end = forked.outcome["result"]["checkpoint_id"]
    assert original_end != fork_end
    for checkpoint_id in (original_end, fork_end):
        found = saver.get_tuple({"configurable": {"thread_id": session,
                                                  "checkpoint_id": checkpoint_id}})
        assert found is not None and len(found.checkpoint["channel_values"]["messages"]) == 5
    saver.close()


class Asked(TypedDict):
    answer: Any


def test_what_a_node_does_before_interrupt_happens_again_unless_it_is_keyed(
    recorded: Path,
) -> None:
    """LangGraph re-runs an interrupted node from its start on resume: an effect before
    ``interrupt()`` happens once per run of the node (twice here) unless it is keyed by
    something the re-run repeats, such as the node's task namespace in the thread
    (``checkpoint_ns``: the node's name and LangGraph's task id, the same on resume)."""
    from langgraph.config import get_config
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import interrupt

    from kernel.hosts.langgraph.host import register_graph

    unguarded: list[str] = []
    provider: dict[str, int] = {}  # keyed sends: a key seen before is not sent again

    def ask(state: Asked) -> dict[str, Any]:
        unguarded.append("sent")
        conf = get_config()["configurable"]
        provider.setdefault(f"{conf['thread_id']}:{conf['checkpoint_ns']}", len(provider))
        return {"answer": interrupt({"question": "go?"})}

    builder = StateGraph(Asked)
    builder.add_node("ask", ask)
    builder.add_edge(START, "ask")
    builder.add_edge("ask", END)
    registry = Registry()
    made: list[Kernel] = []
    register_graph(registry, "guarded", builder.compile(), kernel=lambda: made[0])
    made.append(Kernel(InMemoryStorage(), registry))
    kernel = made[0]
    session, task_id = start(kernel, "guarded", {"input": {"answer": None}})
    Scheduler(kernel).run_until_idle()
    waiting = kernel.task(task_id).checkpoint["interrupted"]
    draft = Draft(actor="user:olga")
    draft.signal(task_id, resume_signal(waiting["checkpoint_id"]), {"value": "yes"},
                 step_epoch=kernel.task(task_id).epoch)
    kernel.open(session).commit(draft)
    Scheduler(kernel).run_until_idle()
    task = kernel.task(task_id)
    assert task.outcome is not None and task.outcome["result"]["output"] == {"answer": "yes"}
    assert unguarded == ["sent", "sent"]  # before interrupt(): again on resume
    assert len(provider) == 1  # keyed by the node's task namespace: once


def test_a_run_is_blocked_where_a_node_it_was_started_with_is_gone(
    kernel: Kernel, recorded: Path
) -> None:
    """A thread's checkpoints name the nodes that run next: resumed on a graph without one
    of them, the run waits for an operator (migrate or fork), its state kept; a graph
    with a node more is compatible."""
    from kernel import Worker
    from kernel.environment import BLOCKED_DOCUMENT
    from kernel.hosts.langgraph.host import register_graph
    from tests.langgraph_graphs import pipeline_graph

    session, task_id = start(kernel, PIPELINE, {"input": {"messages": [("user", "go")]}})

    def deployed(steps: int) -> Kernel:
        registry = Registry()
        made: list[Kernel] = []
        register_graph(registry, PIPELINE, pipeline_graph(steps), kernel=lambda: made[0])
        made.append(Kernel(kernel.storage, registry))
        return made[0]

    fewer = deployed(3)
    assert not Worker(fewer, "w2").advance(task_id)
    report = fewer.document(session, BLOCKED_DOCUMENT, task_id)
    assert report["differences"] == ["node step3: missing here (it was started with present)"]
    task = kernel.task(task_id)
    assert task.status is Status.PENDING and "langgraph" not in task.checkpoint  # no step
    assert runs(recorded) == []  # no node ran

    more = deployed(5)
    Scheduler(more).run_until_idle()
    task = kernel.task(task_id)
    assert task.outcome is not None and task.outcome["kind"] == "succeeded", task.outcome
    assert runs(recorded) == ["model"] * 5


def test_a_graph_run_is_not_started_again_from_a_phase_and_says_to_fork(
    kernel: Kernel, recorded: Path
) -> None:
    """From its first phase again, a graph run would start the graph anew on top of the
    thread's state (the model asked again for every node); a fork is how it goes back."""
    from kernel import IllegalTransition
    from kernel.forks import phase_entries

    session, task_id = start(kernel, PIPELINE, {"input": {"messages": [("user", "go")]}})
    Scheduler(kernel).run_until_idle()
    task = kernel.task(task_id)
    (entered, *_) = phase_entries(task_id, kernel.storage.commits_after(session, 0, 1000))
    draft = Draft(actor="user:olga")
    draft.restart(task_id, entered, expected_seq=task.updated_seq)
    with pytest.raises(IllegalTransition, match="fork a run from its checkpoint"):
        kernel.open(session).commit(draft)
    Scheduler(kernel).run_until_idle()
    assert kernel.task(task_id) == task
    assert runs(recorded) == ["model"] * 4


def test_a_registered_graph_is_named_by_its_host_and_a_later_version_without_it_is_not(
    kernel: Kernel,
) -> None:
    graphs = kernel.registry.hosted_by(HOST)
    assert graphs == sorted(graphs) and {APPROVAL, PIPELINE} <= set(graphs)
    assert all(kernel.registry.latest(k).host is None
               for k in kernel.registry.kinds() - set(graphs))
    kernel.registry.add(TaskDefinition(PIPELINE, 99, {"run": lambda run: None}, "run"))
    assert PIPELINE not in kernel.registry.hosted_by(HOST)  # what the newest one runs
