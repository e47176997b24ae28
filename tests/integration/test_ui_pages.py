"""The dashboard's pages and live fragments, rendered in-process (no browser, no worker).

The browser tests (tests/browser) prove the live behaviour end to end; these pin what
each page shows, who may act, and that untrusted text is escaped.
"""

from __future__ import annotations

import html
import re
from datetime import timedelta
from html import unescape
from urllib.parse import unquote, urlsplit

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import resolve, reverse
from django.utils import timezone

from controlplane import models
from controlplane.reads.tasks import digest
from controlplane.sockets.routes import websocket_urlpatterns
from controlplane.ui.live import GLOBAL_PAGES, SESSION_PAGE
from controlplane.worker.runtime import runtime
from kernel import Decision, Draft, Scheduler, Status, agent
from kernel.records import SessionRecord
from kernel.session import SessionHandle

from .clients import login
from .sessions import EVIL, batch

pytestmark = pytest.mark.django_db(transaction=True)


def test_pages_render_and_escape_untrusted_text() -> None:
    session_id, task_id = batch(subject=EVIL)
    client = login("viewer")
    for url in ("/", "/attention/", "/workers/", f"/sessions/{session_id}/", f"/tasks/{task_id}/"):
        answer = client.get(url)
        assert answer.status_code == 200, (url, answer.content[:500])
        assert b"<script>window" not in answer.content, url
    page = client.get(f"/sessions/{session_id}/").content.decode()
    assert "&lt;script&gt;window.__pwned = 1&lt;/script&gt;" in page
    assert f'id="task-{task_id}"' in page and "Cancel…" not in page  # a viewer sees no action
    assert Client().get("/").status_code == 302  # to the login page


def test_a_session_id_a_url_must_escape_is_linked_and_followed_live_escaped() -> None:
    """A session named by its program (a LangGraph thread id) may hold what a URL must
    escape (``?``, ``#``, ``%``, a space): its page's socket and the tasks page's link to
    it name it escaped, so that they reach this session, not the one named by the id's
    start (``a`` for ``a?b``) or none."""
    session_id = "a?b#c 100%"
    handle = runtime().kernel.create_session(session_id, {"title": "escaped"})
    draft = Draft(actor="user:test")
    draft.create_task("send-batch", {"recipients": ["r@example.com"], "subject": "s",
                                     "body": "b", "channel": "http"})
    handle.commit(draft)
    client = login("viewer")

    def path_of(url: str) -> str:  # as the server routes it: the path, decoded
        return unquote(urlsplit(unescape(url)).path).lstrip("/")

    page = client.get(reverse("session", args=[session_id])).content.decode()
    (socket,) = re.findall(r'ws-connect="([^"]*)"', page)
    routed = [r.pattern.match(path_of(socket)) for r in websocket_urlpatterns]
    assert [m[2] for m in routed if m] == [{"session_id": session_id}]
    tasks = client.get("/tasks/").content.decode()
    (link,) = re.findall(r'<td><a href="(/sessions/[^"]*)">', tasks)
    assert resolve("/" + path_of(link)).kwargs == {"session_id": session_id}


def test_a_session_id_holding_a_slash_from_an_older_release_is_shown_and_linked() -> None:
    """A session id holding ``/`` is refused now, but one stored before (an upgrade keeps
    it) is shown on every page that links it, escaped, with links that reach it."""
    kernel = runtime().kernel
    session_id = "old/<b>run</b>"
    kernel.storage.create_session(SessionRecord(session_id, 0, kernel.clock.now(), {}))
    draft = Draft(actor="user:test")  # an unknown channel fails the plan: Needs attention
    task_id = draft.create_task("send-batch", {
        "recipients": ["a@example.com"], "subject": "s", "body": "b", "channel": "pigeon"})
    SessionHandle(kernel, session_id, 0).commit(draft)
    Scheduler(kernel).run_until_idle()
    client = login("operator")
    shown = html.escape(session_id, quote=False)
    for url in ("/", "/tasks/", "/attention/", f"/sessions/{session_id}/",
                f"/tasks/{task_id}/", f"/sessions/{session_id}/history"):
        answer = client.get(url)
        assert answer.status_code == 200, (url, answer.content[-2000:])
        assert "<b>run</b>" not in answer.content.decode(), url
    page = client.get(f"/sessions/{session_id}/").content.decode()
    assert shown in page and f'id="task-{task_id}"' in page
    (socket,) = re.findall(r'ws-connect="([^"]*)"', page)
    routed = [r.pattern.match(unquote(urlsplit(unescape(socket)).path).lstrip("/"))
              for r in websocket_urlpatterns]
    assert [m[2] for m in routed if m] == [{"session_id": session_id}]
    links = re.findall(r'href="(/sessions/[^"#]*)', client.get("/tasks/").content.decode()
                       + client.get(f"/tasks/{task_id}/").content.decode())
    assert links and {resolve(unquote(unescape(link))).kwargs["session_id"]
                      for link in links} == {session_id}
    found = client.get(f"/api/tasks/{task_id}")  # the API's session paths cannot name it
    assert found.status_code == 200 and found.json()["session_id"] == session_id


