"""A LangGraph thread through the API, on Postgres: ``GET /api/sessions/{id}/graph``
shows what the session page shows (the checkpoints on their branches, the interrupts,
the runs, and the thread's version); ``POST /api/sessions/{id}/graph/runs`` starts a run
of a registered graph on the thread and ``POST /api/sessions/{id}/graph/fork`` forks one
from a checkpoint as the page's form does, each naming the version it saw: refused (409)
when the thread changed since, when the checkpoint is gone or while a run is open, and
422 naming the field for a bad body; a refusal changes nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from controlplane.worker.runtime import runtime
from kernel import Worker
from kernel.hosts.langgraph.host import fork_input, run_input
from tests.langgraph_graphs import APPROVAL, PIPELINE, PIPELINE_V2, runs

from .api_kinds import start
from .clients import client_for, post

pytestmark = pytest.mark.django_db(transaction=True)


def fork(client: Any, session_id: str, **fields: Any) -> Any:
    body = {"action_id": "f1", "reason": "try step1 again", **fields}
    return post(client, f"/api/sessions/{session_id}/graph/fork", body)


def test_the_thread_is_read_through_the_api(graphs: Path) -> None:
    kernel = runtime().kernel
    session_id, task_id = start(kernel, PIPELINE, {"input": {"messages": [("user", "go")]}})
    vic = client_for("vic", "viewer")
    found = vic.get(f"/api/sessions/{session_id}/graph")
    assert found.status_code == 200, found.content
    thread = found.json()
    assert thread["session_id"] == session_id and thread["kind"] == PIPELINE
    assert {PIPELINE, PIPELINE_V2, APPROVAL} <= set(thread["graphs"])
    assert thread["total"] == len(thread["checkpoints"]) == 6 and thread["branches"] == 1
    assert [c["step"] for c in thread["checkpoints"]] == [-1, 0, 1, 2, 3, 4]
    assert [c["latest"] for c in thread["checkpoints"]] == [False] * 5 + [True]
    first, second = thread["checkpoints"][:2]
    assert first["source"] == "input" and second["parent"] == first["id"]
    assert thread["runs"] == [{"task_id": task_id, "kind": PIPELINE, "status": "succeeded",
                               "fork_of": None}]
    assert thread["interrupts"] == [] and thread["namespaces"] == 0
    index_version = kernel.versioned_document(session_id, "langgraph.index", "")[1]
    assert thread["version"] == index_version

    bare = kernel.create_session().id
    missing = vic.get(f"/api/sessions/{bare}/graph")
    assert missing.status_code == 404 and "holds no graph thread" in missing.json()["detail"]
    assert vic.get("/api/sessions/no-such/graph").status_code == 404


def test_an_interrupt_shows_its_value_and_schema(graphs: Path) -> None:
    kernel = runtime().kernel
    session_id, task_id = start(kernel, APPROVAL, {"input": {"text": "notice"}})
    thread = client_for("vic", "viewer").get(f"/api/sessions/{session_id}/graph").json()
    [waiting] = thread["interrupts"]
    assert waiting["task_id"] == task_id and waiting["kind"] == APPROVAL
    assert waiting["checkpoint_id"] == (
        kernel.task(task_id).checkpoint["interrupted"]["checkpoint_id"])
    assert waiting["values"][0]["text"] == "draft of notice"
    assert waiting["resume_schema"]["required"] == ["approved"]
    assert thread["runs"][0]["status"] == "waiting"


def test_an_operator_forks_through_the_api_naming_the_version_seen(graphs: Path) -> None:
    kernel = runtime().kernel
    session_id, first = start(kernel, PIPELINE, {"input": {"messages": [("user", "go")]}})
    olga = client_for("olga", "operator")
    thread = olga.get(f"/api/sessions/{session_id}/graph").json()
    third, version = thread["checkpoints"][2]["id"], thread["version"]
    head = kernel.storage.session(session_id).head_seq

    assert fork(client_for("vic", "viewer"), session_id, checkpoint_id=third,
                expected_version=version).status_code == 403
    for fields, named in (
        ({"checkpoint_id": third}, "expected_version"),
        ({"checkpoint_id": third, "expected_version": -1}, "expected_version"),
        ({"checkpoint_id": third, "expected_version": "3"}, "expected_version"),
        ({"checkpoint_id": third, "expected_version": version, "values": [1]}, "values"),
        ({"checkpoint_id": "c\u0000", "expected_version": version}, "checkpoint_id"),
        ({"checkpoint_id": third, "expected_version": version, "branch": 2}, "branch"),
        ({"checkpoint_id": third, "expected_version": version, "kind": "nope"}, "kind"),
        ({"checkpoint_id": third, "expected_version": version, "kind": ""}, "kind"),
    ):
        bad = fork(olga, session_id, **fields)
        assert bad.status_code == 422 and named in str(bad.json()["detail"]), (fields, bad.json())
    stale = fork(olga, session_id, checkpoint_id=third, expected_version=version - 1)
    assert stale.status_code == 409 and "changed since you saw it" in stale.json()["detail"]
    gone = fork(olga, session_id, checkpoint_id="1f0-gone", expected_version=version)
    assert gone.status_code == 409 and "not in the thread" in gone.json()["detail"]
    assert kernel.storage.session(session_id).head_seq == head  # refusals changed nothing

    done = fork(olga, session_id, checkpoint_id=third, expected_version=version)
    assert done.status_code == 200, done.json()
    assert done.json()["action"] == "fork" and done.json()["target"] == third
    again = fork(olga, session_id, checkpoint_id=third, expected_version=version)
    assert again.json()["replayed"] is True and again.json()["seq"] == done.json()["seq"]
    [run] = [t for t in kernel.storage.session_tasks(session_id) if t.id != first]
    assert run.input == fork_input(third)
    assert done.json()["task_id"] == again.json()["task_id"] == run.id
    commit = next(c for c in kernel.commits_after(session_id, 0) if c.seq == done.json()["seq"])
    assert commit.actor == "user:olga"
    opened = olga.get(f"/api/sessions/{session_id}/graph").json()
    assert opened["version"] > version  # the fork names its run in the thread's index
    busy = fork(olga, session_id, action_id="f2", checkpoint_id=third,
                expected_version=opened["version"])
    assert busy.status_code == 409 and "has not ended" in busy.json()["detail"]

    assert Worker(kernel, "w", 30).advance(run.id)
    assert runs(graphs) == ["model"] * 7  # step1..step3 again, step0 not
    after = olga.get(f"/api/sessions/{session_id}/graph").json()
    assert after["branches"] == 2 and after["total"] == 10
    assert {r["task_id"]: r["fork_of"] for r in after["runs"]} == {first: None, run.id: third}
    [started] = [c for c in after["checkpoints"] if c["fork_of"] == third]
    assert started["branch"] == 1


def test_a_fork_through_the_api_updates_the_state_first(graphs: Path) -> None:
    kernel = runtime().kernel
    session_id, first = start(kernel, PIPELINE, {"input": {"messages": [("user", "go")]}})
    olga = client_for("olga", "operator")
    thread = olga.get(f"/api/sessions/{session_id}/graph").json()
    third = thread["checkpoints"][2]["id"]
    values = {"messages": [{"type": "human", "content": "try it this way"}]}
    alone = fork(olga, session_id, checkpoint_id=third, expected_version=thread["version"],
                 as_node="step0")
    assert alone.status_code == 422 and "as_node" in alone.json()["detail"], alone.json()
    unknown = fork(olga, session_id, checkpoint_id=third, expected_version=thread["version"],
                   values=values, as_node="step9")
    assert unknown.status_code == 422, unknown.json()
    assert unknown.json()["detail"].startswith("as_node: graph") and "'step9'" in \
        unknown.json()["detail"] and "step0, step1" in unknown.json()["detail"]
    assert [t.id for t in kernel.storage.session_tasks(session_id)] == [first]
    done = fork(olga, session_id, checkpoint_id=third, expected_version=thread["version"],
                values=values, as_node="step0")  # the node that wrote last, named
    assert done.status_code == 200, done.json()
    [run] = [t for t in kernel.storage.session_tasks(session_id) if t.id != first]
    assert run.input == fork_input(third, values, as_node="step0")
    assert Worker(kernel, "w", 30).advance(run.id)
    state = kernel.task(run.id).outcome["result"]["output"]
    contents = [m["kwargs"]["content"] for m in state["messages"]]
    assert "try it this way" in contents


def start_run(client: Any, session_id: str, **fields: Any) -> Any:
    body = {"action_id": "s1", "reason": "a new question", **fields}
    return post(client, f"/api/sessions/{session_id}/graph/runs", body)


def test_an_operator_starts_graph_runs_on_a_thread_through_the_api(graphs: Path) -> None:
    kernel = runtime().kernel
    session_id = kernel.create_session().id
    olga = client_for("olga", "operator")
    question = {"messages": [{"type": "human", "content": "go"}]}
    assert start_run(client_for("vic", "viewer"), session_id, kind=PIPELINE, input=question,
                     expected_version=0).status_code == 403
    other = next(k for k in sorted(kernel.registry.kinds())
                 if k not in kernel.registry.hosted_by("langgraph"))
    for fields, named in (
        ({"kind": "no-such-graph", "input": question, "expected_version": 0}, "kind"),
        ({"kind": other, "input": question, "expected_version": 0}, "kind"),
        ({"kind": PIPELINE, "expected_version": 0}, "input"),
        ({"kind": PIPELINE, "input": {"text": "a\u0000"}, "expected_version": 0}, "input"),
        ({"kind": PIPELINE, "input": question, "expected_version": 0, "queue": "x"}, "queue"),
        ({"kind": PIPELINE, "input": question}, "expected_version"),
    ):
        bad = start_run(olga, session_id, **fields)
        assert bad.status_code == 422 and named in str(bad.json()["detail"]), (fields, bad.json())
    stale = start_run(olga, session_id, kind=PIPELINE, input=question, expected_version=3)
    assert stale.status_code == 409 and "changed since you saw it" in stale.json()["detail"]
    assert kernel.storage.session_tasks(session_id) == []  # refusals changed nothing

    done = start_run(olga, session_id, kind=PIPELINE, input=question, expected_version=0)
    assert done.status_code == 200, done.json()
    run_id = done.json()["task_id"]
    again = start_run(olga, session_id, kind=PIPELINE, input=question, expected_version=0)
    assert again.json()["replayed"] is True and again.json()["task_id"] == run_id
    assert kernel.task(run_id).input == run_input(question)
    commit = next(c for c in kernel.commits_after(session_id, 0) if c.seq == done.json()["seq"])
    assert commit.actor == "user:olga"
    thread = olga.get(f"/api/sessions/{session_id}/graph").json()  # before any checkpoint
    assert thread["total"] == 0 and [r["task_id"] for r in thread["runs"]] == [run_id]
    busy = start_run(olga, session_id, action_id="s2", kind=PIPELINE, input=question,
                     expected_version=thread["version"])
    assert busy.status_code == 409 and "has not ended" in busy.json()["detail"]

    assert Worker(kernel, "w", 30).advance(run_id)
    assert runs(graphs) == ["model"] * 4
    thread = olga.get(f"/api/sessions/{session_id}/graph").json()
    assert thread["total"] == 6 and thread["runs"][0]["status"] == "succeeded"
    follow_up = {"messages": [{"type": "human", "content": "and again"}]}
    second = start_run(olga, session_id, action_id="s3", kind=PIPELINE, input=follow_up,
                       expected_version=thread["version"])
    assert second.status_code == 200, second.json()
    assert Worker(kernel, "w", 30).advance(second.json()["task_id"])
    output = kernel.task(second.json()["task_id"]).outcome["result"]["output"]
    contents = [m["kwargs"]["content"] for m in output["messages"]]
    assert contents[0] == "go" and "and again" in contents  # the thread went on
    after = olga.get(f"/api/sessions/{session_id}/graph").json()
    assert after["branches"] == 1 and after["total"] > thread["total"]
    assert [r["task_id"] for r in after["runs"]] == [run_id, second.json()["task_id"]]


def test_a_repeated_start_is_answered_with_its_first_commit_after_the_graph_is_gone(
    graphs: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A repeat (the same action id, say a client retrying after a lost answer) is answered
    with the run the first request started, even once a redeploy has dropped the graph:
    what a new start would be refused for does not make a done one fail."""
    from controlplane.reads import graphs as graph_reads

    kernel = runtime().kernel
    session_id = kernel.create_session().id
    olga = client_for("olga", "operator")
    question = {"messages": [{"type": "human", "content": "go"}]}
    done = start_run(olga, session_id, kind=PIPELINE, input=question, expected_version=0)
    assert done.status_code == 200, done.json()
    monkeypatch.setattr(graph_reads, "registered", lambda: [])
    again = start_run(olga, session_id, kind=PIPELINE, input=question, expected_version=0)
    assert again.status_code == 200, again.json()
    assert again.json()["replayed"] is True
    assert again.json()["task_id"] == done.json()["task_id"]
    new = start_run(olga, session_id, action_id="s2", kind=PIPELINE, input=question,
                    expected_version=0)
    assert new.status_code == 422 and "kind" in str(new.json()["detail"])
    assert [t.id for t in kernel.storage.session_tasks(session_id)] == [done.json()["task_id"]]


