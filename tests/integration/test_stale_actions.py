"""An operator action acts on what the operator saw, through the API and the dashboard's
forms: a cancel names the task's run, a wake the task's seq, a resubmission the
submission's seq, a bulk action's digest each task's seq (retry) or run (cancel). When
that changed since (another operator acted first), the action is refused (409) and
nothing changes; a request without it is refused (422, naming the field)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client

from controlplane import commands
from controlplane.reads import tasks as task_reads
from kernel import Kernel, Scheduler, Status

from .api_kinds import start
from .clients import login, post, user

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("kernel")]


def head(kernel: Kernel, task_id: str) -> int:
    session = kernel.storage.session(kernel.task(task_id).session_id)
    assert session is not None
    return session.head_seq


def form_post(client: Client, url: str, fields: dict[str, Any]) -> Any:
    return client.post(url, fields, HTTP_X_CSRFTOKEN=client.cookies["csrftoken"].value,
                       HTTP_HX_REQUEST="true")


def hidden(page: str, form: str, name: str) -> str:
    """The value of the hidden field ``name`` in the form whose element has id ``form``."""
    part = page[page.index(f'id="{form}"'):]
    found = re.search(rf'name="{name}" value="([^"]*)"', part[:part.index("</form>")])
    assert found is not None, f"no {name} in {form}"
    return found.group(1)


def retried_by_omar(kernel: Kernel) -> str:
    """A task that failed, which another operator retried since: it runs again."""
    _, task_id = start(kernel, "api-step", {"fail": True})
    commands.retry_task(user("omar", "operator"), task_id, "by-omar", "provider back",
                        kernel.task(task_id).updated_seq)
    assert kernel.task(task_id).run == 1
    return task_id


def test_a_cancel_of_a_task_started_again_since_is_refused_and_changes_nothing(
    kernel: Kernel, operator: Client
) -> None:
    """Olga saw the failed run (run 0) and cancels it; Omar retried it meanwhile: her
    cancel would stop his run, which she never saw."""
    task_id = retried_by_omar(kernel)
    before = head(kernel, task_id)
    missing = post(operator, f"/api/tasks/{task_id}/cancel", {"action_id": "c0", "reason": "x"})
    assert missing.status_code == 422 and "expected_run" in missing.content.decode()
    stale = post(operator, f"/api/tasks/{task_id}/cancel",
                 {"action_id": "c1", "reason": "stop it", "expected_run": 0})
    assert stale.status_code == 409, stale.content
    assert "started again" in stale.json()["detail"] and "look again" in stale.json()["detail"]
    assert head(kernel, task_id) == before and kernel.task(task_id).cancel is None
    assert operator.get(f"/api/tasks/{task_id}").json()["run"] == 1
    done = post(operator, f"/api/tasks/{task_id}/cancel",
                {"action_id": "c2", "reason": "stop it", "expected_run": 1})
    assert done.status_code == 200, done.content
    assert kernel.task(task_id).cancel["reason"] == "stop it"


def test_a_cancel_lands_on_the_run_it_saw_whatever_phase_that_run_reached(
    kernel: Kernel, operator: Client
) -> None:
    """A running agent commits at every step: its run, not its seq, is what a cancel
    names, so a cancel is not refused because the run moved on."""
    _, task_id = start(kernel, "api-step", {"ask": True})
    seen = operator.get(f"/api/tasks/{task_id}").json()
    resolved = post(operator, f"/api/tasks/{task_id}/resolve",
                    {"action_id": "r1", "reason": "checked", "decision": "sent",
                     "receipt": {"id": "m1"}, **seen["step"]})
    assert resolved.status_code == 200
    assert kernel.task(task_id).updated_seq != seen["updated_seq"]
    done = post(operator, f"/api/tasks/{task_id}/cancel",
                {"action_id": "c1", "reason": "not needed", "expected_run": seen["run"]})
    assert done.status_code == 200, done.content


def test_a_cancel_form_of_a_task_started_again_since_the_page_is_refused(
    kernel: Kernel,
) -> None:
    _, task_id = start(kernel, "api-step", {"fail": True})
    client = login("operator")
    page = client.get(f"/tasks/{task_id}/").content.decode()
    _, running = start(kernel, "api-step", {"sleep": True})
    running_page = client.get(f"/tasks/{running}/").content.decode()
    assert hidden(running_page, f"cancel-{running}", "expected_run") == "0"
    assert f'id="cancel-{task_id}"' not in page  # failed: nothing to cancel yet
    commands.retry_task(user("omar", "operator"), task_id, "by-omar", "provider back",
                        kernel.task(task_id).updated_seq)
    fields = {"action_id": "form-cancel", "reason": "stop"}
    missing = form_post(client, f"/tasks/{task_id}/cancel", fields)
    assert missing.status_code == 422 and b"expected_run" in missing.content
    before = head(kernel, task_id)
    stale = form_post(client, f"/tasks/{task_id}/cancel", {**fields, "expected_run": "0"})
    assert stale.status_code == 409 and b"started again" in stale.content, stale.content
    assert head(kernel, task_id) == before and kernel.task(task_id).cancel is None
    page = client.get(f"/tasks/{task_id}/").content.decode()
    assert hidden(page, f"cancel-{task_id}", "expected_run") == "1"
    assert "<dt>Run</dt><dd>1 " in page  # what the 409 told the operator to look at


def test_a_wake_of_a_sleep_that_ended_and_began_again_is_refused_and_changes_nothing(
    kernel: Kernel, operator: Client
) -> None:
    """Omar woke the task; it ran and slept again: Olga's wake, sent for the sleep she
    saw, would end a sleep she never saw."""
    _, task_id = start(kernel, "api-step", {"sleep": True, "sleeps": 2})
    seen = operator.get(f"/api/tasks/{task_id}").json()["updated_seq"]
    commands.wake_task(user("omar", "operator"), task_id, "by-omar", "now", seen)
    Scheduler(kernel).run_until_idle()
    again = kernel.task(task_id)
    assert again.status is Status.SLEEPING and again.updated_seq != seen
    before = head(kernel, task_id)
    missing = post(operator, f"/api/tasks/{task_id}/wake", {"action_id": "w0", "reason": "x"})
    assert missing.status_code == 422 and "expected_seq" in missing.content.decode()
    stale = post(operator, f"/api/tasks/{task_id}/wake",
                 {"action_id": "w1", "reason": "now", "expected_seq": seen})
    assert stale.status_code == 409, stale.content
    assert f"changed at #{again.updated_seq}" in stale.json()["detail"]
    assert head(kernel, task_id) == before
    assert kernel.task(task_id).status is Status.SLEEPING
    woken = post(operator, f"/api/tasks/{task_id}/wake",
                 {"action_id": "w2", "reason": "now", "expected_seq": again.updated_seq})
    assert woken.status_code == 200, woken.content
    assert kernel.task(task_id).status is Status.PENDING


def failed_submission(kernel: Kernel, operator: Client) -> tuple[str, dict[str, Any]]:
    session_id, _ = start(kernel, "api-step", {})
    conversation = post(operator, f"/api/sessions/{session_id}/conversations", {}).json()["id"]
    original = post(operator, f"/api/sessions/{session_id}/submissions",
                    {"conversation_id": conversation, "request_id": "q",
                     "input": {"text": "a"}}).json()
    return session_id, original


def test_a_second_resubmission_from_the_same_view_is_refused_and_starts_nothing(
    kernel: Kernel, operator: Client
) -> None:
    """Two operators resubmit the same submission from the same page: the second is
    refused rather than run the same input twice."""
    session_id, original = failed_submission(kernel, operator)
    url = f"/api/submissions/{original['id']}/resubmit"
    missing = post(operator, url, {"action_id": "re-0", "reason": "x"})
    assert missing.status_code == 422 and "expected_seq" in missing.content.decode()
    commands.resubmit(user("omar", "operator"), original["id"], "by-omar", "model was down",
                      original["updated_seq"])
    shown = operator.get(f"/api/submissions/{original['id']}").json()
    assert shown["resubmits"] == 1 and shown["updated_seq"] > original["updated_seq"]
    count = len(operator.get(f"/api/sessions/{session_id}/submissions").json())
    stale = post(operator, url, {"action_id": "re-1", "reason": "model was down",
                                 "expected_seq": original["updated_seq"]})
    assert stale.status_code == 409, stale.content
    assert "resubmitted 1 times" in stale.json()["detail"]
    assert len(operator.get(f"/api/sessions/{session_id}/submissions").json()) == count
    again = post(operator, url, {"action_id": "re-2", "reason": "once more",
                                 "expected_seq": shown["updated_seq"]})
    assert again.status_code == 200, again.content


def test_a_resubmit_form_of_a_submission_resubmitted_since_the_page_is_refused(
    kernel: Kernel, operator: Client
) -> None:
    session_id, original = failed_submission(kernel, operator)
    client = login("operator")
    page = client.get(f"/sessions/{session_id}/").content.decode()
    seen = hidden(page, f"resubmit-{original['id']}", "expected_seq")
    assert seen == str(original["updated_seq"])
    commands.resubmit(user("omar", "operator"), original["id"], "by-omar", "model was down",
                      int(seen))
    before = kernel.storage.session(session_id).head_seq
    url = f"/submissions/{original['id']}/resubmit"
    fields = {"action_id": "form-re", "reason": "model was down"}
    missing = form_post(client, url, fields)
    assert missing.status_code == 422 and b"expected_seq" in missing.content
    stale = form_post(client, url, {**fields, "expected_seq": seen})
    assert stale.status_code == 409 and b"look again" in stale.content, stale.content
    assert kernel.storage.session(session_id).head_seq == before
    page = client.get(f"/sessions/{session_id}/").content.decode()
    assert "resubmitted 1 time" in page


def test_a_bulk_retry_repeated_from_a_stale_preview_after_the_tasks_failed_again_is_refused(
    kernel: Kernel, operator: Client
) -> None:
    session_id, first = start(kernel, "api-step", {"fail": True})
    filters = {"action": "retry", "session_id": session_id, "outcome": "failed"}
    preview = post(operator, "/api/actions/bulk/preview", filters).json()
    assert preview["task_ids"] == [first]
    assert preview["seen"] == [kernel.task(first).updated_seq]
    confirm = {**filters, "reason": "provider back", "expected_count": preview["count"],
               "expected_digest": preview["digest"]}
    done = post(operator, "/api/actions/bulk", {**confirm, "action_id": "b1"})
    assert done.status_code == 200 and done.json()["results"][0]["ok"], done.content
    Scheduler(kernel).run_until_idle()  # it fails again
    assert kernel.task(first).outcome["kind"] == "failed"
    before = head(kernel, first)
    stale = post(operator, "/api/actions/bulk", {**confirm, "action_id": "b2"})
    assert stale.status_code == 409, stale.content
    assert "failed again" in stale.json()["detail"]
    assert head(kernel, first) == before
    assert kernel.task(first).status is Status.TERMINAL


def test_a_bulk_cancel_from_a_preview_before_a_task_was_started_again_is_refused(
    kernel: Kernel, operator: Client
) -> None:
    session_id, parent = start(kernel, "api-parent", {"n": 2})
    filters = {"action": "cancel", "session_id": session_id, "kind": "api-step"}
    preview = post(operator, "/api/actions/bulk/preview", filters).json()
    assert preview["count"] == 2 and preview["seen"] == [0, 0]
    confirm = {**filters, "action_id": "b1", "reason": "wrong", "expected_count": 2,
               "expected_digest": preview["digest"]}
    one = preview["task_ids"][0]
    restarted, omar = kernel.task(one), user("omar", "operator")
    point = commands.restart_preview(omar, one, restarted.created_seq)
    commands.restart_task(omar, one, "by-omar", "again", point.point.seq,
                          restarted.updated_seq)
    assert kernel.task(one).run == 1
    before = head(kernel, one)
    stale = post(operator, "/api/actions/bulk", confirm)
    assert stale.status_code == 409, stale.content
    assert "started again" in stale.json()["detail"]
    assert head(kernel, one) == before
    assert all(kernel.task(t).cancel is None for t in preview["task_ids"])


def test_the_retry_all_failed_form_of_tasks_that_failed_again_since_the_page_is_refused(
    kernel: Kernel,
) -> None:
    _, task_id = start(kernel, "api-step", {"fail": True})
    client = login("operator")
    page = client.get("/attention/").content.decode()
    fields = {name: hidden(page, "retry-failed", name)
              for name in ("action_id", "expected_count", "expected_digest")}
    commands.retry_task(user("omar", "operator"), task_id, "by-omar", "provider back",
                        kernel.task(task_id).updated_seq)
    Scheduler(kernel).run_until_idle()  # it fails again
    before = head(kernel, task_id)
    stale = form_post(client, "/attention/retry-failed", {**fields, "reason": "again"})
    assert stale.status_code == 409 and b"failed again" in stale.content, stale.content
    assert head(kernel, task_id) == before


def act_after_the_set_is_read(monkeypatch: pytest.MonkeyPatch, act: Any) -> None:
    """Right after a bulk action reads the tasks of its set (the digest matched), another
    operator's action lands first (``act``, once)."""
    read = task_reads.find_ids
    done: list[bool] = []

    def read_then_act(*args: Any) -> Any:
        found = read(*args)
        if not done:
            done.append(True)
            act()
        return found

    monkeypatch.setattr(task_reads, "find_ids", read_then_act)


