"""A bulk action acts on the set of tasks its preview found, or on none: the preview
names the set (its ids, their count and digest), the confirmation carries the count and
the digest back, and a filter that finds other tasks by then, even as many, is refused
(409, nothing changed). The same request again (its action id) answers what the first
did, on the tasks page's form, the attention list's "retry all N failed" and the API."""

from __future__ import annotations

import hashlib
import re
from typing import Any

import pytest
from django.test import Client

from controlplane import models
from controlplane.commands import bulk as bulk_commands
from kernel import Draft, Kernel, Scheduler, Status

from .api_kinds import start
from .clients import login, post

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("kernel")]


def digest(named: list[tuple[str, int]]) -> str:
    """What the API documents: SHA-256 (hex) of the tasks, each ``<id> <seen>`` on a line,
    sorted."""
    return hashlib.sha256("\n".join(sorted(f"{i} {n}" for i, n in named)).encode()).hexdigest()


def form_fields(html: str) -> dict[str, str]:
    return dict(re.findall(r'name="(\w+)" value="([^"]*)"', html))


def end(kernel: Kernel, task_id: str) -> None:
    """Wake a sleeping api-step: it runs its last phase and succeeds."""
    draft = Draft(actor="user:test")
    draft.wake(task_id)
    kernel.open(kernel.task(task_id).session_id).commit(draft)
    Scheduler(kernel).run_until_idle()
    assert kernel.task(task_id).outcome["kind"] == "succeeded"


def retry_all_form(page: str) -> dict[str, str]:
    """The hidden fields of the attention list's "retry all N failed" form."""
    form = page[page.index('id="retry-failed"'):]
    return form_fields(form[:form.index("</details>")])


def hx_post(client: Client, url: str, form: dict[str, str]) -> Any:
    return client.post(url, form, HTTP_X_CSRFTOKEN=client.cookies["csrftoken"].value,
                       HTTP_HX_REQUEST="true")


def test_the_tasks_page_refuses_to_cancel_a_task_other_than_the_one_it_previewed(
    kernel: Kernel,
) -> None:
    """The preview showed task A; A ended and B began to sleep, so the filter finds one
    task again, but another one: the confirmation must not cancel B."""
    _, shown = start(kernel, "api-step", {"sleep": True})
    operator = login("operator")
    operator.get("/tasks/?kind=api-step&status=sleeping")
    preview = operator.get("/bulk/preview?action=cancel&kind=api-step&status=sleeping")
    html = preview.content.decode()
    assert 'data-count="1"' in html
    end(kernel, shown)
    _, other = start(kernel, "api-step", {"sleep": True})
    head = kernel.storage.session(kernel.task(other).session_id).head_seq

    answer = hx_post(operator, "/bulk/act", {**form_fields(html), "reason": "stop them"})
    assert answer.status_code == 409, answer.content
    assert b"not the ones the preview found" in answer.content
    assert kernel.task(other).cancel is None and kernel.task(other).status is Status.SLEEPING
    assert kernel.storage.session(kernel.task(other).session_id).head_seq == head
    assert f"/tasks/{shown}/" in html and f"/tasks/{other}/" not in html  # it named A


def test_the_api_refuses_another_set_of_the_same_count_and_acts_on_the_previewed_one(
    kernel: Kernel, operator: Client
) -> None:
    _, shown = start(kernel, "api-step", {"sleep": True})
    filters = {"action": "cancel", "kind": "api-step", "status": "sleeping"}
    preview = post(operator, "/api/actions/bulk/preview", filters).json()
    assert preview == {"count": 1, "task_ids": [shown], "seen": [0],  # a cancel: its run
                       "digest": digest([(shown, 0)])}
    end(kernel, shown)
    _, other = start(kernel, "api-step", {"sleep": True})
    confirm = {**filters, "action_id": "b1", "reason": "r", "expected_count": 1,
               "expected_digest": preview["digest"]}
    refused = post(operator, "/api/actions/bulk", confirm)
    assert refused.status_code == 409, refused.content
    assert kernel.task(other).cancel is None

    again = post(operator, "/api/actions/bulk/preview", filters).json()
    assert again["task_ids"] == [other] and again["digest"] != preview["digest"]
    done = post(operator, "/api/actions/bulk", {**confirm, "expected_digest": again["digest"]})
    assert done.status_code == 200, done.content
    assert done.json()["digest"] == again["digest"]
    assert [(r["task_id"], r["ok"]) for r in done.json()["results"]] == [(other, True)]
    assert kernel.task(other).cancel is not None