def test_a_viewer_is_refused_and_an_operator_cancels() -> None:
    session_id, task_id = batch()
    viewer = login("viewer")
    viewer.get("/")
    token = viewer.cookies["csrftoken"].value
    answer = viewer.post(f"/tasks/{task_id}/cancel", {"reason": "no", "action_id": "a1"},
                         HTTP_X_CSRFTOKEN=token)
    assert answer.status_code == 403
    assert runtime().kernel.task(task_id).cancel is None
    operator = login("operator")
    page = operator.get(f"/sessions/{session_id}/").content.decode()
    assert "Confirm cancel" in page
    token = operator.cookies["csrftoken"].value
    assert operator.post(f"/tasks/{task_id}/cancel", {"reason": "no", "action_id": "a1"}
                         ).status_code == 403  # CSRF: no token, nothing done
    form = {"reason": "wrong list", "action_id": "a1", "expected_run": "0"}
    assert 'name="expected_run" value="0"' in page  # the run the page shows
    answer = operator.post(f"/tasks/{task_id}/cancel", form,
                           HTTP_X_CSRFTOKEN=token, HTTP_HX_REQUEST="true")
    assert answer.status_code == 200, answer.content
    assert runtime().kernel.task(task_id).cancel is not None  # the intent; a worker winds down
    again = operator.post(f"/tasks/{task_id}/cancel", form,
                          HTTP_X_CSRFTOKEN=token, HTTP_HX_REQUEST="true")
    assert b"already done" in again.content


def test_a_cancelled_running_task_shows_it_waits_for_its_phase() -> None:
    session_id, task_id = batch()
    kernel = runtime().kernel
    now = timezone.now()
    assert kernel.storage.claim(task_id, "w1", now, now + timedelta(seconds=30)) is not None
    draft = Draft(actor="user:olga")
    draft.cancel(task_id, "wrong list")
    kernel.open(session_id).commit(draft)
    page = login("viewer").get(f"/sessions/{session_id}/").content.decode()
    row = page[page.index(f'id="task-{task_id}"'):]
    assert "the interrupted phase to return (at most until" in row[:3000]
    assert "cancel requested by user:olga" in row[:3000]


def test_live_fragments_are_tagged_and_only_when_something_changed() -> None:
    session_id, task_id = batch()
    head = runtime().kernel.storage.session(session_id).head_seq
    assert SESSION_PAGE.update(session_id, head, True) is None
    seq, html = SESSION_PAGE.update(session_id, 0, True)
    assert seq == head
    tags = set(re.findall(r'data-seq="(\d+)"', html))
    assert tags == {str(head)}
    assert f'id="task-{task_id}"' in html and 'id="feed-state"' in html
    assert "&lt;script&gt;" in html and "<script>window" not in html


