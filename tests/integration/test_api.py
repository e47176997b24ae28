"""The REST API: reads, operator actions, roles, idempotent action ids, bad input."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import connection
from django.test import Client

from controlplane import commands
from controlplane.access import issue_token
from controlplane.reads.tasks import digest
from kernel import (
    Draft,
    Kernel,
    Registry,
    Scheduler,
    Status,
)
from kernel.commit import operations_log_id

from .api_kinds import start
from .clients import client_for, post, user

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("kernel")]


@pytest.fixture
def viewer() -> Client:
    return client_for("vic", "viewer")


# -- who may do what -------------------------------------------------------------------


def test_anonymous_callers_are_refused_and_nothing_changes(kernel: Kernel) -> None:
    session_id, task_id = start(kernel, "api-step", {"sleep": True})
    anonymous = Client()
    assert anonymous.get("/api/sessions").status_code == 401
    response = post(anonymous, f"/api/tasks/{task_id}/wake", {"action_id": "a", "reason": "r"})
    assert response.status_code == 401
    assert kernel.task(task_id).status is Status.SLEEPING


def test_viewers_read_but_every_action_is_refused(kernel: Kernel, viewer: Client) -> None:
    session_id, task_id = start(kernel, "api-step", {"ask": True})
    assert viewer.get(f"/api/sessions/{session_id}").json()["id"] == session_id
    assert viewer.get(f"/api/tasks/{task_id}").json()["status"] == "waiting"
    head = kernel.storage.session(session_id).head_seq
    action = {"action_id": "x", "reason": "because"}
    for url, body in [
        (f"/api/tasks/{task_id}/cancel", {**action, "expected_run": 0}),
        (f"/api/tasks/{task_id}/retry", {**action, "expected_seq": 1}),
        (f"/api/tasks/{task_id}/wake", {**action, "expected_seq": 1}),
        (f"/api/tasks/{task_id}/resolve",
         {**action, "decision": "sent", "signal": "resolution-1", "epoch": 1}),
        ("/api/actions/bulk", {**action, "action": "cancel", "session_id": session_id,
                               "expected_count": 1,
                               "expected_digest": digest([(task_id, 0)])}),
        ("/api/actions/bulk/preview", {"action": "cancel", "session_id": session_id}),
        ("/api/sessions", {}),
    ]:
        response = post(viewer, url, body)
        assert response.status_code == 403, url
    assert kernel.storage.session(session_id).head_seq == head


def test_accounts_without_a_role_cannot_even_read() -> None:
    assert client_for("nobody", None).get("/api/sessions").status_code == 403


def test_programs_use_bearer_tokens(kernel: Kernel) -> None:
    session_id, task_id = start(kernel, "api-step", {"sleep": True})
    token = issue_token(user("bot", "operator"), "ci")
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    client = Client()
    assert client.get(f"/api/tasks/{task_id}", **headers).status_code == 200
    response = client.post(
        f"/api/tasks/{task_id}/wake",
        json.dumps({"action_id": "w1", "reason": "now",
                    "expected_seq": kernel.task(task_id).updated_seq}),
        content_type="application/json",
        **headers,
    )
    assert response.status_code == 200
    assert Client().get("/api/sessions", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401


def test_browser_sessions_need_csrf_for_actions(kernel: Kernel) -> None:
    session_id, task_id = start(kernel, "api-step", {"sleep": True})
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(user("olga", "operator"))
    response = post(browser, f"/api/tasks/{task_id}/wake",
                    {"action_id": "w", "reason": "r",
                     "expected_seq": kernel.task(task_id).updated_seq})
    assert response.status_code == 403
    assert kernel.task(task_id).status is Status.SLEEPING


# -- reads -----------------------------------------------------------------------------


def test_sessions_conversations_entries_and_documents(kernel: Kernel, operator: Client) -> None:
    created = post(operator, "/api/sessions", {"metadata": {"title": "t"}})
    assert created.status_code == 201
    session_id = created.json()["id"]
    conversation = post(operator, f"/api/sessions/{session_id}/conversations", {}).json()["id"]
    handle = kernel.open(session_id)
    for i in range(5):
        draft = Draft()
        draft.append(conversation, "user", {"i": i})
        handle.commit(draft)
    first = operator.get(f"/api/conversations/{conversation}/entries?limit=2").json()
    assert [e["payload"]["i"] for e in first["entries"]] == [0, 1]
    rest = operator.get(
        f"/api/conversations/{conversation}/entries?after={first['next']}&limit=10"
    ).json()
    assert [e["payload"]["i"] for e in rest["entries"]] == [2, 3, 4] and rest["next"] is None
    assert operator.get(f"/api/conversations/{conversation}/entries?after=junk").status_code == 422
    assert [s["id"] for s in operator.get("/api/sessions").json()][0] == session_id

    draft = Draft()
    draft.set("email-plan", "p", ["state"], "one")
    handle.commit(draft)
    draft = Draft()
    draft.set("email-plan", "p", ["state"], "two")
    handle.commit(draft)
    url = f"/api/sessions/{session_id}/documents/email-plan/p"
    assert operator.get(url).json() == {"kind": "email-plan", "key": "p", "version": 2,
                                        "value": {"state": "two"}}
    assert operator.get(f"{url}?version=1").json()["value"] == {"state": "one"}
    assert operator.get(f"{url}?version=0").status_code == 422
    assert operator.get(f"/api/sessions/{session_id}/documents/nope/p").status_code == 404
    assert operator.get("/api/sessions/sess_missing").status_code == 404


def test_submissions_are_idempotent_by_request_id(kernel: Kernel, operator: Client) -> None:
    session_id = post(operator, "/api/sessions", {}).json()["id"]
    conversation = post(operator, f"/api/sessions/{session_id}/conversations", {}).json()["id"]
    url = f"/api/sessions/{session_id}/submissions"
    body = {"conversation_id": conversation, "request_id": "r1", "input": {"text": "hi"}}
    first = post(operator, url, body)
    again = post(operator, url, {**body, "input": {"text": "other"}})
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json() == first.json()
    missing = post(operator, url, {"conversation_id": conversation, "input": {}})
    assert missing.status_code == 422 and "request_id" in missing.content.decode()
    assert operator.get(f"/api/submissions/{first.json()['id']}").json()["status"] == "placed"


def test_when_busy_steers_queues_or_rejects_writing_nothing(
    kernel: Kernel, operator: Client
) -> None:
    session_id = post(operator, "/api/sessions", {}).json()["id"]
    conversation = post(operator, f"/api/sessions/{session_id}/conversations", {}).json()["id"]
    url = f"/api/sessions/{session_id}/submissions"

    def submit(request_id: str, **extra: Any) -> Any:
        body = {"conversation_id": conversation, "request_id": request_id,
                "input": {"text": f"input {request_id}"}}
        return post(operator, url, {**body, **extra})

    first = submit("r1", when_busy="reject")  # idle: reject does not apply, a turn starts
    assert (first.status_code, first.json()["status"]) == (201, "placed")
    turn = kernel.document(session_id, "agent-conversation", conversation)["active"]
    assert kernel.task(turn).kind == "agent-turn"

    head = kernel.storage.session(session_id).head_seq
    refused = submit("r2", when_busy="reject")
    assert refused.status_code == 409
    assert f"busy with turn {turn}" in refused.json()["detail"]
    assert "nothing was written" in refused.json()["detail"]
    bad = submit("r3", when_busy="sideways")
    assert bad.status_code == 422 and "when_busy" in bad.content.decode()
    no_text = post(operator, url, {"conversation_id": conversation, "request_id": "r4",
                                   "input": {"txt": "typo"}})
    assert no_text.status_code == 422 and "input" in no_text.json()["detail"]
    assert kernel.storage.session(session_id).head_seq == head  # none of them wrote
    assert kernel.storage.submission_by_request(session_id, "r2") is None

    steered, queued = submit("r5", when_busy="steer"), submit("r6", when_busy="follow_up")
    assert (steered.status_code, steered.json()["status"]) == (201, "placed")
    assert (queued.status_code, queued.json()["status"]) == (201, "queued")
    state = kernel.document(session_id, "agent-conversation", conversation)
    assert state == {"active": turn, "steering": [steered.json()["id"]],
                     "queue": [queued.json()["id"]]}
    assert submit("r2", when_busy="reject").status_code == 409  # still busy, still refused


def test_tasks_by_filter_and_as_a_tree(
    kernel: Kernel, viewer: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    session_id, parent = start(kernel, "api-parent", {"n": 3})
    tree = viewer.get(f"/api/sessions/{session_id}/tree").json()
    assert [n["task"]["id"] for n in tree] == [parent]
    assert [c["task"]["status"] for c in tree[0]["children"]] == ["waiting"] * 3
    waiting = viewer.get(f"/api/tasks?session_id={session_id}&waiting_for_resolution=true")
    assert len(waiting.json()) == 3
    roots = viewer.get(f"/api/tasks?session_id={session_id}&parent_id=root").json()
    assert [t["id"] for t in roots] == [parent]
    assert viewer.get("/api/tasks?status=bogus").status_code == 422
    odd_offset = "/api/tasks?since=1282-10-25T01:07:00-18:08&until=2999-01-01T00:00:00Z"
    assert viewer.get(odd_offset).status_code == 200  # offsets Postgres cannot hold
    assert viewer.get(f"/api/tasks?session_id={session_id}&blocked=true").json() == []
    monkeypatch.setattr(kernel, "registry", Registry())  # a deploy that lost the definitions
    blocked = viewer.get(f"/api/tasks?session_id={session_id}&blocked=true").json()
    assert len(blocked) == 4 and parent in {t["id"] for t in blocked}
    assert all("no definition registered" in t["blocked"] for t in blocked)


def test_the_blocked_filter_pages_over_the_tasks_it_matches(
    viewer: Client, kernel: Kernel, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``blocked`` picks the tasks before ``offset`` and ``limit`` page them: a blocked
    task after the first page of all tasks is on the first page of the blocked ones, and
    the pages of those not blocked hold only those, each once."""
    runnable = [start(kernel, "api-step", {"sleep": True})[1] for _ in range(3)]
    handle = kernel.create_session()
    draft = Draft(actor="user:test")
    stopped = draft.create_task("api-parent", {"n": 1})
    handle.commit(draft)
    deployed = Registry()  # a deploy that dropped api-parent
    deployed.add(kernel.registry.latest("api-step"))
    monkeypatch.setattr(kernel, "registry", deployed)
    found = viewer.get("/api/tasks", {"blocked": "true", "limit": 2}).json()
    assert [t["id"] for t in found] == [stopped]
    assert "no definition registered" in found[0]["blocked"]
    pages = [viewer.get("/api/tasks", {"blocked": "false", "limit": 2, "offset": offset}
                        ).json() for offset in (0, 2)]
    assert [t["id"] for page in pages for t in page] == runnable
    assert viewer.get("/api/tasks", {"blocked": "true", "offset": 1}).json() == []


