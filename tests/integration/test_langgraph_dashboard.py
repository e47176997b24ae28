"""A LangGraph thread on the session page, on Postgres: its checkpoints on a timeline, an
interrupt's value with a form that resumes it (JSON, CSRF, a reason; 422 naming the field
for a value that does not meet the node's schema, 409 for a stale one), and a fork from
any checkpoint (one commit naming who and why; both branches stay readable; refused
while a run of the thread is open, or when two operators fork at once)."""

from __future__ import annotations

from html import unescape
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from controlplane import commands
from controlplane.errors import http_status
from controlplane.reads import graphs as graph_reads
from controlplane.worker.runtime import runtime
from kernel import Draft, Kernel, Status, Worker
from kernel.commit import operations_log_id
from kernel.hosts.langgraph.host import run_input
from tests.langgraph_graphs import APPROVAL, NOTE, PIPELINE, runs

from .api_kinds import start
from .clients import client_for, post, user
from .racing import both_read_first, decide_at_once

pytestmark = pytest.mark.django_db(transaction=True)


def section(page: str) -> str:
    return page.split('id="graph"')[1].split("</section>")[0]


def log(kernel: Kernel, session_id: str, kind: str) -> list[Any]:
    return [e.payload for e in kernel.entries(operations_log_id(session_id)) if e.kind == kind]


def test_the_session_page_lists_the_checkpoints_and_the_interrupt_with_its_form(
    graphs: Path,
) -> None:
    session_id, task_id = start(runtime().kernel, APPROVAL, {"input": {"text": "notice"}})
    waiting = runtime().kernel.task(task_id).checkpoint["interrupted"]
    olga = client_for("olga", "operator")
    shown = section(olga.get(f"/sessions/{session_id}/").content.decode())
    assert "(3 checkpoints)" in shown  # the input (step -1), draft next (0), approve next (1)
    assert shown.count('<li class="checkpoint') == 3
    card = shown.split(f'id="interrupt-{task_id}"')[1].split("</article>")[0]
    assert f'data-checkpoint="{waiting["checkpoint_id"]}"' in shown
    assert "draft of notice" in card and "publish?" in card  # the interrupt's value
    assert "&quot;approved&quot;" in card  # the schema the node declared
    assert 'class="resume-form"' in card and 'name="csrfmiddlewaretoken"' in card
    assert f'name="checkpoint_id" value="{waiting["checkpoint_id"]}"' in card
    assert 'name="reason" required' in card and '<textarea name="value"' in card
    assert "A new run or a fork waits until run" in shown
    assert 'class="fork-form"' not in shown and 'class="start-form"' not in shown
    viewed = section(client_for("vic", "viewer").get(f"/sessions/{session_id}/")
                     .content.decode())
    assert "draft of notice" in viewed and "resume-form" not in viewed  # no form


def test_the_interrupt_is_pushed_live_to_the_session_page(graphs: Path) -> None:
    from controlplane.ui.live import SESSION_PAGE

    kernel = runtime().kernel
    handle = kernel.create_session()
    seen = handle.head_seq
    draft = Draft(actor="user:test")
    task_id = draft.create_task(APPROVAL, {"input": {"text": "notice"}})
    handle.commit(draft)
    assert Worker(kernel, "w", 30).advance(task_id)
    found = SESSION_PAGE.update(handle.id, seen, True)
    assert found is not None and f'id="interrupt-{task_id}"' in found[1]
    assert 'id="graph"' in found[1] and 'hx-swap-oob="true"' in found[1]