def test_a_fork_goes_on_under_another_version_of_the_graph(graphs: Path) -> None:
    """A fork names the graph it runs: a new version of it goes on from the first one's
    checkpoint (what was answered before it stays), its nodes answering now."""
    kernel = runtime().kernel
    session_id, first = start(kernel, PIPELINE, {"input": {"messages": [("user", "go")]}})
    olga = client_for("olga", "operator")
    thread = olga.get(f"/api/sessions/{session_id}/graph").json()
    third = thread["checkpoints"][2]["id"]  # step0 answered, step1 next
    done = fork(olga, session_id, checkpoint_id=third, expected_version=thread["version"],
                kind=PIPELINE_V2)
    assert done.status_code == 200, done.json()
    run = kernel.task(done.json()["task_id"])
    assert run.kind == PIPELINE_V2 and run.input == fork_input(third)
    assert Worker(kernel, "w", 30).advance(run.id)
    output = kernel.task(run.id).outcome["result"]["output"]
    answers = [m["kwargs"]["content"] for m in output["messages"]][1:]
    assert answers == ["answer 0", "revised 1", "revised 2", "revised 3"]
    after = olga.get(f"/api/sessions/{session_id}/graph").json()
    assert after["kind"] == PIPELINE_V2  # what the next fork runs unless told
    assert [(r["kind"], r["fork_of"]) for r in after["runs"]] == [(PIPELINE, None),
                                                                  (PIPELINE_V2, third)]