# -- actions -------------------------------------------------------------------------------


def test_cancel_cascades_records_the_operator_and_is_idempotent(
    kernel: Kernel, operator: Client
) -> None:
    session_id, parent = start(kernel, "api-parent", {"n": 2})
    body = {"action_id": "cancel-1", "reason": "wrong list", "expected_run": 0}
    first = post(operator, f"/api/tasks/{parent}/cancel", body)
    assert first.status_code == 200 and first.json()["replayed"] is False
    again = post(operator, f"/api/tasks/{parent}/cancel", body)
    assert again.json() == {**first.json(), "replayed": True}
    Scheduler(kernel).run_until_idle()
    statuses = {t.outcome["kind"] for t in kernel.storage.session_tasks(session_id)}
    assert statuses == {"cancelled"}
    [entry] = kernel.entries(operations_log_id(session_id))
    assert entry.actor == "user:olga"
    assert entry.payload == {"target": parent, "reason": "wrong list", "by": "user:olga",
                             "action_id": "cancel-1", "via": "browser session",
                             "seen": {"expected_run": 0}}
    late = post(operator, f"/api/tasks/{parent}/cancel",
                {"action_id": "c2", "reason": "again", "expected_run": 0})
    assert late.status_code == 409


def test_resolve_wake_retry_and_resubmit(kernel: Kernel, operator: Client) -> None:
    _, asking = start(kernel, "api-step", {"ask": True})
    step = operator.get(f"/api/tasks/{asking}").json()["step"]
    assert step == {"signal": "resolution-1", "epoch": kernel.task(asking).epoch}
    resolved = post(operator, f"/api/tasks/{asking}/resolve",
                    {"action_id": "r1", "reason": "checked", "decision": "sent",
                     "receipt": {"id": "msg_1"}, **step})
    assert resolved.status_code == 200
    Scheduler(kernel).run_until_idle()
    assert kernel.task(asking).outcome["result"]["receipt"] == {"id": "msg_1"}
    assert post(operator, f"/api/tasks/{asking}/resolve",
                {"action_id": "r2", "reason": "x", "decision": "give_up", **step}
                ).status_code == 409
    bad = post(operator, f"/api/tasks/{asking}/resolve",
               {"action_id": "r3", "reason": "x", "decision": "maybe", **step})
    assert bad.status_code == 422 and "decision" in bad.content.decode()

    _, sleeping = start(kernel, "api-step", {"sleep": True})
    assert post(operator, f"/api/tasks/{sleeping}/wake",
                {"action_id": "w1", "reason": "now",
                 "expected_seq": kernel.task(sleeping).updated_seq}).status_code == 200
    Scheduler(kernel).run_until_idle()
    assert kernel.task(sleeping).outcome["kind"] == "succeeded"

    _, failing = start(kernel, "api-step", {"fail": True})
    seen = kernel.task(failing).updated_seq
    stale = post(operator, f"/api/tasks/{failing}/retry",
                 {"action_id": "t0", "reason": "go", "expected_seq": seen - 1})
    assert stale.status_code == 409 and f"#{seen}" in stale.json()["detail"], stale.json()
    assert kernel.task(failing).status is Status.TERMINAL  # nothing changed
    retried = post(operator, f"/api/tasks/{failing}/retry",
                   {"action_id": "t1", "reason": "go", "expected_seq": seen})
    assert retried.status_code == 200
    assert "runs again from its beginning" in retried.json()["may_repeat"][0]
    assert kernel.task(failing).status is Status.PENDING

    session_id = kernel.task(failing).session_id
    conversation = post(operator, f"/api/sessions/{session_id}/conversations", {}).json()["id"]
    original = post(operator, f"/api/sessions/{session_id}/submissions",
                    {"conversation_id": conversation, "request_id": "q",
                     "input": {"text": "a"}})
    seen = original.json()["updated_seq"]
    again = post(operator, f"/api/submissions/{original.json()['id']}/resubmit",
                 {"action_id": "re-1", "reason": "model was down", "expected_seq": seen})
    assert again.status_code == 200 and again.json()["replayed"] is False
    repeated = post(operator, f"/api/submissions/{original.json()['id']}/resubmit",
                    {"action_id": "re-1", "reason": "double click", "expected_seq": seen})
    assert repeated.json()["replayed"] is True and repeated.json()["seq"] == again.json()["seq"]
    linked = [s for s in operator.get(f"/api/sessions/{session_id}/submissions").json()
              if s["resubmit_of"] == original.json()["id"]]
    # A submission like any other: the conversation is busy with the original's turn,
    # so it follows that turn.
    assert [(s["request_id"], s["input"], s["status"]) for s in linked] == [
        ("re-1", {"text": "a"}, "queued")
    ]
    logged = [e.payload for e in kernel.entries(operations_log_id(session_id))
              if e.payload.get("action_id") == "re-1"]
    assert logged == [{"target": original.json()["id"], "reason": "model was down",
                       "by": "user:olga", "action_id": "re-1", "via": "browser session",
                       "seen": {"expected_seq": seen}}]


