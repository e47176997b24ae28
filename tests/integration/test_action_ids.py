"""An action id means one action on one target (issue 11, point 9): a repeat of the same
request answers what the first did; the id reused for another action or another target
is refused with 409 and changes nothing; the page's forms carry a fresh id each render."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client

from controlplane.reads.tasks import digest
from controlplane.worker.runtime import runtime
from kernel import Draft, Kernel, Scheduler, Status
from kernel.commit import operations_log_id

from .clients import client_for, login, post

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("kernel")]


def tasks_in_one_session(kernel: Kernel, *inputs: dict[str, Any]) -> tuple[str, list[str]]:
    handle = kernel.create_session()
    draft = Draft(actor="user:test")
    ids = [draft.create_task("api-step", i) for i in inputs]
    handle.commit(draft)
    Scheduler(kernel).run_until_idle()
    return handle.id, ids


def logged(kernel: Kernel, session_id: str) -> list[tuple[str, str, str]]:
    return [(e.kind, e.payload["target"], e.payload["action_id"])
            for e in kernel.entries(operations_log_id(session_id))]


def test_an_id_reused_for_another_target_or_action_is_refused(
    kernel: Kernel, operator: Client
) -> None:
    session_id, (a, b, failing) = tasks_in_one_session(
        kernel, {"sleep": True}, {"sleep": True}, {"fail": True})
    wake = {"action_id": "x", "reason": "now", "expected_seq": kernel.task(a).updated_seq}
    first = post(operator, f"/api/tasks/{a}/wake", wake)
    assert first.status_code == 200 and first.json()["replayed"] is False
    same = post(operator, f"/api/tasks/{a}/wake", wake)
    assert same.status_code == 200 and same.json() == {**first.json(), "replayed": True}
    head = kernel.storage.session(session_id).head_seq

    other_target = post(operator, f"/api/tasks/{b}/wake",
                        {"action_id": "x", "reason": "b",
                         "expected_seq": kernel.task(b).updated_seq})
    assert other_target.status_code == 409, other_target.content
    assert f"used for wake on {a}" in other_target.json()["detail"]
    other_action = post(operator, f"/api/tasks/{failing}/retry",
                        {"action_id": "x", "reason": "r",
                         "expected_seq": kernel.task(failing).updated_seq})
    assert other_action.status_code == 409
    cancel = post(operator, f"/api/tasks/{b}/cancel",
                  {"action_id": "x", "reason": "c", "expected_run": 0})
    assert cancel.status_code == 409
    assert kernel.storage.session(session_id).head_seq == head  # nothing written
    assert kernel.task(b).status is Status.SLEEPING
    assert kernel.task(failing).outcome["kind"] == "failed"
    assert logged(kernel, session_id) == [("wake", a, "x")]


def test_an_id_another_operator_used_for_the_same_action_is_refused_not_answered_as_done(
    kernel: Kernel, operator: Client
) -> None:
    """Omar's request under the id Olga used for the same action on the same task is not
    Olga's repeat: answered "replayed", Omar would take her action for his, done."""
    session_id, ids = tasks_in_one_session(kernel, {"sleep": True}, {"fail": True})
    wake = {"action_id": "wake-1", "reason": "now",
            "expected_seq": kernel.task(ids[0]).updated_seq}
    assert post(operator, f"/api/tasks/{ids[0]}/wake", wake).status_code == 200
    omar = client_for("omar", "operator")
    again = post(omar, f"/api/tasks/{ids[0]}/wake", wake)
    assert again.status_code == 409, again.content
    assert "used by user:olga" in again.json()["detail"]
    bulk = {"session_id": session_id, "action_id": "b", "reason": "r", "expected_count": 1,
            "expected_digest": digest([(ids[1], kernel.task(ids[1]).updated_seq)]),
            "action": "retry", "status": "terminal"}
    assert post(operator, "/api/actions/bulk", bulk).status_code == 200
    head = kernel.storage.session(session_id).head_seq
    theirs = post(omar, "/api/actions/bulk", bulk)
    assert theirs.status_code == 409, theirs.content
    assert "used by user:olga" in theirs.json()["detail"]
    assert kernel.storage.session(session_id).head_seq == head
    assert [by for *_, by in logged_by(kernel, session_id)] == ["user:olga", "user:olga"]


def logged_by(kernel: Kernel, session_id: str) -> list[tuple[str, str]]:
    return [(e.kind, e.payload["by"]) for e in kernel.entries(operations_log_id(session_id))]