def test_an_operator_resumes_the_interrupt_from_the_page(graphs: Path) -> None:
    kernel = runtime().kernel
    session_id, task_id = start(kernel, APPROVAL, {"input": {"text": "notice"}})
    checkpoint_id = kernel.task(task_id).checkpoint["interrupted"]["checkpoint_id"]
    olga = client_for("olga", "operator")
    url = f"/tasks/{task_id}/resume"
    (waiting,) = kernel.task(task_id).checkpoint["interrupted"]["interrupts"]
    interrupt_id = waiting["id"]
    form = {"action_id": "r1", "reason": "read the draft", "checkpoint_id": checkpoint_id,
            "value": '{"approved": true}', "interrupt_ids": [interrupt_id]}
    head = kernel.storage.session(session_id).head_seq
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(user("oscar", "operator"))
    assert strict.post(url, form).status_code == 403  # no CSRF token: refused
    assert client_for("vic", "viewer").post(url, form).status_code == 403
    for value, field in (('{"approved": "yes"}', "value['approved']"), ("[1", "value"),
                         ('{"approved": true, "also": 1}', "value"), ("", "value")):
        bad = olga.post(url, {**form, "value": value}, HTTP_HX_REQUEST="true")
        assert bad.status_code == 422 and field in unescape(bad.content.decode()), bad.content
    stale = olga.post(url, {**form, "checkpoint_id": "1f0-not-it"}, HTTP_HX_REQUEST="true")
    assert stale.status_code == 409, stale.content
    unnamed = olga.post(url, {**form, "interrupt_ids": []}, HTTP_HX_REQUEST="true")
    assert unnamed.status_code == 422 and "interrupt_ids" in unnamed.content.decode()
    shown = section(olga.get(f"/sessions/{session_id}/").content.decode())
    assert f'name="interrupt_ids" value="{interrupt_id}"' in shown  # the form sends it back
    answered = olga.post(url, {**form, "interrupt_ids": ["0" * 32]}, HTTP_HX_REQUEST="true")
    assert answered.status_code == 409, answered.content  # another question than it showed
    assert olga.post(url, {**form, "reason": ""}).status_code == 422
    assert kernel.storage.session(session_id).head_seq == head  # refusals changed nothing

    done = olga.post(url, form, HTTP_HX_REQUEST="true")
    assert done.status_code == 200 and "resume done" in done.content.decode()
    [entry] = log(kernel, session_id, "resume")
    assert entry["by"] == "user:olga" and entry["reason"] == "read the draft"
    assert Worker(kernel, "w", 30).advance(task_id)
    task = kernel.task(task_id)
    assert task.status is Status.TERMINAL and task.outcome is not None
    assert task.outcome["result"]["output"]["approved"] == {"approved": True}
    assert runs(graphs) == ["draft", "approve", "approve", "publish"]
    page = section(olga.get(f"/sessions/{session_id}/").content.decode())
    assert "interrupt-" not in page and "Fork from here" in page


def test_a_resume_value_postgres_cannot_store_is_422_naming_value_from_the_page(
    graphs: Path,
) -> None:
    kernel = runtime().kernel
    session_id, task_id = start(kernel, NOTE, {"input": {"text": "notice"}})
    checkpoint_id = kernel.task(task_id).checkpoint["interrupted"]["checkpoint_id"]
    olga = client_for("olga", "operator")
    url = f"/tasks/{task_id}/resume"
    (waiting,) = kernel.task(task_id).checkpoint["interrupted"]["interrupts"]
    form = {"action_id": "r1", "reason": "noted", "checkpoint_id": checkpoint_id,
            "interrupt_ids": [waiting["id"]]}
    head = kernel.storage.session(session_id).head_seq
    for value in ('"a\\u0000b"', '{"note": ["a\\u0000b"]}', '{"a\\u0000b": 1}'):
        bad = olga.post(url, {**form, "value": value}, HTTP_HX_REQUEST="true")
        assert bad.status_code == 422, bad.content
        assert "value" in unescape(bad.content.decode())
    assert kernel.storage.session(session_id).head_seq == head

    done = olga.post(url, {**form, "value": '"looks fine"'}, HTTP_HX_REQUEST="true")
    assert done.status_code == 200, done.content
    assert Worker(kernel, "w", 30).advance(task_id)
    assert kernel.task(task_id).outcome["result"]["output"]["note"] == "looks fine"