def test_a_retried_graph_run_waits_for_the_threads_open_run_and_moves_its_version(
    graphs: Path,
) -> None:
    """A failed graph run retried goes on from the thread's newest checkpoint, as a
    started one does: refused while another run of the thread is open (singly or in a
    bulk retry), and once made it moves the thread's version, so a start that saw the
    thread before it is refused."""
    kernel = runtime().kernel
    session_id = kernel.create_session().id
    olga = client_for("olga", "operator")
    refused_by_langgraph = {"messages": [{"type": "no-such-role"}]}
    broken = start_run(olga, session_id, kind=PIPELINE, input=refused_by_langgraph,
                       expected_version=0).json()["task_id"]
    while kernel.task(broken).outcome is None:  # LangGraph refuses the message: it fails
        Worker(kernel, "w", 30).advance(broken)
    assert kernel.task(broken).outcome["kind"] == "failed"
    version = olga.get(f"/api/sessions/{session_id}/graph").json()["version"]
    question = {"messages": [{"type": "human", "content": "go"}]}
    other = start_run(olga, session_id, action_id="s2", kind=PIPELINE, input=question,
                      expected_version=version).json()["task_id"]

    head = kernel.storage.session(session_id).head_seq
    retry = {"action_id": "r1", "reason": "fixed",
             "expected_seq": kernel.task(broken).updated_seq}
    refused = post(olga, f"/api/tasks/{broken}/retry", retry)
    assert refused.status_code == 409 and other in refused.json()["detail"], refused.json()
    preview = post(olga, "/api/actions/bulk/preview", {"action": "retry", "session_id": session_id,
                                                        "outcome": "failed"}).json()
    bulk = post(olga, "/api/actions/bulk", {
        "action": "retry", "session_id": session_id, "outcome": "failed", "action_id": "b1",
        "reason": "fixed", "expected_count": 1, "expected_digest": preview["digest"]}).json()
    [item] = bulk["results"]
    assert not item["ok"] and "has not ended" in item["detail"], bulk
    assert kernel.storage.session(session_id).head_seq == head  # refusals changed nothing

    assert Worker(kernel, "w", 30).advance(other)
    seen = olga.get(f"/api/sessions/{session_id}/graph").json()["version"]
    done = post(olga, f"/api/tasks/{broken}/retry", retry)
    assert done.status_code == 200, done.json()
    assert olga.get(f"/api/sessions/{session_id}/graph").json()["version"] > seen
    late = start_run(olga, session_id, action_id="s3", kind=PIPELINE, input=question,
                     expected_version=seen)
    assert late.status_code == 409 and "has not ended" in late.json()["detail"]
    again = post(olga, f"/api/tasks/{broken}/retry", retry)
    assert again.json()["replayed"] is True and again.json()["seq"] == done.json()["seq"]