def test_a_big_group_is_collapsed_and_paged() -> None:
    kernel = runtime().kernel
    handle = kernel.create_session()
    draft = Draft(actor="user:test")
    parent = draft.create_task("send-batch", {"recipients": ["a@x"], "subject": "s",
                                              "body": "b", "channel": "http"})
    handle.commit(draft)
    draft = Draft(actor="user:test")
    for i in range(120):
        draft.create_task("send-notice", {"plan": parent, "to": f"n{i}@x", "operation_id": f"o{i}"},
                          parent_id=parent)
    handle.commit(draft)
    client = login("viewer")
    page = client.get(f"/sessions/{handle.id}/").content.decode()
    assert "120 children: 120 pending" in page and "Show children (120" in page
    assert page.count('class="task-row') == 1
    first = client.get(f"/sessions/{handle.id}/tasks/{parent}/children?page=1").content.decode()
    assert first.count('class="task-row') == 50 and "page=2" in first
    last = client.get(f"/sessions/{handle.id}/tasks/{parent}/children?page=3").content.decode()
    assert last.count('class="task-row') == 20 and "Show more" not in last
    # Past the last page, or a page number that is no number: a page all the same.
    for page, rows in ((str(10**21), 0), ("9" * 10_000, 0), ("²", 50), ("-3", 50),
                       ("0x10", 50)):
        answer = client.get(f"/sessions/{handle.id}/tasks/{parent}/children", {"page": page})
        assert answer.status_code == 200, page
        assert answer.content.decode().count('class="task-row') == rows, page
        assert client.get("/tasks/", {"page": page}).status_code == 200, page


def test_the_workers_table_refreshes_itself_with_who_holds_which_lease() -> None:
    _, task_id = batch()
    now = timezone.now()
    runtime().kernel.storage.claim(task_id, "host-a:4242", now, now + timedelta(seconds=30))
    client = login("viewer")
    page = client.get("/workers/").content.decode()
    assert 'hx-trigger="every 2s"' in page and "host-a:4242" in page
    table = client.get("/workers/?part=table").content.decode()
    assert table.startswith('<div id="workers"') and "<html" not in table
    assert "host-a:4242" in table and task_id in table
    assert Client().get("/workers/?part=table").status_code == 302  # to the login page


def test_an_operator_resubmits_from_the_session_page_and_a_viewer_cannot() -> None:
    kernel = runtime().kernel
    handle = kernel.create_session()
    draft = Draft(actor="user:test")
    conversation = draft.create_conversation()
    handle.commit(draft)
    original = agent.submit(handle, conversation, {"text": "summarise"}, "req-1").submission
    assert original is not None
    viewer = login("viewer")
    assert "Resubmit…" not in viewer.get(f"/sessions/{handle.id}/").content.decode()
    token = viewer.cookies["csrftoken"].value
    url = f"/submissions/{original.id}/resubmit"
    form = {"reason": "the model was down", "action_id": "again-1",
            "expected_seq": str(original.updated_seq)}
    assert viewer.post(url, form, HTTP_X_CSRFTOKEN=token).status_code == 403

    operator = login("operator")
    assert "Resubmit…" in operator.get(f"/sessions/{handle.id}/").content.decode()
    token = operator.cookies["csrftoken"].value
    for _ in range(2):  # a double submit does nothing new
        answer = operator.post(url, form, HTTP_X_CSRFTOKEN=token, HTTP_HX_REQUEST="true")
        assert answer.status_code == 200, answer.content
    linked = models.Submission.objects.filter(resubmit_of=original.id)
    # The form's id, made the operator's own (u<their id>-...).
    olga = User.objects.get(username="operator-user")
    assert [(s.request_id, s.input) for s in linked] == [
        (f"u{olga.pk}-again-1", {"text": "summarise"})]

    # The operations log links the resubmitted submission on this page, not a task page.
    page = viewer.get(f"/sessions/{handle.id}/").content.decode()
    assert f'href="#submission-{original.id}"' in page
    assert f"/tasks/{original.id}/" not in page


def test_the_overview_keeps_its_filter_when_it_updates_live() -> None:
    kept, _ = batch(subject="kept")
    other, _ = batch(subject="other")
    page = login("viewer").get(f"/?q={kept[-12:]}&status=pending").content.decode()
    assert f"/ws/ui/overview/?q={kept[-12:]}&amp;status=pending" in page
    assert kept in page and other not in page
    live = GLOBAL_PAGES["overview"].update(0, False, q=kept[-12:], status="pending")
    assert kept in live and other not in live
    assert other in GLOBAL_PAGES["overview"].update(0, False, q="", status="no-such-status")