def test_a_json_field_nested_past_the_parser_is_422_naming_it_from_every_form(
    graphs: Path,
) -> None:
    """A resume's value, a start's input, a fork's values and an approval's edited
    arguments nested deeper than the JSON parser goes are refused naming the field, as a
    value that does not parse is, instead of a server error; nothing is committed."""
    kernel = runtime().kernel
    session_id, task_id = start(kernel, NOTE, {"input": {"text": "notice"}})
    checkpoint_id = kernel.task(task_id).checkpoint["interrupted"]["checkpoint_id"]
    olga = client_for("olga", "operator")
    deep = "[" * 100_000 + "]" * 100_000
    base = {"action_id": "j1", "reason": "deep", "checkpoint_id": checkpoint_id,
            "interrupt_ids": ["i1"], "kind": NOTE, "expected_version": "1",
            "decision": "approve", "digest": "d", "expected_request": "q"}
    head = kernel.storage.session(session_id).head_seq
    for url, field in ((f"/tasks/{task_id}/resume", "value"),
                       (f"/sessions/{session_id}/graph/runs", "input"),
                       (f"/sessions/{session_id}/graph/fork", "values"),
                       (f"/sessions/{session_id}/calls/c1/decide", "arguments")):
        bad = olga.post(url, {**base, field: deep}, HTTP_HX_REQUEST="true")
        assert bad.status_code == 422, (url, bad.content[-200:])
        assert unescape(bad.content.decode()).count(f"{field}:") == 1, bad.content
    assert kernel.storage.session(session_id).head_seq == head


def test_an_operator_forks_from_the_third_checkpoint_and_both_branches_stay(
    graphs: Path,
) -> None:
    kernel = runtime().kernel
    session_id, first = start(kernel, PIPELINE, {"input": {"messages": [("user", "go")]}})
    assert runs(graphs) == ["model"] * 4
    olga = client_for("olga", "operator")
    page = section(olga.get(f"/sessions/{session_id}/").content.decode())
    ids = [p.split('data-checkpoint="')[1].split('"')[0]
           for p in page.split('<li class="checkpoint')[1:]]
    assert len(ids) == 6  # the input, then one per node's step, and the last
    third = ids[2]
    [version] = {p.split('name="expected_version" value="')[1].split('"')[0]
                 for p in page.split('class="fork-form"')[1:]}
    assert f'id="fork-{third}-v{version}"' in page
    fork_form = page.split(f'id="fork-{third}-v{version}"')[1].split("</form>")[0]
    assert f"<option selected>{PIPELINE}</option>" in fork_form  # the graph it runs
    url = f"/sessions/{session_id}/graph/fork"
    form = {"action_id": "f1", "reason": "try step1 again", "checkpoint_id": third,
            "expected_version": version}
    head = kernel.storage.session(session_id).head_seq
    assert olga.post(url, {**form, "values": "[1]"}).status_code == 422
    assert olga.post(url, {**form, "checkpoint_id": "1f0-gone"}).status_code == 409
    for bad in ("", "-1", "v3", "\u00b2"):
        refused = olga.post(url, {**form, "expected_version": bad}, HTTP_HX_REQUEST="true")
        assert refused.status_code == 422 and "expected_version" in refused.content.decode()
    stale = olga.post(url, {**form, "expected_version": str(int(version) - 1)},
                      HTTP_HX_REQUEST="true")
    assert stale.status_code == 409 and "changed since you saw it" in stale.content.decode()
    assert client_for("vic", "viewer").post(url, form).status_code == 403
    assert kernel.storage.session(session_id).head_seq == head

    done = olga.post(url, form, HTTP_HX_REQUEST="true")
    assert done.status_code == 200 and "fork done" in done.content.decode(), done.content
    again = olga.post(url, form, HTTP_HX_REQUEST="true")
    assert "fork already done" in again.content.decode()
    [entry] = log(kernel, session_id, "fork")
    assert entry["by"] == "user:olga" and entry["reason"] == "try step1 again"
    assert entry["target"] == third
    [fork] = [t for t in kernel.storage.session_tasks(session_id) if t.id != first]
    assert fork.input == {"fork": {"checkpoint_id": third, "values": None}}
    assert olga.post(url, {**form, "action_id": "f2"}).status_code == 409  # the fork is open
    assert Worker(kernel, "w", 30).advance(fork.id)
    assert kernel.task(fork.id).outcome["kind"] == "succeeded"
    assert runs(graphs) == ["model"] * 7  # step1..step3 again, step0 not

    page = section(olga.get(f"/sessions/{session_id}/").content.decode())
    assert "2 branches" in page and 'data-branch="1"' in page
    for task_id in (first, fork.id):  # each branch's last checkpoint is on the page
        end = kernel.task(task_id).outcome["result"]["checkpoint_id"]
        assert f'id="checkpoint-{end}"' in page
    assert f'forked from <a href="#checkpoint-{third}"' in page


