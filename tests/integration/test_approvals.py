"""The approval gate over the API, on Postgres: the reference assistant's ``send_notices``
to more than ``NOTICE_APPROVAL_ABOVE`` recipients waits for an operator; the session
lists it; approve (perhaps with edited arguments) or deny name the digest of what the
operator saw; a stale decision is 409 and changes nothing; bad input is 422 naming the
field; each decision is in the operations log with who and why."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from django.test import Client

from controlplane import commands
from controlplane.errors import http_status
from controlplane.reads import approvals as approval_reads
from kernel import Draft, Kernel, Scheduler, Status, Worker
from kernel.agent import digest, submit
from kernel.commit import operations_log_id

from .api_kinds import with_test_kinds
from .clients import client_for, post, user
from .racing import both_read_first, decide_at_once

pytestmark = pytest.mark.django_db(transaction=True)

CUSTOMERS = ["ana@example.com", "ben@example.com", "cai@example.com"]


@pytest.fixture(autouse=True)
def kernel(monkeypatch: pytest.MonkeyPatch, settings: Any) -> Kernel:
    settings.NOTICE_APPROVAL_ABOVE = 2
    return with_test_kinds(monkeypatch)


def gated_call(kernel: Kernel, recipients: list[str] = CUSTOMERS) -> tuple[str, str]:
    """A session whose assistant turn called send_notices and waits for its approval."""
    handle = kernel.create_session()
    draft = Draft(actor="user:test")
    conversation = draft.create_conversation()
    handle.commit(draft)
    submit(handle, conversation, {"text": "Send the notice to " + ", ".join(recipients)},
           "req-1", actor="user:ann")
    Scheduler(kernel).run_until_idle()
    return handle.id, conversation


def approvals(client: Client, session_id: str) -> Any:
    answer = client.get(f"/api/sessions/{session_id}/approvals")
    assert answer.status_code == 200, answer.content
    return answer.json()


def decide(client: Client, session_id: str, decision: str, body: dict[str, Any],
           call_id: str = "call_send_notices_0") -> Any:
    return post(client, f"/api/sessions/{session_id}/calls/{call_id}/{decision}", body)


def log(kernel: Kernel, session_id: str) -> list[Any]:
    return [(e.kind, e.payload) for e in kernel.entries(operations_log_id(session_id))
            if e.kind in ("approve", "deny")]


def test_the_pending_call_is_listed_with_its_arguments_and_digest(kernel: Kernel) -> None:
    session_id, _ = gated_call(kernel)
    [pending] = approvals(client_for("vic", "viewer"), session_id)
    assert pending["call_id"] == "call_send_notices_0" and pending["name"] == "send_notices"
    assert pending["arguments"]["recipients"] == CUSTOMERS
    assert pending["digest"] == digest(pending["arguments"])
    assert pending["why"] == "3 recipients, more than 2"
    assert pending["parameters"]["required"] == ["recipients", "subject", "body"]
    task = kernel.task(pending["task_id"])
    assert task.status is Status.SLEEPING and task.lease_owner is None
    assert kernel.task(task.parent_id or "").status is Status.WAITING  # the turn holds none


def test_a_call_below_the_threshold_is_not_gated(kernel: Kernel) -> None:
    session_id, _ = gated_call(kernel, CUSTOMERS[:2])
    assert approvals(client_for("vic", "viewer"), session_id) == []


def test_approve_with_edited_arguments_runs_exactly_those(kernel: Kernel) -> None:
    session_id, _ = gated_call(kernel)
    olga = client_for("olga", "operator")
    [pending] = approvals(olga, session_id)
    edited = {**pending["arguments"], "recipients": CUSTOMERS[:1]}
    answer = decide(olga, session_id, "approve", {
        "action_id": "a1", "reason": "only Ana asked", "digest": pending["digest"],
        "expected_request": pending["request"],
        "arguments": edited})
    assert answer.status_code == 200, answer.content
    assert answer.json()["replayed"] is False
    again = decide(olga, session_id, "approve", {
        "action_id": "a1", "reason": "only Ana asked", "digest": pending["digest"],
        "expected_request": pending["request"],
        "arguments": edited})
    assert again.status_code == 200 and again.json()["replayed"] is True
    assert approvals(olga, session_id) == []
    assert log(kernel, session_id) == [("approve", {
        "target": pending["task_id"], "reason": "only Ana asked", "by": "user:olga",
        "via": "browser session",
        "action_id": "a1",
        "seen": {"digest": pending["digest"], "expected_request": pending["request"]}})]

    Worker(kernel, "w").advance(pending["task_id"])  # the tool task alone: no email here
    tool = kernel.task(pending["task_id"])
    child = kernel.task(tool.checkpoint["child"])
    assert child.kind == "send-batch" and child.input == edited
    assert tool.checkpoint["approved"]["by"] == "user:olga"
    assert tool.checkpoint["approved"]["arguments_digest"] == digest(edited)
    assert tool.checkpoint["approval"]["arguments"] == pending["arguments"]  # both kept


def test_deny_tells_the_model_why_and_sends_nothing(kernel: Kernel) -> None:
    session_id, conversation = gated_call(kernel)
    olga = client_for("olga", "operator")
    [pending] = approvals(olga, session_id)
    answer = decide(olga, session_id, "deny", {
        "action_id": "d1", "reason": "not these customers", "digest": pending["digest"],
        "expected_request": pending["request"]})
    assert answer.status_code == 200, answer.content
    Scheduler(kernel).run_until_idle()
    entries = kernel.entries(conversation)
    result = next(e.payload for e in entries if e.kind == "tool_result")
    assert result["denied"] is True and "not these customers" in result["error"]
    assert result["approval"]["by"] == "user:olga"
    assert "not these customers" in entries[-1].payload["text"]  # the model's answer
    assert not [t for t in kernel.storage.session_tasks(session_id) if t.kind == "send-batch"]
    assert log(kernel, session_id)[0][1]["reason"] == "not these customers"


def test_stale_decisions_are_409_and_change_nothing(kernel: Kernel) -> None:
    session_id, _ = gated_call(kernel)
    olga = client_for("olga", "operator")
    [pending] = approvals(olga, session_id)
    head = kernel.storage.session(session_id).head_seq
    other = digest({"recipients": ["someone@else.example"]})
    wrong = decide(olga, session_id, "approve",
                   {"action_id": "a0", "reason": "ok", "digest": other,
                    "expected_request": pending["request"]})
    assert wrong.status_code == 409 and "look again" in wrong.json()["detail"]
    assert kernel.storage.session(session_id).head_seq == head

    assert decide(olga, session_id, "deny", {
        "action_id": "d1", "reason": "no", "digest": pending["digest"],
        "expected_request": pending["request"]}).status_code == 200
    late = decide(olga, session_id, "approve",
                  {"action_id": "a1", "reason": "yes", "digest": pending["digest"],
                   "expected_request": pending["request"]})
    assert late.status_code == 409 and "waits for no approval" in late.json()["detail"]
    used = decide(olga, session_id, "approve",
                  {"action_id": "d1", "reason": "yes", "digest": pending["digest"],
                   "expected_request": pending["request"]})
    assert used.status_code == 409  # an action id names one action


@pytest.mark.parametrize("body, field", [
    ({"digest": "abc"}, "digest"),
    ({"expected_request": "abc"}, "expected_request"),
    ({"arguments": {"recipients": [], "subject": "s", "body": "b"}}, "arguments/recipients"),
    ({"arguments": {"recipients": ["a@b.c"], "subject": "s", "body": "b", "cc": 1}},
     "arguments"),
    ({"arguments": None}, "arguments"),
    ({"extra": 1}, "extra"),
    ({"reason": ""}, "reason"),
])
def test_bad_input_is_422_naming_the_field_and_changes_nothing(
    kernel: Kernel, body: dict[str, Any], field: str
) -> None:
    session_id, _ = gated_call(kernel)
    olga = client_for("olga", "operator")
    [pending] = approvals(olga, session_id)
    head = kernel.storage.session(session_id).head_seq
    full = {"action_id": "a1", "reason": "ok", "digest": pending["digest"],
            "expected_request": pending["request"], **body}
    answer = decide(olga, session_id, "approve", full)
    assert answer.status_code == 422, answer.content
    assert field in answer.content.decode()
    assert kernel.storage.session(session_id).head_seq == head
    assert approvals(olga, session_id) == [pending]


def test_only_operators_decide_and_an_unknown_call_is_404(kernel: Kernel) -> None:
    session_id, _ = gated_call(kernel)
    vic = client_for("vic", "viewer")
    [pending] = approvals(vic, session_id)
    body = {"action_id": "a1", "reason": "ok", "digest": pending["digest"],
            "expected_request": pending["request"]}
    assert decide(vic, session_id, "approve", body).status_code == 403
    assert decide(client_for("olga", "operator"), session_id, "approve", body,
                  call_id="call_nope").status_code == 404
    assert approvals(vic, session_id) == [pending]


def test_two_operators_deciding_at_once_exactly_one_decision_lands(
    kernel: Kernel, monkeypatch: pytest.MonkeyPatch
) -> None:
    session_id, _ = gated_call(kernel)
    [pending] = approval_reads.pending_in(session_id)
    accounts = [user("ann", "operator"), user("bob", "operator")]
    both_read_first(monkeypatch, approval_reads, "call_task")
    _, refused = decide_at_once(lambda i: commands.decide_call(
        accounts[i], session_id, pending.call_id, f"decide-{i}", "checked",
        ("approve", "deny")[i], pending.digest, pending.request))
    assert http_status(refused) == 409
    assert len(log(kernel, session_id)) == 1


def test_an_approval_after_the_call_timed_out_is_refused_and_changes_nothing(
    kernel: Kernel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The deadline has passed but no worker has run the timeout yet (they are busy):
    the call timed out, so an approval now must not make it run."""
    session_id, _ = gated_call(kernel)
    olga = client_for("olga", "operator")
    [pending] = approvals(olga, session_id)
    head = kernel.storage.session(session_id).head_seq
    until = datetime.fromisoformat(pending["until"])
    monkeypatch.setattr(kernel.clock, "now", lambda: until + timedelta(seconds=1))
    late = decide(olga, session_id, "approve",
                  {"action_id": "a1", "reason": "ok", "digest": pending["digest"],
                   "expected_request": pending["request"]})
    assert late.status_code == 409, late.content
    assert "timed out" in late.json()["detail"]
    assert kernel.storage.session(session_id).head_seq == head
    tool = kernel.task(pending["task_id"])
    assert (tool.status, tool.phase, tool.signals) == (Status.SLEEPING, "approval", {})


