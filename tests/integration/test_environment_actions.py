"""An operator's migrate or restart of a task a worker left blocked by its environment
acts on the worker's report the operator saw: another worker may rewrite the report
(offering another environment) while the task stays as it was, and the action is then
refused (409) with nothing committed, over the API and from the dashboard's forms."""

from __future__ import annotations

import re
from typing import Any

import pytest

from kernel import Kernel
from kernel.environment import ENVIRONMENT

from .clients import login_as, post
from .environment_blocks import blocked_by, started

pytestmark = pytest.mark.django_db(transaction=True)


def head(kernel: Kernel, session_id: str) -> int:
    return kernel.storage.session(session_id).head_seq


def form_fields(page: str, start: str = 'id="migrate-') -> dict[str, str]:
    """The hidden fields of the form after ``start`` (the task page's migrate form)."""
    form = page[page.index(start):]
    form = form[:form.index("</form>")]
    return dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', form))


def migrated_to(kernel: Kernel, task_id: str) -> Any:
    return kernel.task(task_id).checkpoint[ENVIRONMENT]["tool pay"]


def test_a_migrate_over_the_api_commits_the_report_the_operator_saw(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kernel, handle, task_id = started(monkeypatch)
    blocked_by(kernel, task_id, "w2", "2")
    olga = login_as("operator")
    seen = olga.get(f"/api/tasks/{task_id}").json()
    assert "tool pay: 2 here" in seen["blocked"] and seen["environment_report"]

    answer = post(olga, f"/api/tasks/{task_id}/migrate", {
        "action_id": "m1", "reason": "schema 2 only adds a field",
        "expected_seq": seen["updated_seq"], "expected_report": seen["environment_report"]})
    assert answer.status_code == 200, answer.content
    assert migrated_to(kernel, task_id) == "2"


def test_a_migrate_of_a_report_another_worker_rewrote_since_is_refused_over_the_api(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kernel, handle, task_id = started(monkeypatch)
    blocked_by(kernel, task_id, "w2", "2")
    olga = login_as("operator")
    seen = olga.get(f"/api/tasks/{task_id}").json()
    blocked_by(kernel, task_id, "w3", "3")  # rewrites the report; the task is unchanged
    assert kernel.task(task_id).updated_seq == seen["updated_seq"]
    before = head(kernel, handle.id)

    answer = post(olga, f"/api/tasks/{task_id}/migrate", {
        "action_id": "m1", "reason": "schema 2 only adds a field",
        "expected_seq": seen["updated_seq"], "expected_report": seen["environment_report"]})
    assert answer.status_code == 409, answer.content
    assert "not the one you saw" in answer.json()["detail"]
    assert "tool pay: 3 here" in answer.json()["detail"]
    assert head(kernel, handle.id) == before
    assert migrated_to(kernel, task_id) == "1"


def test_a_migrate_without_the_report_it_acts_on_is_422_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kernel, handle, task_id = started(monkeypatch)
    blocked_by(kernel, task_id, "w2", "2")
    olga = login_as("operator")
    before = head(kernel, handle.id)
    answer = post(olga, f"/api/tasks/{task_id}/migrate", {
        "action_id": "m1", "reason": "r", "expected_seq": kernel.task(task_id).updated_seq})
    assert answer.status_code == 422 and "expected_report" in answer.content.decode()
    assert head(kernel, handle.id) == before


def test_the_migrate_form_is_refused_when_another_worker_rewrote_the_report_since(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kernel, handle, task_id = started(monkeypatch)
    blocked_by(kernel, task_id, "w2", "2")
    olga = login_as("operator")
    fields = form_fields(olga.get(f"/tasks/{task_id}/").content.decode())
    blocked_by(kernel, task_id, "w3", "3")
    before = head(kernel, handle.id)

    refused = olga.post(f"/tasks/{task_id}/migrate", {**fields, "reason": "checked"})
    assert refused.status_code == 409, refused.content
    assert head(kernel, handle.id) == before
    assert migrated_to(kernel, task_id) == "1"

    # The page read again shows w3's report, and its form migrates to what w3 offers.
    again = form_fields(olga.get(f"/tasks/{task_id}/").content.decode())
    done = olga.post(f"/tasks/{task_id}/migrate", {**again, "reason": "checked"})
    assert done.status_code == 200, done.content
    assert migrated_to(kernel, task_id) == "3"


def first_point(olga: Any, task_id: str) -> int:
    return int(olga.get(f"/api/tasks/{task_id}/restarts").json()[0]["seq"])


def test_a_restart_over_the_api_runs_under_the_environment_of_the_report_previewed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kernel, handle, task_id = started(monkeypatch)
    blocked_by(kernel, task_id, "w2", "2")
    olga = login_as("operator")
    seq = first_point(olga, task_id)
    preview = olga.get(f"/api/tasks/{task_id}/restarts/{seq}").json()
    assert "tool pay: 2 here" in preview["environment"]
    blocked_by(kernel, task_id, "w3", "3")
    before = head(kernel, handle.id)

    body = {"action_id": "r1", "reason": "again", "seq": seq,
            "expected_seq": preview["expected_seq"],
            "expected_report": preview["expected_report"]}
    refused = post(olga, f"/api/tasks/{task_id}/restart", body)
    assert refused.status_code == 409, refused.content
    assert "tool pay: 3 here" in refused.json()["detail"]
    unseen = post(olga, f"/api/tasks/{task_id}/restart", {
        **body, "action_id": "r2", "expected_report": None})
    assert unseen.status_code == 409, unseen.content
    assert head(kernel, handle.id) == before
    assert migrated_to(kernel, task_id) == "1"

    again = olga.get(f"/api/tasks/{task_id}/restarts/{seq}").json()
    done = post(olga, f"/api/tasks/{task_id}/restart", {
        **body, "action_id": "r3", "expected_report": again["expected_report"]})
    assert done.status_code == 200, done.content
    assert migrated_to(kernel, task_id) == "3"


def test_the_restart_form_is_refused_when_another_worker_rewrote_the_report_since(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kernel, handle, task_id = started(monkeypatch)
    blocked_by(kernel, task_id, "w2", "2")
    olga = login_as("operator")
    seq = first_point(olga, task_id)
    page = olga.get(f"/tasks/{task_id}/restart/preview?seq={seq}").content.decode()
    assert "tool pay: 2 here" in page
    fields = form_fields(page, 'id="restart-confirm"')
    blocked_by(kernel, task_id, "w3", "3")
    before = head(kernel, handle.id)

    refused = olga.post(f"/tasks/{task_id}/restart", {**fields, "reason": "again"})
    assert refused.status_code == 409, refused.content
    assert head(kernel, handle.id) == before
    assert migrated_to(kernel, task_id) == "1"