def test_an_operator_starts_a_run_on_the_thread_from_the_page(graphs: Path) -> None:
    kernel = runtime().kernel
    session_id, first = start(kernel, PIPELINE, {"input": {"messages": [("user", "go")]}})
    olga = client_for("olga", "operator")
    page = section(olga.get(f"/sessions/{session_id}/").content.decode())
    form = page.split('class="start-form"')[1].split("</form>")[0]
    assert f'<option selected>{PIPELINE}</option>' in form and APPROVAL in form
    version = form.split('name="expected_version" value="')[1].split('"')[0]
    assert f'id="start-run-v{version}"' in page
    url = f"/sessions/{session_id}/graph/runs"
    question = '{"messages": [{"type": "human", "content": "once more"}]}'
    fields = {"action_id": "s1", "reason": "a follow-up", "kind": PIPELINE, "input": question,
              "expected_version": version}
    head = kernel.storage.session(session_id).head_seq
    assert client_for("vic", "viewer").post(url, fields).status_code == 403
    for changed, named in (({"input": "[1"}, "input"), ({"input": ""}, "input"),
                           ({"kind": "nope"}, "kind"), ({"expected_version": "x"},
                                                        "expected_version")):
        bad = olga.post(url, {**fields, **changed}, HTTP_HX_REQUEST="true")
        assert bad.status_code == 422 and named in unescape(bad.content.decode()), changed
    stale = olga.post(url, {**fields, "expected_version": str(int(version) + 1)},
                      HTTP_HX_REQUEST="true")
    assert stale.status_code == 409 and "changed since you saw it" in stale.content.decode()
    assert kernel.storage.session(session_id).head_seq == head  # refusals changed nothing

    done = olga.post(url, fields, HTTP_HX_REQUEST="true")
    assert done.status_code == 200 and "start done" in done.content.decode(), done.content
    [run] = [t for t in kernel.storage.session_tasks(session_id) if t.id != first]
    assert f"The run is task {run.id}" in done.content.decode()
    assert run.input == run_input({"messages": [{"type": "human", "content": "once more"}]})
    [entry] = log(kernel, session_id, "start")
    assert entry["by"] == "user:olga" and entry["reason"] == "a follow-up"
    assert entry["target"] == PIPELINE
    shown = section(olga.get(f"/sessions/{session_id}/").content.decode())
    assert 'class="start-form"' not in shown and "A new run or a fork waits" in shown
    assert Worker(kernel, "w", 30).advance(run.id)
    assert runs(graphs) == ["model"] * 8  # the whole pipeline again, on the thread