# -- the dashboard ----------------------------------------------------------------------------


def test_the_session_page_shows_the_pending_call_with_its_form(kernel: Kernel) -> None:
    session_id, _ = gated_call(kernel)
    page = client_for("olga", "operator").get(f"/sessions/{session_id}/").content.decode()
    [pending] = approval_reads.pending_in(session_id)
    card = page.split('id="call-call_send_notices_0"')[1].split("</article>")[0]
    assert 'data-state="approval"' in card and "waits for approval" in card
    assert "3 recipients, more than 2" in card
    assert f'name="digest" value="{pending.digest}"' in card
    assert 'name="csrfmiddlewaretoken"' in card and 'name="reason" required' in card
    assert 'value="approve"' in card and 'value="deny"' in card
    viewed = client_for("vic", "viewer").get(f"/sessions/{session_id}/").content.decode()
    assert "waits for approval" in viewed and 'name="digest"' not in viewed  # no form


def test_the_pending_call_is_pushed_live_to_the_session_page(kernel: Kernel) -> None:
    from controlplane.ui.live import SESSION_PAGE

    handle = kernel.create_session()
    draft = Draft(actor="user:test")
    conversation = draft.create_conversation()
    handle.commit(draft)
    seen = kernel.storage.session(handle.id).head_seq
    submit(handle, conversation, {"text": "to " + ", ".join(CUSTOMERS)}, "r", actor="user:a")
    Scheduler(kernel).run_until_idle()
    found = SESSION_PAGE.update(handle.id, seen, True)
    assert found is not None and 'data-state="approval"' in found[1]
    assert 'class="approval-form"' in found[1]