def test_an_operator_retries_every_failed_task_at_the_count_the_page_showed() -> None:
    kernel = runtime().kernel
    failing = []
    for _ in range(2):  # an unknown channel fails the plan at once, no provider needed
        handle = kernel.create_session()
        draft = Draft(actor="user:test")
        failing.append(draft.create_task("send-batch", {
            "recipients": ["a@example.com"], "subject": "s", "body": "b", "channel": "pigeon"}))
        handle.commit(draft)
    Scheduler(kernel).run_until_idle()
    assert [kernel.task(t).outcome["kind"] for t in failing] == ["failed", "failed"]

    viewer = login("viewer")
    assert "Retry all" not in viewer.get("/attention/").content.decode()
    form = {"reason": "channel fixed", "action_id": "bulk-1", "expected_count": "2",
            "expected_digest": digest((t, kernel.task(t).updated_seq) for t in failing)}
    assert viewer.post("/attention/retry-failed", form,
                       HTTP_X_CSRFTOKEN=viewer.cookies["csrftoken"].value).status_code == 403
    operator = login("operator")
    assert "Retry all 2 failed" in operator.get("/attention/").content.decode()
    token = operator.cookies["csrftoken"].value
    stale = operator.post("/attention/retry-failed", {**form, "expected_count": "3"},
                          HTTP_X_CSRFTOKEN=token, HTTP_HX_REQUEST="true")
    assert stale.status_code == 409 and b"preview again" in stale.content
    assert {kernel.task(t).status for t in failing} == {Status.TERMINAL}  # nothing done
    done = operator.post("/attention/retry-failed", form,
                         HTTP_X_CSRFTOKEN=token, HTTP_HX_REQUEST="true")
    assert done.status_code == 200 and b"retry: 2 of 2 done" in done.content
    assert {kernel.task(t).status for t in failing} == {Status.PENDING}


def test_a_new_task_kind_brings_its_own_decisions_to_the_form_and_the_api() -> None:
    """Decisions are the task definition's: a kind registered here, and nothing changed
    in the API or the templates, gets its answers in the resolve form and the API."""
    registry = runtime().kernel.registry
    if "approve-refund" not in registry.kinds():

        @registry.task("approve-refund")
        class ApproveRefund:
            initial = "ask"
            decisions = (
                Decision("approve", "Approve the refund", "yes",
                         may_repeat="the refund is paid"),
                Decision("deny", "Deny it", "no"),
            )

            def ask(self, run):
                return run.wait_for("approval", then="end")

            def end(self, run):
                return run.succeed(run.signal("approval")["decision"])

    kernel = runtime().kernel
    handle = kernel.create_session(metadata={"title": "refunds"})
    draft = Draft(actor="user:test")
    task_id = draft.create_task("approve-refund", {})
    handle.commit(draft)
    Scheduler(kernel).run_until_idle()
    operator = login("operator")
    page = operator.get("/attention/").content.decode()
    assert 'value="approve"' in page and "Approve the refund" in page
    assert "the refund is paid" in page and "It was sent" not in page
    answer = operator.get(f"/api/tasks/{task_id}").json()
    assert [d["name"] for d in answer["decisions"]] == ["approve", "deny"]
    token = operator.cookies["csrftoken"].value
    step = {"signal": "approval", "epoch": str(answer["step"]["epoch"])}
    assert answer["step"]["signal"] == "approval"
    assert f'name="epoch" value="{step["epoch"]}"' in page
    refused = operator.post(f"/tasks/{task_id}/resolve", {"reason": "ok", "decision": "sent",
                                                          "action_id": "r0", **step},
                            HTTP_X_CSRFTOKEN=token, HTTP_HX_REQUEST="true")
    assert refused.status_code == 422 and b"approve" in refused.content
    done = operator.post(f"/tasks/{task_id}/resolve", {"reason": "ok", "decision": "deny",
                                                       "action_id": "r1", **step},
                         HTTP_X_CSRFTOKEN=token, HTTP_HX_REQUEST="true")
    assert done.status_code == 200, done.content
    Scheduler(kernel).run_until_idle()
    assert kernel.task(task_id).outcome["result"] == "no"