def test_two_operators_forking_at_once_one_fork_lands(
    graphs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kernel = runtime().kernel
    session_id, _ = start(kernel, PIPELINE, {"input": {"messages": [("user", "go")]}})
    namespaces, version = graph_reads.versioned_index(session_id)
    [checkpoint_id, *_] = sorted(namespaces[""])
    accounts = [user("ann", "operator"), user("bob", "operator")]
    both_read_first(monkeypatch, graph_reads, "versioned_index")
    _, refused = decide_at_once(lambda i: commands.fork_graph(
        accounts[i], session_id, f"fork-{i}", "again", checkpoint_id, version))
    assert http_status(refused) == 409
    assert len(log(kernel, session_id, "fork")) == 1
    assert len(kernel.storage.session_tasks(session_id)) == 2


def test_two_operators_starting_runs_at_once_one_run_starts(
    graphs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both see the new session with no thread (version 0), both start: the runs would
    both go on from the same checkpoint, so one start is refused."""
    kernel = runtime().kernel
    session_id = kernel.create_session().id
    accounts = [user("ann", "operator"), user("bob", "operator")]
    both_read_first(monkeypatch, graph_reads, "thread")
    _, refused = decide_at_once(lambda i: commands.start_graph(
        accounts[i], session_id, f"start-{i}", "go", PIPELINE, {"messages": []}, 0))
    assert http_status(refused) == 409
    assert len(log(kernel, session_id, "start")) == 1
    assert len(kernel.storage.session_tasks(session_id)) == 1


def test_a_session_that_holds_no_thread_shows_no_graph_section(graphs: Path) -> None:
    from controlplane.ui.live import SESSION_PAGE

    kernel = runtime().kernel
    handle = kernel.create_session()
    seen = handle.head_seq
    draft = Draft(actor="user:test")
    draft.create_conversation()
    handle.commit(draft)
    page = client_for("olga", "operator").get(f"/sessions/{handle.id}/").content.decode()
    assert '<div id="graph" data-seq=' in page and "Graph thread" not in page
    found = SESSION_PAGE.update(handle.id, seen, True)
    assert found is not None and 'id="graph"' not in found[1]  # not re-rendered


def test_subgraph_namespaces_are_listed_newest_first_with_their_checkpoints(
    graphs: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A subgraph's checkpoints are in namespaces of their own: the page lists each with
    its count, its newest checkpoint and a timeline of its newest ones, the namespace
    with the newest first, as many as it shows (the rest counted), its name escaped; the
    API lists each namespace's checkpoints."""
    from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_metadata

    from controlplane.reads import graphs as graph_reads
    from kernel.hosts.langgraph import SessionStoreSaver

    monkeypatch.setattr(graph_reads, "SUBGRAPHS_SHOWN", 2)
    monkeypatch.setattr(graph_reads, "SUBGRAPH_TIMELINE", 1)
    saver = SessionStoreSaver(runtime().kernel)
    written: dict[str, list[str]] = {}
    try:
        for ns, count in (("", 1), ("draft:1", 3), ("<b>x</b>:2", 1), ("review:3", 2)):
            config: dict = {"configurable": {"thread_id": "nested", "checkpoint_ns": ns}}
            for step in range(count):
                config = saver.put(config, generate_checkpoint(), generate_metadata(step=step),
                                   {})
                written.setdefault(ns, []).append(config["configurable"]["checkpoint_id"])
    finally:
        saver.close()
    olga = client_for("olga", "operator")
    shown = section(olga.get("/sessions/nested/").content.decode())
    assert "(1 checkpoint)" in shown
    assert "Subgraphs wrote checkpoints in 3 namespaces: the 2 with the newest" in shown
    rows = shown.split('<tr class="subgraph"')[1:]
    assert [r.split('data-namespace="')[1].split('"')[0] for r in rows] == [
        "review:3", "&lt;b&gt;x&lt;/b&gt;:2"]
    assert 'data-checkpoints="2"' in rows[0] and "step 1" in rows[0]
    assert f'title="{written["review:3"][-1]}"' in rows[0]
    assert "<b>x</b>" not in shown
    timeline = rows[0].split('class="subgraph-timeline"')[1].split("</details>")[0]
    assert "Timeline (the last 1 of 2)" in timeline
    assert [li.split('data-checkpoint="')[1].split('"')[0]
            for li in timeline.split("<li ")[1:]] == written["review:3"][-1:]

    url = "/api/sessions/nested/graph/checkpoints"
    drafts = olga.get(url, {"namespace": "draft:1"}).json()
    assert drafts["total"] == 3 and drafts["namespace"] == "draft:1"
    assert [c["id"] for c in drafts["checkpoints"]] == written["draft:1"]
    assert [c["step"] for c in drafts["checkpoints"]] == [0, 1, 2]
    newest = olga.get(url, {"namespace": "draft:1", "limit": 2}).json()["checkpoints"]
    assert [c["id"] for c in newest] == written["draft:1"][1:]
    assert [c["id"] for c in olga.get(url).json()["checkpoints"]] == written[""]  # the root
    assert olga.get(url, {"namespace": "nowhere:9"}).status_code == 404
    assert olga.get(url, {"limit": 0}).status_code == 422
    thread = olga.get("/api/sessions/nested/graph").json()
    [first, _] = thread["subgraphs"]
    assert [c["id"] for c in first["timeline"]] == written["review:3"][-1:]
    assert thread["kind"] is None  # written by a saver alone: no run whose kind a fork takes
    assert '<select name="kind" required><option value="" disabled selected>Choose a graph' \
        in shown  # the form asks for the graph to run
    unnamed = post(olga, "/api/sessions/nested/graph/fork", {
        "action_id": "f1", "reason": "r", "checkpoint_id": written[""][0],
        "expected_version": thread["version"]})
    assert unnamed.status_code == 422 and "kind" in unnamed.json()["detail"], unnamed.json()