def test_needs_attention_lists_the_pending_call_with_its_form(kernel: Kernel) -> None:
    session_id, _ = gated_call(kernel)
    page = client_for("olga", "operator").get("/attention/").content.decode()
    section = page.split('id="approvals-h"')[1].split("</section>")[0]
    assert "(1)" in section and "send_notices" in section and session_id in section
    assert "ana@example.com" in section and 'class="approval-form"' in section


def test_approving_from_the_page_records_who_and_the_card_says_so(kernel: Kernel) -> None:
    session_id, _ = gated_call(kernel)
    [pending] = approval_reads.pending_in(session_id)
    olga = client_for("olga", "operator")
    url = f"/sessions/{session_id}/calls/{pending.call_id}/decide"
    form = {"action_id": "p1", "reason": "the list is right", "digest": pending.digest,
            "expected_request": pending.request,
            "decision": "approve", "arguments": ""}
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(user("oscar", "operator"))
    assert strict.post(url, form).status_code == 403  # no CSRF token: refused
    bad = olga.post(url, {**form, "arguments": "[1"}, HTTP_HX_REQUEST="true")
    assert bad.status_code == 422 and "arguments" in bad.content.decode()
    stale = olga.post(url, {**form, "digest": digest({})}, HTTP_HX_REQUEST="true")
    assert stale.status_code == 409
    done = olga.post(url, form, HTTP_HX_REQUEST="true")
    assert done.status_code == 200 and "approve done" in done.content.decode()
    assert log(kernel, session_id)[0][1]["by"] == "user:olga"

    Worker(kernel, "w").advance(pending.task_id)  # the batch starts; no email sent here
    page = olga.get(f"/sessions/{session_id}/").content.decode()
    card = page.split('id="call-call_send_notices_0"')[1].split("</article>")[0]
    assert 'data-state="approval"' not in card
    assert "Approved by <strong class=\"approved-by\">user:olga</strong>" in card
    assert "the list is right" in card


