"""Hosted LangGraph graphs on the in-memory storage, run by the in-process scheduler:
checkpoints committed with the task's progress, interrupts as durable waits, forks."""

from __future__ import annotations

import operator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest

from kernel import Draft, InMemoryStorage, Kernel, Registry, Scheduler, Status
from kernel.hosts.langgraph import SessionStoreSaver
from kernel.hosts.langgraph.host import fork_input, register_graph
from kernel.hosts.langgraph.interrupts import (
    check_resume,
    interrupted,
    resume_schema,
    resume_signal,
)
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
    assert task.wait == {"signal": resume_signal(waiting["checkpoint_id"],
                                                 [waiting["interrupts"][0]["id"]])}
    assert waiting["signal"] == task.wait["signal"]

    draft = Draft(actor="user:olga")
    draft.signal(task_id, waiting["signal"], {"value": {"approved": True}},
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
    draft.signal(task_id, waiting["signal"], {"value": "yes"},
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


class Noted(TypedDict, total=False):
    answers: Annotated[list[Any], operator.add]
    note: str


def noting(state: Any, note: Any = None) -> Any:
    """``draft`` notes something in the state; ``ask`` interrupts, then answers with the
    operator's value and the note it reads. ``state``: the graph's state schema; ``note``:
    how the channel ``note`` is declared in it, where not plainly."""
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import interrupt

    builder = StateGraph(state)
    builder.add_node("draft", lambda s: {"note": "kept", "answers": ["drafted"]})
    builder.add_node("ask", lambda s: {"answers": [interrupt("ok?"), s.get("note", "none")]})
    builder.add_edge(START, "draft")
    builder.add_edge("draft", "ask")
    builder.add_edge("ask", END)
    return builder


def test_a_run_is_blocked_where_a_state_channel_it_was_started_with_is_gone_or_reduced_otherwise(
) -> None:
    """A thread's checkpoints hold the state by channel: resumed on a graph without one of
    them, LangGraph drops its value (a node reading it finds nothing), and on one whose
    channel reduces writes otherwise, the saved writes are applied otherwise. The run
    waits for an operator instead; a channel added is compatible."""
    from kernel import Worker
    from kernel.environment import BLOCKED_DOCUMENT

    class Fewer(TypedDict, total=False):
        answers: Annotated[list[Any], operator.add]

    class Reduced(TypedDict, total=False):
        answers: Annotated[list[Any], operator.add]
        note: Annotated[str, operator.add]

    class More(TypedDict, total=False):
        answers: Annotated[list[Any], operator.add]
        note: str
        seen: bool

    kernel = hosted(noting(Noted))
    session, task_id = start(kernel, "asking", {"input": {"answers": []}})
    Scheduler(kernel).run_until_idle()
    task = kernel.task(task_id)
    draft = Draft(actor="user:olga")
    draft.signal(task_id, task.checkpoint["interrupted"]["signal"], {"value": "yes"},
                 step_epoch=task.epoch)
    kernel.open(session).commit(draft)

    def deployed(state: Any) -> Kernel:
        registry = Registry()
        made: list[Kernel] = []
        register_graph(registry, "asking", noting(state).compile(), kernel=lambda: made[0])
        made.append(Kernel(kernel.storage, registry))
        return made[0]

    for state in (Fewer, Reduced):
        changed = deployed(state)
        assert not Worker(changed, "w2").advance(task_id)
        (difference,) = changed.document(session, BLOCKED_DOCUMENT, task_id)["differences"]
        assert difference.startswith("channel note: ")
        assert kernel.task(task_id).outcome is None

    Scheduler(deployed(More)).run_until_idle()
    task = kernel.task(task_id)
    assert task.outcome is not None, task.status
    assert task.outcome["result"]["output"]["answers"] == ["drafted", "yes", "kept"]


def with_subgraph(steps: list[str]) -> Any:
    """A graph whose node ``review`` is a subgraph running ``steps`` one after another;
    its step ``ask`` interrupts."""
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import interrupt

    def step(name: str) -> Any:
        return lambda s: {"answers": [[name, interrupt(name) if name == "ask" else None]]}

    inner = StateGraph(Answers)
    before = START
    for name in steps:
        inner.add_node(name, step(name))
        inner.add_edge(before, name)
        before = name
    inner.add_edge(before, END)
    builder = StateGraph(Answers)
    builder.add_node("review", inner.compile())
    builder.add_edge(START, "review")
    builder.add_edge("review", END)
    return builder


def test_a_run_is_blocked_where_a_node_of_a_subgraph_it_was_started_with_is_gone() -> None:
    """A subgraph's checkpoints name its nodes that run next, as the graph's own do:
    resumed on a graph whose subgraph lacks one, the run waits for an operator instead of
    ending as if the subgraph had finished (the node, and what follows it, never run)."""
    from kernel import Worker
    from kernel.environment import BLOCKED_DOCUMENT

    kernel = hosted(with_subgraph(["ask", "send"]))
    session, task_id = start(kernel, "asking", {"input": {"answers": []}})
    Scheduler(kernel).run_until_idle()
    task = kernel.task(task_id)
    assert interrupted(task) is not None, task.outcome
    draft = Draft(actor="user:olga")
    draft.signal(task_id, task.checkpoint["interrupted"]["signal"], {"value": "yes"},
                 step_epoch=task.epoch)
    kernel.open(session).commit(draft)

    registry = Registry()
    made: list[Kernel] = []
    register_graph(registry, "asking", with_subgraph(["ask", "notify"]).compile(),
                   kernel=lambda: made[0])
    made.append(Kernel(kernel.storage, registry))
    assert not Worker(made[0], "w2").advance(task_id)
    report = made[0].document(session, BLOCKED_DOCUMENT, task_id)
    assert report["differences"] == [
        "node review|send: missing here (it was started with present)"]
    assert kernel.task(task_id).outcome is None

    Scheduler(kernel).run_until_idle()  # where the subgraph has it, the run goes on
    task = kernel.task(task_id)
    assert task.outcome is not None, task.status
    assert task.outcome["result"]["output"] == {
        "answers": [["ask", "yes"], ["send", None]]}


class Scored(TypedDict):
    score: float


def test_a_run_whose_output_no_storage_holds_succeeds_and_says_why_it_is_not_shown() -> None:
    """A graph's state may hold what no storage can hold as JSON (a NaN score, text with
    NUL): its checkpoints keep it (serialized by the saver's serde), and the run that
    finished succeeds, its result saying why its output is not shown and where the state
    is, instead of faulting at its last commit (and again at each retry)."""
    import math

    from langgraph.graph import END, START, StateGraph

    builder = StateGraph(Scored)
    builder.add_node("score", lambda s: {"score": float("nan")})
    builder.add_edge(START, "score")
    builder.add_edge("score", END)
    scoring = hosted(builder)
    session, task_id = start(scoring, "asking", {"input": {"score": 0.0}})
    Scheduler(scoring).run_until_idle()
    task = scoring.task(task_id)
    assert task.outcome is not None and task.outcome["kind"] == "succeeded", task.outcome
    result = task.outcome["result"]
    assert result["output"] is None
    assert "['score']" in result["output_not_shown"] and "nan" in result["output_not_shown"]
    saver = SessionStoreSaver(scoring)
    state = saver.get_tuple({"configurable": {"thread_id": session,
                                              "checkpoint_id": result["checkpoint_id"]}})
    assert state is not None and math.isnan(state.checkpoint["channel_values"]["score"])
    saver.close()


def test_an_interrupt_whose_value_no_storage_holds_waits_showing_it_as_text() -> None:
    """An interrupt's value is what the operator is shown: one that JSON cannot hold (a
    NaN) is shown as its text, saying why, and the run waits for its resume instead of
    faulting at the commit of its wait (and again at each retry)."""
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import interrupt

    builder = StateGraph(Asked)
    builder.add_node("ask", lambda s: {"answer": interrupt({"score": float("nan")})})
    builder.add_edge(START, "ask")
    builder.add_edge("ask", END)
    kernel = hosted(builder)
    session, task_id = start(kernel, "asking", {"input": {"answer": None}})
    Scheduler(kernel).run_until_idle()
    task = kernel.task(task_id)
    waiting = interrupted(task)
    assert task.status is Status.WAITING and waiting is not None, task.outcome
    (shown,) = waiting["interrupts"]
    assert shown["value"]["text"] == "{'score': nan}"
    assert "nan is not a JSON number" in shown["value"]["not_shown"]
    answer(kernel, session, task_id, "fine")
    task = kernel.task(task_id)
    assert task.outcome is not None and task.outcome["result"]["output"] == {"answer": "fine"}


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


class Answers(TypedDict):
    answers: Annotated[list[Any], operator.add]


def hosted(builder: Any) -> Kernel:
    """A kernel on the in-memory storage hosting ``builder``'s graph as kind ``asking``."""
    from kernel.hosts.langgraph.host import register_graph

    registry = Registry()
    made: list[Kernel] = []
    register_graph(registry, "asking", builder.compile(), kernel=lambda: made[0])
    made.append(Kernel(InMemoryStorage(), registry))
    return made[0]


def answer(kernel: Kernel, session: str, task_id: str, value: Any) -> None:
    """An operator's resume of the interrupts ``task_id`` waits on, as the API commits it."""
    task = kernel.task(task_id)
    waiting = interrupted(task)
    assert waiting is not None, (task.status, task.outcome)
    check_resume(task, waiting["checkpoint_id"], value)
    draft = Draft(actor="user:olga")
    draft.signal(task_id, waiting["signal"], {"value": value}, step_epoch=task.epoch)
    kernel.open(session).commit(draft)
    Scheduler(kernel).run_until_idle(max_phases=20)


def twice_asking() -> Any:
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import interrupt

    def ask(state: Answers) -> dict[str, Any]:
        first = interrupt("first?")
        return {"answers": [first, interrupt("second?")]}

    builder = StateGraph(Answers)
    builder.add_node("ask", ask)
    builder.add_edge(START, "ask")
    builder.add_edge("ask", END)
    return builder


def test_a_second_interrupt_in_a_node_waits_for_its_own_answer() -> None:
    """After its resume a node that calls ``interrupt()`` again interrupts at the same
    checkpoint (no super-step ended): the run waits for an answer to the second
    question, and the node gets each answer, as under LangGraph's own saver."""
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.types import Command

    truth = twice_asking().compile(checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": "t"}}
    truth.invoke({"answers": []}, config)
    truth.invoke(Command(resume="yes"), config)
    assert truth.invoke(Command(resume="no"), config) == {"answers": ["yes", "no"]}

    kernel = hosted(twice_asking())
    session, task_id = start(kernel, "asking", {"input": {"answers": []}})
    Scheduler(kernel).run_until_idle()
    first = interrupted(kernel.task(task_id))
    assert first is not None
    answer(kernel, session, task_id, "yes")
    task = kernel.task(task_id)
    waiting = interrupted(task)
    assert task.status is Status.WAITING and waiting is not None, task.outcome
    assert [i["value"] for i in waiting["interrupts"]] == ["second?"]
    assert waiting["checkpoint_id"] == first["checkpoint_id"]
    # An answer sent for the first question (an operator who saw it late) is refused.
    with pytest.raises(LookupError, match="not " + first["interrupts"][0]["id"]):
        check_resume(task, first["checkpoint_id"], "late",
                     [i["id"] for i in first["interrupts"]])
    answer(kernel, session, task_id, "no")
    task = kernel.task(task_id)
    assert task.outcome is not None and task.outcome["kind"] == "succeeded", task.outcome
    assert task.outcome["result"]["output"] == {"answers": ["yes", "no"]}


def parallel_asking() -> Any:
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import interrupt

    builder = StateGraph(Answers)
    for name in ("left", "right"):
        builder.add_node(name, lambda s, name=name: {"answers": [[name, interrupt(name)]]})
        builder.add_edge(START, name)
        builder.add_edge(name, END)
    return builder


def test_parallel_interrupts_take_a_value_each_by_id_together_or_one_at_a_time() -> None:
    """Two nodes of one step interrupt at once: a single value for both is refused
    (LangGraph cannot tell whose it is), a value per interrupt id answers each, and one
    answered first leaves the run waiting for the other, as under LangGraph's saver."""
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.types import Command

    truth = parallel_asking().compile(checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": "t"}}
    truth.invoke({"answers": []}, config)
    left, right = truth.get_state(config).interrupts
    truth.invoke(Command(resume={left.id: "L"}), config)
    (still,) = truth.get_state(config).interrupts
    assert still.value == "right"
    expected = {"answers": [["left", "L"], ["right", "R"]]}
    assert truth.invoke(Command(resume={still.id: "R"}), config) == expected

    kernel = hosted(parallel_asking())
    session, task_id = start(kernel, "asking", {"input": {"answers": []}})
    Scheduler(kernel).run_until_idle()
    task = kernel.task(task_id)
    waiting = interrupted(task)
    assert waiting is not None
    with pytest.raises(ValueError, match="2 interrupts wait"):
        check_resume(task, waiting["checkpoint_id"], "L")
    ids = {i["value"]: i["id"] for i in waiting["interrupts"]}
    answer(kernel, session, task_id, {ids["left"]: "L"})
    task = kernel.task(task_id)
    waiting = interrupted(task)
    assert waiting is not None, task.outcome
    assert [i["value"] for i in waiting["interrupts"]] == ["right"]
    answer(kernel, session, task_id, {waiting["interrupts"][0]["id"]: "R"})
    task = kernel.task(task_id)
    assert task.outcome is not None and task.outcome["kind"] == "succeeded", task.outcome
    assert task.outcome["result"]["output"] == expected

    session, task_id = start(kernel, "asking", {"input": {"answers": []}})
    Scheduler(kernel).run_until_idle()
    waiting = interrupted(kernel.task(task_id))
    assert waiting is not None
    answer(kernel, session, task_id, {i["id"]: i["value"].upper() for i in waiting["interrupts"]})
    task = kernel.task(task_id)
    assert task.outcome is not None and task.outcome["kind"] == "succeeded", task.outcome
    assert task.outcome["result"]["output"] == {"answers": [["left", "LEFT"], ["right", "RIGHT"]]}


def test_the_resume_schema_of_parallel_interrupts_is_that_of_the_whole_value() -> None:
    """With several interrupts waiting the resume value is an object by interrupt id: the
    schema shown to the operator is that object's, and it accepts what the resume does."""
    import jsonschema_rs
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import interrupt

    builder = StateGraph(Answers)
    builder.add_node("left", lambda s: {"answers": [interrupt(
        {"question": "left?", "schema": {"type": "string"}})]})
    builder.add_node("right", lambda s: {"answers": [interrupt("right?")]})
    for name in ("left", "right"):
        builder.add_edge(START, name)
        builder.add_edge(name, END)
    kernel = hosted(builder)
    _, task_id = start(kernel, "asking", {"input": {"answers": []}})
    Scheduler(kernel).run_until_idle()
    task = kernel.task(task_id)
    waiting = interrupted(task)
    assert waiting is not None
    ids = {"left" if isinstance(i["value"], dict) else "right": i["id"]
           for i in waiting["interrupts"]}
    validator = jsonschema_rs.validator_for(resume_schema(waiting))
    left, right = ids["left"], ids["right"]
    for value in [{left: "L"}, {right: 3}, {left: "L", right: 3}, {left: 5}, {left: "L", "x": 1},
                  {}, "L", None]:
        try:
            check_resume(task, waiting["checkpoint_id"], value)
            resumes = True
        except ValueError:
            resumes = False
        assert validator.is_valid(value) == resumes, value


def test_the_response_schema_langgraph_takes_is_shown_and_a_value_it_refuses_is_422() -> None:
    """``interrupt(value, response_schema=Model)`` declares the resume value, as LangGraph
    documents it, and LangGraph validates the resume against it in the node: the operator
    is shown that schema, and a value it refuses is refused before it is committed,
    naming the field (committed, it would fail the run in the node)."""
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import interrupt
    from pydantic import BaseModel

    class Decision(BaseModel):
        approved: bool

    builder = StateGraph(Answers)
    builder.add_node("ask", lambda s: {"answers": [
        interrupt("publish?", response_schema=Decision).approved]})
    builder.add_edge(START, "ask")
    builder.add_edge("ask", END)
    kernel = hosted(builder)
    session, task_id = start(kernel, "asking", {"input": {"answers": []}})
    Scheduler(kernel).run_until_idle()
    task = kernel.task(task_id)
    waiting = interrupted(task)
    assert waiting is not None
    assert resume_schema(waiting) == Decision.model_json_schema()
    with pytest.raises(ValueError, match=r"value\['approved'\]"):
        check_resume(task, waiting["checkpoint_id"], {"approved": "maybe"})
    with pytest.raises(ValueError, match="approved"):
        check_resume(task, waiting["checkpoint_id"], {})
    answer(kernel, session, task_id, {"approved": True})
    task = kernel.task(task_id)
    assert task.outcome is not None and task.outcome["kind"] == "succeeded", task.outcome
    assert task.outcome["result"]["output"] == {"answers": [True]}


def test_a_resume_the_nodes_validation_refuses_leaves_the_run_waiting_for_another() -> None:
    """LangGraph validates a resume against the interrupt's ``response_schema`` in the
    node, beyond what its JSON schema says (a validator of the model's own): a value it
    refuses saves nothing, and the interrupt can be answered again, as under LangGraph's
    own saver. The run waits for another answer, saying why, instead of failing (its
    retry would meet the same answer again)."""
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import interrupt
    from pydantic import BaseModel, field_validator

    class Pay(BaseModel):
        amount: int

        @field_validator("amount")
        @classmethod
        def at_most_100(cls, amount: int) -> int:
            if amount > 100:
                raise ValueError("at most 100")
            return amount

    builder = StateGraph(Answers)
    builder.add_node("ask", lambda s: {"answers": [
        interrupt("how much?", response_schema=Pay).amount]})
    builder.add_edge(START, "ask")
    builder.add_edge("ask", END)
    kernel = hosted(builder)
    session, task_id = start(kernel, "asking", {"input": {"answers": []}})
    Scheduler(kernel).run_until_idle()
    first = interrupted(kernel.task(task_id))
    assert first is not None
    answer(kernel, session, task_id, {"amount": 500})  # its JSON schema takes it
    task = kernel.task(task_id)
    waiting = interrupted(task)
    assert task.status is Status.WAITING and waiting is not None, task.outcome
    assert waiting["checkpoint_id"] == first["checkpoint_id"]
    assert waiting["interrupts"] == first["interrupts"]
    assert waiting["signal"] != first["signal"]
    assert "at most 100" in waiting["refused"]
    answer(kernel, session, task_id, {"amount": 50})
    task = kernel.task(task_id)
    assert task.outcome is not None and task.outcome["kind"] == "succeeded", task.outcome
    assert task.outcome["result"]["output"] == {"answers": [50]}


@pytest.mark.parametrize("value", [None, {}, 0, "", False, []])
def test_any_resume_value_reaches_the_node_even_one_langgraph_reads_as_none(value: Any) -> None:
    """LangGraph takes a bare ``Command(resume=None)`` for no resume (an error) and a
    bare ``{}`` for a map answering no interrupt (the node interrupts again): the host
    resumes by the interrupt's id, so the node gets whatever the operator sent."""
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import interrupt

    builder = StateGraph(Answers)
    builder.add_node("ask", lambda s: {"answers": [interrupt("what?")]})
    builder.add_edge(START, "ask")
    builder.add_edge("ask", END)
    kernel = hosted(builder)
    session, task_id = start(kernel, "asking", {"input": {"answers": []}})
    Scheduler(kernel).run_until_idle()
    answer(kernel, session, task_id, value)
    task = kernel.task(task_id)
    assert task.outcome is not None and task.outcome["kind"] == "succeeded", task.outcome
    assert task.outcome["result"]["output"] == {"answers": [value]}


def test_a_fork_with_values_after_a_step_of_several_nodes_names_the_node_they_are_written_as(
) -> None:
    """Where the checkpoint's step ran two nodes LangGraph cannot tell whose update the
    values are: without ``as_node`` the fork's run fails saying so, with it the run goes
    on as under LangGraph's own saver."""
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import END, START, StateGraph

    def graph() -> Any:
        builder = StateGraph(Answers)
        builder.add_node("left", lambda s: {"answers": ["left"]})
        builder.add_node("right", lambda s: {"answers": ["right"]})
        builder.add_node("join", lambda s: {"answers": ["join"]})
        builder.add_edge(START, "left")
        builder.add_edge(START, "right")
        builder.add_edge(["left", "right"], "join")
        builder.add_edge("join", END)
        return builder

    truth = graph().compile(checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": "t"}}
    truth.invoke({"answers": []}, config)
    (after_both,) = [s for s in truth.get_state_history(config) if s.next == ("join",)]
    with pytest.raises(Exception, match="specify as_node"):
        truth.update_state(after_both.config, {"answers": ["fixed"]})
    expected = truth.invoke(None, truth.update_state(after_both.config, {"answers": ["fixed"]},
                                                     as_node="left"))

    kernel = hosted(graph())
    session, first = start(kernel, "asking", {"input": {"answers": []}})
    Scheduler(kernel).run_until_idle()
    saver = SessionStoreSaver(kernel)
    (at,) = [c.config["configurable"]["checkpoint_id"]
             for c in saver.list({"configurable": {"thread_id": session}})
             if c.metadata.get("step") == 1]
    _, ambiguous = start(kernel, "asking", fork_input(at, {"answers": ["fixed"]}), session)
    Scheduler(kernel).run_until_idle()
    outcome = kernel.task(ambiguous).outcome
    assert outcome is not None and "specify as_node" in outcome["error"], outcome
    _, named = start(kernel, "asking", fork_input(at, {"answers": ["fixed"]}, as_node="left"),
                     session)
    Scheduler(kernel).run_until_idle()
    outcome = kernel.task(named).outcome
    assert outcome is not None and outcome["kind"] == "succeeded", outcome
    assert outcome["result"]["output"] == expected == {
        "answers": ["left", "right", "fixed", "join"]}
    saver.close()


@pytest.mark.parametrize("breakpoint", [{"interrupt_before": ["then"]},
                                        {"interrupt_after": "*"}])
def test_a_graph_compiled_with_breakpoints_is_refused_since_a_run_would_succeed_halfway(
    breakpoint: dict[str, Any],
) -> None:
    """At a static breakpoint LangGraph's ``invoke`` returns with the graph not finished
    and no interrupt pending: hosted, the run would succeed with a half-done output."""
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import END, START, StateGraph

    from kernel.hosts.langgraph.host import register_graph

    builder = StateGraph(Answers)
    builder.add_node("first", lambda s: {"answers": ["first"]})
    builder.add_node("then", lambda s: {"answers": ["then"]})
    builder.add_edge(START, "first")
    builder.add_edge("first", "then")
    builder.add_edge("then", END)
    truth = builder.compile(checkpointer=InMemorySaver(), **breakpoint)
    config: Any = {"configurable": {"thread_id": "t"}}
    truth.invoke({"answers": []}, config)
    state = truth.get_state(config)
    assert state.next and not state.interrupts  # stopped, with nothing to answer

    with pytest.raises(ValueError, match="breakpoints .* call interrupt"):
        register_graph(Registry(), "paused", builder.compile(**breakpoint),
                       kernel=lambda: Kernel(InMemoryStorage(), Registry()))