def test_an_action_is_logged_with_the_state_the_operator_saw(
    kernel: Kernel, operator: Client
) -> None:
    session_id, failing = start(kernel, "api-step", {"fail": True})
    seen = kernel.task(failing).updated_seq
    assert post(operator, f"/api/tasks/{failing}/retry",
                {"action_id": "t1", "reason": "go", "expected_seq": seen}).status_code == 200
    [entry] = kernel.entries(operations_log_id(session_id))
    assert entry.payload["seen"] == {"expected_seq": seen}
    # Shown where the log is: the task's page and the session's.
    said = f"saw expected_seq {seen}"
    assert said in operator.get(f"/tasks/{failing}/").content.decode()
    assert said in operator.get(f"/sessions/{session_id}/").content.decode()


def test_bulk_actions_preview_then_confirm_with_a_result_per_task(
    kernel: Kernel, operator: Client
) -> None:
    session_id, parent = start(kernel, "api-parent", {"n": 3})
    filters = {"action": "cancel", "session_id": session_id, "kind": "api-step",
               "status": "waiting"}
    preview = post(operator, "/api/actions/bulk/preview", filters).json()
    assert preview["count"] == 3
    confirm = {**filters, "action_id": "b1", "reason": "r", "expected_digest": preview["digest"]}
    stale = post(operator, "/api/actions/bulk", {**confirm, "expected_count": 2})
    assert stale.status_code == 409
    done = post(operator, "/api/actions/bulk", {**confirm, "expected_count": 3}).json()
    assert done["count"] == 3 and all(r["ok"] for r in done["results"])
    assert sorted(r["task_id"] for r in done["results"]) == sorted(preview["task_ids"])
    Scheduler(kernel).run_until_idle()
    assert kernel.task(parent).outcome["result"] and all(
        o["kind"] == "cancelled" for o in kernel.task(parent).outcome["result"].values()
    )
    retrying = {"action": "retry", "session_id": session_id, "kind": "api-step"}
    preview = post(operator, "/api/actions/bulk/preview", retrying).json()
    retry = post(operator, "/api/actions/bulk",
                 {**retrying, "action_id": "b2", "reason": "r", "expected_count": 3,
                  "expected_digest": preview["digest"]}).json()
    assert [r["ok"] for r in retry["results"]] == [False, False, False]
    assert all("only failed tasks retry" in r["detail"] for r in retry["results"])