def test_a_pending_approval_counts_as_needing_attention_until_decided(kernel: Kernel) -> None:
    from controlplane.reads import charts

    before = charts.activity().attention_now
    session_id, _ = gated_call(kernel)
    found = charts.activity()
    assert found.attention_now == before + 1 and found.attention[-1] == before + 1
    olga = client_for("olga", "operator")
    [pending] = approvals(olga, session_id)
    assert decide(olga, session_id, "deny", {
        "action_id": "d1", "reason": "no", "digest": pending["digest"],
        "expected_request": pending["request"]}).status_code == 200
    assert charts.activity().attention_now == before


def test_an_approval_of_a_request_the_operator_did_not_see_is_refused(kernel: Kernel) -> None:
    """A restart of the call asks again, with the same arguments (the same digest): a
    decision made on the request shown before it is refused, and the new one is not
    approved by it."""
    session_id, _ = gated_call(kernel)
    olga = client_for("olga", "operator")
    [seen] = approvals(olga, session_id)
    task_id = seen["task_id"]
    [call, _] = olga.get(f"/api/tasks/{task_id}/restarts").json()
    restarted = post(olga, f"/api/tasks/{task_id}/restart", {
        "action_id": "r1", "reason": "ask again", "seq": call["seq"],
        "expected_seq": kernel.task(task_id).updated_seq})
    assert restarted.status_code == 200, restarted.content
    Scheduler(kernel).run_until_idle()
    [now] = approvals(olga, session_id)
    assert now["task_id"] == task_id and now["digest"] == seen["digest"]
    assert now["request"] != seen["request"]
    head = kernel.storage.session(session_id).head_seq

    late = decide(olga, session_id, "approve", {
        "action_id": "a1", "reason": "ok", "digest": seen["digest"],
        "expected_request": seen["request"]})
    assert late.status_code == 409 and "look again" in late.json()["detail"], late.content
    assert kernel.storage.session(session_id).head_seq == head
    done = decide(olga, session_id, "approve", {
        "action_id": "a2", "reason": "ok", "digest": now["digest"],
        "expected_request": now["request"]})
    assert done.status_code == 200, done.content


def test_a_call_id_pending_twice_in_a_session_is_decided_on_the_request_the_operator_saw(
    kernel: Kernel,
) -> None:
    """A turn branched from a response whose call waits for approval makes the call anew
    under the same call id: two requests of one id wait in the session. Each is decided
    on the one its decision names (its ``request``), as the list and each card show it;
    neither waits until its timeout because the other is newer."""
    session_id, conversation = gated_call(kernel)
    olga = client_for("olga", "operator")
    [original] = approvals(olga, session_id)
    response = next(e for e in kernel.entries(conversation) if e.kind == "model_response")
    branched = post(olga, f"/api/sessions/{session_id}/entries/{response.id}/branch",
                    {"action_id": "b1", "reason": "try again from here"})
    assert branched.status_code == 200, branched.content
    Scheduler(kernel).run_until_idle()
    both = approvals(olga, session_id)
    assert len(both) == 2 and original in both
    assert {p["call_id"] for p in both} == {original["call_id"]}

    denied = decide(olga, session_id, "deny", {
        "action_id": "d1", "reason": "the branch sends it", "digest": original["digest"],
        "expected_request": original["request"]}, call_id=original["call_id"])
    assert denied.status_code == 200, denied.content
    assert denied.json()["target"] == original["task_id"]
    again = decide(olga, session_id, "deny", {
        "action_id": "d1", "reason": "the branch sends it", "digest": original["digest"],
        "expected_request": original["request"]}, call_id=original["call_id"])
    assert again.status_code == 200 and again.json()["replayed"] is True, again.content
    [left] = approvals(olga, session_id)
    assert left["task_id"] != original["task_id"]
    approved = decide(olga, session_id, "approve", {
        "action_id": "a1", "reason": "ok", "digest": left["digest"],
        "expected_request": left["request"]}, call_id=left["call_id"])
    assert approved.status_code == 200, approved.content
    assert approvals(olga, session_id) == []
