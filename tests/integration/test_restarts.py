"""Starting a task again from a committed phase, and branching a turn from a model
response, over the API and the task page, on Postgres: the restart points come from the
commit log; a preview says what stays, what runs again and which calls are made anew; a
restart carries the point and the task's seq the operator saw (409 when it changed, or
while the task runs); nothing before the chosen phase runs again (counted at a
provider); every restart and branch is in the operations log with who and why."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client

from kernel import Draft, Kernel, Run, Scheduler, Status, Transition
from kernel.agent import submit
from kernel.commit import operations_log_id
from kernel.forks import PhaseEntry

from .api_kinds import with_test_kinds
from .clients import client_for, post

pytestmark = pytest.mark.django_db(transaction=True)

CALLS: Counter[str] = Counter()
"""The counting provider: every call the pipeline's phases make, by phase."""


@pytest.fixture(autouse=True)
def kernel(monkeypatch: pytest.MonkeyPatch) -> Kernel:
    built = with_test_kinds(monkeypatch)
    CALLS.clear()
    if "counted-pipeline" not in built.registry.kinds():

        @built.registry.task("counted-pipeline")
        class Pipeline:
            initial = "one"

            def one(self, run: Run) -> Transition:
                CALLS["one"] += 1
                return run.next("two", {"one": run.operation_id("one")})

            def two(self, run: Run) -> Transition:
                CALLS["two"] += 1
                return run.next("three", {"two": run.operation_id("two")})

            def three(self, run: Run) -> Transition:
                CALLS["three"] += 1
                run.commit(phase="four", checkpoint={"intent": {
                    "operation_id": run.operation_id(), "replay": "unsafe"}})
                return self.four(run)  # the call, after its intent

            def four(self, run: Run) -> Transition:
                CALLS["four"] += 1
                if run.input.get("fail") and not run.checkpoint.get("_restarted"):
                    return run.fail("the provider said no")
                return run.succeed(run.checkpoint)

    return built


def run_pipeline(kernel: Kernel, **input: Any) -> tuple[str, str]:
    handle = kernel.create_session()
    draft = Draft(actor="user:test")
    task_id = draft.create_task("counted-pipeline", input)
    handle.commit(draft)
    Scheduler(kernel).run_until_idle()
    return handle.id, task_id


def points(client: Client, task_id: str) -> list[Any]:
    answer = client.get(f"/api/tasks/{task_id}/restarts")
    assert answer.status_code == 200, answer.content
    return answer.json()


def restarts_logged(kernel: Kernel, session_id: str) -> list[Any]:
    return [e.payload for e in kernel.entries(operations_log_id(session_id))
            if e.kind == "restart"]


def test_a_restart_from_phase_three_runs_nothing_before_it_again(kernel: Kernel) -> None:
    session_id, task_id = run_pipeline(kernel, fail=True)
    assert kernel.task(task_id).outcome["kind"] == "failed"
    assert CALLS == {"one": 1, "two": 1, "three": 1, "four": 1}
    olga = client_for("olga", "operator")
    found = points(client_for("vic", "viewer"), task_id)
    assert [p["phase"] for p in found] == ["one", "two", "three", "four"]
    three = found[2]
    assert set(three["checkpoint"]) == {"one", "two"}

    preview = olga.get(f"/api/tasks/{task_id}/restarts/{three['seq']}")
    assert preview.status_code == 200, preview.content
    shown = preview.json()
    assert [p["phase"] for p in shown["stays"]] == ["one", "two"]
    assert [p["phase"] for p in shown["runs_again"]] == ["three", "four"]
    assert shown["refused"] is None
    [call] = shown["calls"]  # the intent phase three recorded: made again as a new call
    assert (call["operation_id"], call["new_operation_id"], call["replay"]) == (
        f"op_{task_id}", f"op_{task_id}_r1", "unsafe")
    assert client_for("vic2", "viewer").get(
        f"/api/tasks/{task_id}/restarts/{three['seq']}").status_code == 403

    task = kernel.task(task_id)
    body = {"action_id": "r1", "reason": "the provider is back", "seq": three["seq"],
            "expected_seq": task.updated_seq}
    answer = post(olga, f"/api/tasks/{task_id}/restart", body)
    assert answer.status_code == 200, answer.content
    assert answer.json()["replayed"] is False
    assert any("new call under op_" in said for said in answer.json()["may_repeat"])
    again = post(olga, f"/api/tasks/{task_id}/restart", body)
    assert again.status_code == 200 and again.json()["replayed"] is True
    assert kernel.task(task_id).phase == "three"

    Scheduler(kernel).run_until_idle()
    done = kernel.task(task_id)
    assert done.outcome["kind"] == "succeeded"
    # Counted at the provider: nothing before phase three ran again.
    assert CALLS == {"one": 1, "two": 1, "three": 2, "four": 2}
    assert done.outcome["result"]["intent"]["operation_id"] == f"op_{task_id}_r1"
    assert done.outcome["result"]["two"] == f"op_{task_id}_two"  # kept from before
    [logged] = restarts_logged(kernel, session_id)
    assert (logged["by"], logged["reason"], logged["restart"]) == (
        "user:olga", "the provider is back", {"from_seq": three["seq"], "phase": "three"})
    after = points(olga, task_id)
    assert [p["phase"] for p in after] == ["one", "two", "three", "four", "three", "four"]
    assert after[4]["restart_of"] == three["seq"] and after[:4] == found