def test_a_faulted_graph_run_has_ended_and_holds_no_start_back(graphs: Path) -> None:
    """A run can end faulted (its commit rejected, say its output unstorable): it has
    ended as a failed one has, so the thread takes a new run, not 'has not ended' for
    good (a terminal run cannot be cancelled)."""
    from dataclasses import replace

    from kernel import Kernel, Registry

    kernel = runtime().kernel
    session_id = kernel.create_session().id
    olga = client_for("olga", "operator")
    question = {"messages": [{"type": "human", "content": "go"}]}
    run = start_run(olga, session_id, kind=PIPELINE, input=question,
                    expected_version=0).json()["task_id"]
    unstorable = Registry()  # a worker whose run ends with what cannot be stored
    unstorable.add(replace(kernel.registry.latest(PIPELINE),
                           phases={"run": lambda r: r.succeed("nul \x00")}))
    assert Worker(Kernel(kernel.storage, unstorable), "w", 30).advance(run)
    assert kernel.task(run).outcome["kind"] == "faulted", kernel.task(run).outcome
    thread = olga.get(f"/api/sessions/{session_id}/graph").json()
    assert [r["status"] for r in thread["runs"]] == ["faulted"]
    again = start_run(olga, session_id, action_id="s2", kind=PIPELINE, input=question,
                      expected_version=thread["version"])
    assert again.status_code == 200, again.json()