def test_metrics_are_read_from_the_session_store(kernel: Kernel, operator: Client) -> None:
    start(kernel, "api-step", {"fail": True})
    start(kernel, "api-step", {"sleep": True})
    text = operator.get("/metrics").content.decode()
    assert 'durable_tasks{status="sleeping"} 1.0' in text
    assert 'durable_task_outcomes{outcome="failed"} 1.0' in text
    assert "durable_commits_total 4.0" in text
    assert "durable_dispatch_lag_seconds" in text and "durable_feed_subscribers 0.0" in text


def test_no_counter_in_the_metrics_goes_down_when_an_operator_retries_a_failed_task(
    kernel: Kernel, operator: Client
) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    def counters() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        text = operator.get("/metrics").content.decode()
        return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
                for family in text_string_to_metric_families(text)
                if family.type == "counter" for sample in family.samples}

    _, failing = start(kernel, "api-step", {"fail": True})
    before = counters()
    retried = post(operator, f"/api/tasks/{failing}/retry",
                   {"action_id": "t1", "reason": "go",
                    "expected_seq": kernel.task(failing).updated_seq})
    assert retried.status_code == 200
    after = counters()
    assert {k: (v, after.get(k)) for k, v in before.items() if after.get(k, 0.0) < v} == {}
    text = operator.get("/metrics").content.decode()
    assert 'durable_task_outcomes{outcome="failed"} 0.0' in text