def test_a_changed_or_running_task_is_409_and_bad_input_422(kernel: Kernel) -> None:
    session_id, task_id = run_pipeline(kernel)
    olga = client_for("olga", "operator")
    first = points(olga, task_id)[0]
    task = kernel.task(task_id)
    head = kernel.storage.session(session_id).head_seq
    stale = post(olga, f"/api/tasks/{task_id}/restart", {
        "action_id": "r1", "reason": "again", "seq": first["seq"],
        "expected_seq": task.updated_seq - 1})
    assert stale.status_code == 409 and "look again" in stale.json()["detail"]
    nowhere = post(olga, f"/api/tasks/{task_id}/restart", {
        "action_id": "r2", "reason": "again", "seq": first["seq"] + 10_000,
        "expected_seq": task.updated_seq})
    assert nowhere.status_code == 422 and "seq" in nowhere.json()["detail"]
    unknown = post(olga, f"/api/tasks/{task_id}/restart", {
        "action_id": "r3", "reason": "again", "seq": first["seq"],
        "expected_seq": task.updated_seq, "phase": "one"})
    assert unknown.status_code == 422 and "phase" in unknown.content.decode()
    assert post(client_for("vic", "viewer"), f"/api/tasks/{task_id}/restart", {
        "action_id": "r4", "reason": "again", "seq": first["seq"],
        "expected_seq": task.updated_seq}).status_code == 403
    assert kernel.storage.session(session_id).head_seq == head

    # Running (a worker holds its lease): refused until cancelled and ended.
    first_point = points(olga, task_id)[0]
    restarted = Draft(actor="user:test")
    restarted.restart(task_id, _entry(task_id, first_point),
                      expected_seq=kernel.task(task_id).updated_seq)
    kernel.open(session_id).commit(restarted)
    now = kernel.clock.now()
    claimed = kernel.storage.claim(task_id, "w9", now, now + timedelta(seconds=60))
    assert claimed is not None and claimed.status is Status.RUNNING
    running = post(olga, f"/api/tasks/{task_id}/restart", {
        "action_id": "r5", "reason": "again", "seq": first_point["seq"],
        "expected_seq": claimed.updated_seq})
    assert running.status_code == 409 and "cancel it" in running.json()["detail"]
    preview = olga.get(f"/api/tasks/{task_id}/restarts/{first_point['seq']}").json()
    assert "cancel it" in preview["refused"]


def _entry(task_id: str, point: dict[str, Any]) -> PhaseEntry:
    return PhaseEntry(task_id, point["seq"], point["phase"], point["checkpoint"],
                      point["version"])