def test_the_same_bulk_request_again_answers_what_the_first_did(
    kernel: Kernel, operator: Client
) -> None:
    """The retry took the tasks out of the filter (they are pending now): a repeat of
    the request (a timeout, a double click) is answered from the first, not refused."""
    failing = [start(kernel, "api-step", {"fail": True})[1] for _ in range(2)]
    filters = {"action": "retry", "kind": "api-step", "outcome": "failed"}
    preview = post(operator, "/api/actions/bulk/preview", filters).json()
    request = {**filters, "action_id": "r1", "reason": "fixed",
               "expected_count": preview["count"], "expected_digest": preview["digest"]}
    first = post(operator, "/api/actions/bulk", request)
    assert first.status_code == 200, first.content
    assert {kernel.task(t).status for t in failing} == {Status.PENDING}

    repeat = post(operator, "/api/actions/bulk", request)
    assert repeat.status_code == 200, repeat.content
    assert repeat.json()["results"] == [{**r, "replayed": True} for r in first.json()["results"]]
    assert {r["detail"] for r in repeat.json()["results"]} == {"retry"}
    assert {kernel.task(t).status for t in failing} == {Status.PENDING}  # nothing new
    other_use = post(operator, "/api/actions/bulk", {**request, "action": "cancel"})
    assert other_use.status_code == 409 and "used for retry" in other_use.json()["detail"]


def test_retry_all_failed_submitted_twice_answers_the_second_as_the_first(
    kernel: Kernel,
) -> None:
    failing = [start(kernel, "api-step", {"fail": True})[1] for _ in range(2)]
    operator = login("operator")
    page = operator.get("/attention/").content.decode()
    form = retry_all_form(page)
    assert form["expected_count"] == "2" and form["action_id"].endswith("-retry-failed")
    form["reason"] = "channel fixed"
    first = hx_post(operator, "/attention/retry-failed", form)
    assert first.status_code == 200 and b"retry: 2 of 2 done" in first.content
    second = hx_post(operator, "/attention/retry-failed", form)  # a double submit
    assert second.status_code == 200, second.content
    assert b"2 already done earlier by this action id: nothing ran again" in second.content
    assert {kernel.task(t).status for t in failing} == {Status.PENDING}


def test_retry_all_failed_refuses_when_others_failed_than_the_page_showed(
    kernel: Kernel,
) -> None:
    _, shown = start(kernel, "api-step", {"fail": True})
    operator = login("operator")
    form = retry_all_form(operator.get("/attention/").content.decode())
    _, other = start(kernel, "api-step", {"fail": True})  # another fails; someone
    retry = Draft(actor="user:test")  # retries the shown one: one failed task, another
    retry.retry(shown)
    kernel.open(kernel.task(shown).session_id).commit(retry)
    answer = hx_post(operator, "/attention/retry-failed", {**form, "reason": "fixed"})
    assert answer.status_code == 409, answer.content
    assert kernel.task(other).status is Status.TERMINAL  # not retried


def test_a_repeat_of_a_bulk_request_cut_short_finishes_its_set_and_nothing_twice(
    kernel: Kernel, operator: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first request's process died after its first task's commit: the set is
    recorded but not what was done. The repeat answers the done task from its commit
    and does the rest; the tasks that failed since the preview are not taken in."""
    failing = [start(kernel, "api-step", {"fail": True})[1] for _ in range(2)]
    filters = {"action": "retry", "kind": "api-step", "outcome": "failed"}
    preview = post(operator, "/api/actions/bulk/preview", filters).json()
    request = {**filters, "action_id": "cut", "reason": "fixed",
               "expected_count": 2, "expected_digest": preview["digest"]}
    real_commit = bulk_commands.commit_action
    calls: list[str] = []

    def dies_after_one(*args: Any, **kwargs: Any) -> Any:
        if calls:
            raise SystemExit("the web process dies")
        calls.append(args[4])
        return real_commit(*args, **kwargs)

    monkeypatch.setattr(bulk_commands, "commit_action", dies_after_one)
    with pytest.raises(SystemExit):
        post(operator, "/api/actions/bulk", request)
    monkeypatch.setattr(bulk_commands, "commit_action", real_commit)
    [first] = calls
    assert models.BulkAction.objects.get(action_id="cut").results is None
    late = start(kernel, "api-step", {"fail": True})[1]  # not in the previewed set

    repeat = post(operator, "/api/actions/bulk", request)
    assert repeat.status_code == 200, repeat.content
    by_task = {r["task_id"]: (r["ok"], r["replayed"]) for r in repeat.json()["results"]}
    rest = next(t for t in failing if t != first)
    assert by_task == {first: (True, True), rest: (True, False)}
    retried = {t: len(kernel.task(t).checkpoint.get("_retried", [])) for t in [*failing, late]}
    assert retried == {first: 1, rest: 1, late: 0}  # each once, the late one not at all
    assert models.BulkAction.objects.get(action_id="cut").results is not None


@pytest.mark.parametrize("url", ["/bulk/act", "/attention/retry-failed"])
def test_a_bulk_form_whose_count_is_not_ascii_digits_is_refused_naming_it(
    kernel: Kernel, url: str,
) -> None:
    """"²" is a digit to Python's ``isdigit`` but no number to ``int``: the form is
    refused (422 naming the field), not answered with a server error."""
    _, failed = start(kernel, "api-step", {"fail": True})
    operator = login("operator")
    operator.get("/attention/")
    answer = hx_post(operator, url, {
        "action": "retry", "outcome": "failed", "status": "failed", "action_id": "b1",
        "reason": "fixed", "expected_count": "²", "expected_digest": digest([(failed, 0)])})
    assert answer.status_code == 422, answer.content
    assert b"expected_count" in answer.content
    assert kernel.task(failed).status is Status.TERMINAL