def test_metrics_judge_expired_leases_by_the_database_clock_not_the_web_servers(
    kernel: Kernel, operator: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    from datetime import timedelta
    from types import SimpleNamespace

    from django.utils import timezone

    from controlplane.web import metrics

    _, sleeping = start(kernel, "api-step", {"sleep": True})
    now = kernel.clock.now()
    with connection.cursor() as cur:  # a worker's lease on it ran out 5 s ago
        cur.execute("UPDATE kernel_task SET status = 'running', lease_owner = 'gone', "
                    "lease_until = %s WHERE id = %s", [now - timedelta(seconds=5), sleeping])
    behind = SimpleNamespace(now=lambda: timezone.now() - timedelta(minutes=1))
    monkeypatch.setattr(metrics, "timezone", behind, raising=False)  # the web clock lags
    text = operator.get("/metrics").content.decode()
    assert "durable_expired_leases 1.0" in text


def test_text_postgres_cannot_store_is_refused_at_the_edge(operator: Client) -> None:
    nul = post(operator, "/api/sessions", {"metadata": {"title": "a\u0000b"}})
    assert nul.status_code == 422 and "NUL" in nul.content.decode()
    assert operator.get("/api/tasks?kind=a%00b").status_code == 422
    assert operator.get("/api/tasks?kind=%ff").status_code == 422
    assert operator.get("/api/sessions").json() == []


def test_creating_a_session_is_audited_with_its_actor_and_credential(kernel: Kernel) -> None:
    olga = user("olga", "operator")
    browser = Client()
    browser.force_login(olga)
    key = issue_token(olga, "ci")
    program = Client(HTTP_AUTHORIZATION=f"Bearer {key}")
    by_browser = post(browser, "/api/sessions", {"metadata": {"title": "a"}}).json()
    by_token = post(program, "/api/sessions", {}).json()
    token_id = olga.api_tokens.get().pk
    for created, via in ((by_browser, "browser session"),
                         (by_token, f"API token 'ci' (#{token_id})")):
        assert created["head_seq"] == 1
        [entry] = kernel.entries(operations_log_id(created["id"]))
        assert (entry.kind, entry.actor, entry.payload) == (
            "create-session", "user:olga", {"by": "user:olga", "via": via})
        page = browser.get(f"/sessions/{created['id']}/").content.decode()
        assert "create-session" in page and f"user:olga via {via}".replace("'", "&#x27;") in page


def test_a_session_the_shell_starts_is_audited_as_the_shell(kernel: Kernel) -> None:
    session_id, _ = commands.start_task("shell:root", "api-step", {}, None, "from the shell")
    [entry] = kernel.entries(operations_log_id(session_id))
    assert (entry.kind, entry.payload) == ("create-session", {"by": "shell:root", "via": "shell"})