def test_a_bulk_cancel_leaves_a_task_started_again_after_its_set_was_checked(
    kernel: Kernel, operator: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checked again in each task's own commit: the cancel names the run the preview
    found, so a restart that lands first leaves that task to run."""
    session_id, task_id = start(kernel, "api-step", {"ask": True})
    filters = {"action": "cancel", "session_id": session_id}
    preview = post(operator, "/api/actions/bulk/preview", filters).json()
    omar = user("omar", "operator")

    def restart() -> None:
        task = kernel.task(task_id)
        point = commands.restart_preview(omar, task_id, task.created_seq)
        commands.restart_task(omar, task_id, "by-omar", "again", point.point.seq,
                              task.updated_seq)

    act_after_the_set_is_read(monkeypatch, restart)
    answer = post(operator, "/api/actions/bulk",
                  {**filters, "action_id": "b1", "reason": "wrong", "expected_count": 1,
                   "expected_digest": preview["digest"]})
    assert answer.status_code == 200, answer.content
    [result] = answer.json()["results"]
    assert not result["ok"] and "started again" in result["detail"], result
    assert kernel.task(task_id).run == 1 and kernel.task(task_id).cancel is None


def test_a_bulk_retry_leaves_a_task_that_failed_again_after_its_set_was_checked(
    kernel: Kernel, operator: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    session_id, task_id = start(kernel, "api-step", {"fail": True})
    filters = {"action": "retry", "session_id": session_id}
    preview = post(operator, "/api/actions/bulk/preview", filters).json()

    def retried_and_failed_again() -> None:
        commands.retry_task(user("omar", "operator"), task_id, "by-omar", "provider back",
                            kernel.task(task_id).updated_seq)
        Scheduler(kernel).run_until_idle()

    act_after_the_set_is_read(monkeypatch, retried_and_failed_again)
    answer = post(operator, "/api/actions/bulk",
                  {**filters, "action_id": "b1", "reason": "again", "expected_count": 1,
                   "expected_digest": preview["digest"]})
    assert answer.status_code == 200, answer.content
    [result] = answer.json()["results"]
    assert not result["ok"] and "after the #" in result["detail"], result
    task = kernel.task(task_id)
    assert task.status is Status.TERMINAL and task.run == 1  # Omar's retry only