def test_the_task_page_offers_start_again_on_each_phase_for_operators(kernel: Kernel) -> None:
    _, task_id = run_pipeline(kernel, fail=True)
    olga = client_for("olga", "operator")
    page = olga.get(f"/tasks/{task_id}/").content.decode()
    found = points(olga, task_id)
    for point in found:
        assert f'data-seq="{point["seq"]}"' in page
    assert page.count("Start again from here") == 4
    assert "Start again from here" not in client_for("vic", "viewer").get(
        f"/tasks/{task_id}/").content.decode()

    three = found[2]
    fragment = olga.get(f"/tasks/{task_id}/restart/preview?seq={three['seq']}",
                        HTTP_HX_REQUEST="true")
    assert fragment.status_code == 200
    shown = fragment.content.decode()
    assert 'name="csrfmiddlewaretoken"' in shown
    assert f'name="seq" value="{three["seq"]}"' in shown
    assert f'name="expected_seq" value="{kernel.task(task_id).updated_seq}"' in shown
    assert "new calls with new operation ids" in shown and f"op_{task_id}_r1" in shown

    done = olga.post(f"/tasks/{task_id}/restart", {
        "action_id": "f1", "reason": "from the page", "seq": three["seq"],
        "expected_seq": kernel.task(task_id).updated_seq}, HTTP_HX_REQUEST="true")
    assert done.status_code == 200, done.content
    assert "restart done" in done.content.decode()
    assert kernel.task(task_id).phase == "three"
    refused = olga.post(f"/tasks/{task_id}/restart", {
        "action_id": "f2", "reason": "twice", "seq": three["seq"],
        "expected_seq": three["seq"]}, HTTP_HX_REQUEST="true")
    assert refused.status_code == 409


def test_a_turn_branched_from_a_response_over_the_api(kernel: Kernel) -> None:
    handle = kernel.create_session()
    draft = Draft(actor="user:test")
    conversation = draft.create_conversation()
    handle.commit(draft)
    submit(handle, conversation, {"text": "hello"}, "req-1", actor="user:ann")
    Scheduler(kernel).run_until_idle()
    response = next(e for e in kernel.entries(conversation) if e.kind == "model_response")
    olga = client_for("olga", "operator")
    url = f"/api/sessions/{handle.id}/entries/{response.id}/branch"
    body = {"action_id": "b1", "reason": "try from here"}
    assert post(client_for("vic", "viewer"), url, body).status_code == 403
    answer = post(olga, url, body)
    assert answer.status_code == 200, answer.content
    made = answer.json()
    again = post(olga, url, body)
    assert again.status_code == 200 and again.json() == {**made, "replayed": True}
    Scheduler(kernel).run_until_idle()
    turn = kernel.task(made["turn_id"])
    assert turn.outcome["kind"] == "succeeded"
    assert turn.input["conversation_id"] == made["conversation_id"]
    forked = kernel.entries(made["conversation_id"])
    assert forked[-1].id == response.id  # it starts from the response as committed
    [logged] = [e.payload for e in kernel.entries(operations_log_id(handle.id))
                if e.kind == "branch"]
    assert (logged["by"], logged["target"], logged["reason"]) == (
        "user:olga", response.id, "try from here")
    user_entry = kernel.entries(conversation)[0]
    refused = post(olga, f"/api/sessions/{handle.id}/entries/{user_entry.id}/branch",
                   {"action_id": "b2", "reason": "not a response"})
    assert refused.status_code == 409


def test_a_phase_entry_a_trim_kept_is_not_offered_as_a_restart_point(kernel: Kernel) -> None:
    """An operator's restart is a keyed commit: a trim keeps its row (its key is refused
    again) though the commits around it are gone, so the phases after it, and the calls
    they made, are not known: it is no restart point, on the API, the page or its
    waterfall."""
    session_id, task_id = run_pipeline(kernel, fail=True)
    olga = client_for("olga", "operator")
    three = points(olga, task_id)[2]
    answer = post(olga, f"/api/tasks/{task_id}/restart", {
        "action_id": "r1", "reason": "the provider is back", "seq": three["seq"],
        "expected_seq": kernel.task(task_id).updated_seq})
    assert answer.status_code == 200, answer.content
    restart_seq = answer.json()["seq"]
    Scheduler(kernel).run_until_idle()
    assert kernel.task(task_id).outcome["kind"] == "succeeded"
    kernel.trim(session_id, kernel.storage.session(session_id).head_seq)

    assert points(olga, task_id) == []
    preview = olga.get(f"/api/tasks/{task_id}/restarts/{restart_seq}")
    assert preview.status_code == 404
    assert "retention removed" in preview.json()["detail"]
    refused = post(olga, f"/api/tasks/{task_id}/restart", {
        "action_id": "r2", "reason": "again", "seq": restart_seq,
        "expected_seq": kernel.task(task_id).updated_seq})
    assert refused.status_code == 422 and "retention removed" in refused.json()["detail"]
    page = olga.get(f"/tasks/{task_id}/").content.decode()
    assert "Start again from here" not in page
    assert f'data-seq="{restart_seq}"' not in page