def test_a_bulk_id_reused_for_another_action_is_refused_and_a_repeat_says_so(
    kernel: Kernel, operator: Client
) -> None:
    session_id, ids = tasks_in_one_session(kernel, {"fail": True}, {"fail": True})
    bulk = {"session_id": session_id, "action_id": "b", "reason": "r", "expected_count": 2,
            "expected_digest": digest((t, kernel.task(t).updated_seq) for t in ids)}
    first = post(operator, "/api/actions/bulk", {**bulk, "action": "retry"}).json()
    assert [(r["ok"], r["replayed"]) for r in first["results"]] == [(True, False)] * 2
    again = post(operator, "/api/actions/bulk", {**bulk, "action": "retry"}).json()
    assert [(r["ok"], r["replayed"], r["seq"]) for r in again["results"]] == [
        (True, True, r["seq"]) for r in first["results"]]
    head = kernel.storage.session(session_id).head_seq
    cancel = post(operator, "/api/actions/bulk", {**bulk, "action": "cancel"})
    assert cancel.status_code == 409 and "used for retry" in cancel.json()["detail"]
    single = post(operator, f"/api/tasks/{ids[0]}/cancel",
                  {"action_id": "b", "reason": "r", "expected_run": 1})
    assert single.status_code == 409
    assert kernel.storage.session(session_id).head_seq == head
    assert {kernel.task(t).status for t in ids} == {Status.PENDING}


def test_a_resubmit_id_names_one_submission(kernel: Kernel, operator: Client) -> None:
    session_id = post(operator, "/api/sessions", {}).json()["id"]
    conversation = post(operator, f"/api/sessions/{session_id}/conversations", {}).json()["id"]
    url = f"/api/sessions/{session_id}/submissions"
    one, two = (post(operator, url, {"conversation_id": conversation, "request_id": r,
                                     "input": {"text": r}}).json()["id"] for r in ("q1", "q2"))
    seen = {s: kernel.storage.submission(s).updated_seq for s in (one, two)}
    first = post(operator, f"/api/submissions/{one}/resubmit",
                 {"action_id": "re", "reason": "r", "expected_seq": seen[one]})
    assert first.status_code == 200
    head = kernel.storage.session(session_id).head_seq
    other = post(operator, f"/api/submissions/{two}/resubmit",
                 {"action_id": "re", "reason": "r", "expected_seq": seen[two]})
    assert other.status_code == 409 and f"used for resubmit on {one}" in other.json()["detail"]
    a_request_id = post(operator, f"/api/submissions/{two}/resubmit",
                        {"action_id": "q1", "reason": "r", "expected_seq": seen[two]})
    assert a_request_id.status_code == 409 and "request id" in a_request_id.json()["detail"]
    assert kernel.storage.session(session_id).head_seq == head


def test_retry_all_again_after_they_failed_again_retries_them_again() -> None:
    """The retry-all form used twice: with the same id (a preserved form, or a double
    submit) the answer says nothing ran again; with the fresh id and the digest of the
    failures a new render (or the page script) gives it, they run again."""
    kernel = runtime().kernel
    handle = kernel.create_session()
    draft = Draft(actor="user:test")
    failing = [draft.create_task("api-step", {"fail": True}) for _ in range(3)]
    handle.commit(draft)
    Scheduler(kernel).run_until_idle()
    operator = login("operator")
    page = operator.get("/attention/").content.decode()
    token = operator.cookies["csrftoken"].value

    def retry_all(action_id: str, shown: str) -> str:
        form = {"reason": "fixed", "action_id": action_id, "expected_count": "3",
                "expected_digest": re.findall(r'name="expected_digest" value="([^"]+)"', shown)[0]}
        answer = operator.post("/attention/retry-failed", form, HTTP_X_CSRFTOKEN=token,
                               HTTP_HX_REQUEST="true")
        assert answer.status_code == 200, answer.content
        return answer.content.decode()

    [shown_id] = re.findall(r'name="action_id" value="([^"]+-retry-failed)"', page)
    assert "retry: 3 of 3 done" in retry_all(shown_id, page)
    Scheduler(kernel).run_until_idle()  # they fail again
    assert {kernel.task(t).outcome["kind"] for t in failing} == {"failed"}

    repeated = retry_all(shown_id, page)
    assert "retry: 0 of 3 done" in repeated and "nothing ran again" in repeated
    assert {kernel.task(t).status for t in failing} == {Status.TERMINAL}

    page = operator.get("/attention/").content.decode()
    [fresh_id] = re.findall(r'name="action_id" value="([^"]+-retry-failed)"', page)
    assert fresh_id != shown_id
    assert "retry: 3 of 3 done" in retry_all(fresh_id, page)
    assert {kernel.task(t).status for t in failing} == {Status.PENDING}
    retries = [e for e in kernel.entries(operations_log_id(handle.id)) if e.kind == "retry"]
    assert len(retries) == 6
