"""The review's low findings, each pinned: forms that carry their CSRF token without
script, a Content-Security-Policy on every page, the read-only admin, the schema built
once, a readiness probe that tells anonymous callers nothing about the database, action
ids of one operator's page never answered for another's, the credential each action came
through, who issued and revoked each token, model-server errors kept from viewers."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client

from controlplane.worker.runtime import runtime
from kernel import Draft, Scheduler

from .clients import login, user

pytestmark = pytest.mark.django_db(transaction=True)


def failed_batches(count: int) -> list[str]:
    """Send-batch tasks that failed (an unknown channel fails the plan at once)."""
    kernel = runtime().kernel
    made = []
    for _ in range(count):
        handle = kernel.create_session()
        draft = Draft(actor="user:test")
        made.append(draft.create_task("send-batch", {
            "recipients": ["a@example.com"], "subject": "s", "body": "b", "channel": "pigeon"}))
        handle.commit(draft)
    Scheduler(kernel).run_until_idle()
    return made


def form_fields(html: str, marker: str) -> dict[str, str]:
    start = html.index(marker)
    form = html[html.rindex("<form", 0, start):html.index("</form>", start)]
    return dict(re.findall(r'name="(\w+)" value="([^"]*)"', form))


def test_the_retry_all_and_bulk_confirm_forms_post_without_script() -> None:
    """A plain form post (no htmx, so no X-CSRFToken header) carries its own token."""
    failed_batches(2)
    operator = login("operator")
    page = operator.get("/attention/").content.decode()
    fields = form_fields(page, 'name="action_id" value=')
    assert fields.get("csrfmiddlewaretoken"), fields
    done = operator.post("/attention/retry-failed", {**fields, "reason": "fixed"})
    assert done.status_code in (200, 302), done.content
    preview = operator.get("/bulk/preview?action=cancel&kind=send-batch").content.decode()
    fields = form_fields(preview, 'name="expected_count"')
    assert fields.get("csrfmiddlewaretoken"), fields
    acted = operator.post("/bulk/act", {**fields, "reason": "tidy"})
    assert acted.status_code in (200, 302), acted.content


def test_the_admin_is_read_only_for_accounts_and_roles_too() -> None:
    from django.contrib.auth.models import Group, Permission, User

    staff = User.objects.create_user("stan", password="pw", is_staff=True)
    staff.user_permissions.add(*Permission.objects.filter(
        content_type__app_label="auth"))  # change_user, change_group, add_...: all of them
    root = User.objects.create_superuser("root", password="pw")
    group = Group.objects.create(name="operator")
    for who in (staff, root):
        client = Client()
        client.force_login(who)
        shown = client.get(f"/admin/auth/user/{staff.pk}/change/")
        assert shown.status_code == 200
        assert "pbkdf2" not in shown.content.decode()  # no password hash, even read-only
        assert 'name="_save"' not in shown.content.decode()
        made_super = client.post(f"/admin/auth/user/{staff.pk}/change/", {
            "username": "stan", "is_staff": "on", "is_superuser": "on", "is_active": "on"})
        assert made_super.status_code == 403
        assert client.get("/admin/auth/user/add/").status_code == 403
        assert client.post(f"/admin/auth/group/{group.pk}/delete/",
                           {"post": "yes"}).status_code == 403
    staff.refresh_from_db()
    assert not staff.is_superuser and Group.objects.filter(pk=group.pk).exists()


def test_roles_are_given_and_taken_from_the_shell_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from io import StringIO

    from django.contrib.auth.models import User
    from django.core.management import CommandError, call_command

    from controlplane.access import role_of

    vic = User.objects.create_user("vic")
    caplog.set_level("INFO", logger="controlplane.audit")
    call_command("role", "vic", "viewer", stdout=StringIO())
    assert role_of(vic) == "viewer"
    call_command("role", "vic", "operator", stdout=StringIO())
    assert role_of(User.objects.get(pk=vic.pk)) == "operator"
    assert "role of vic: viewer -> operator, by shell:" in caplog.text
    call_command("role", "vic", "none", stdout=StringIO())
    assert role_of(User.objects.get(pk=vic.pk)) is None
    listed = StringIO()
    call_command("role", "--list", stdout=listed)
    assert "vic\t-" in listed.getvalue()
    with pytest.raises(CommandError, match="no user 'nobody'"):
        call_command("role", "nobody", "viewer")


def test_each_action_records_the_credential_it_came_through(api_kernel: object) -> None:
    from django.contrib.auth.models import Group, User

    from controlplane import commands
    from controlplane.access import issue_token
    from kernel.commit import operations_log_id

    from .api_kinds import start
    from .clients import post

    kernel = runtime().kernel
    olga = User.objects.create_user("olga")
    olga.groups.add(Group.objects.get_or_create(name="operator")[0])
    key = issue_token(olga, "ci")
    token_id = olga.api_tokens.get().pk
    tasks = [start(kernel, "api-step", {"sleep": True}) for _ in range(3)]
    by_token = Client(headers={"Authorization": f"Bearer {key}"})
    seen = {task_id: kernel.task(task_id).updated_seq for _, task_id in tasks}
    assert post(by_token, f"/api/tasks/{tasks[0][1]}/wake",
                {"action_id": "w1", "reason": "now",
                 "expected_seq": seen[tasks[0][1]]}).status_code == 200
    browser = Client()
    browser.force_login(olga)
    assert post(browser, f"/api/tasks/{tasks[1][1]}/wake",
                {"action_id": "w2", "reason": "now",
                 "expected_seq": seen[tasks[1][1]]}).status_code == 200
    commands.wake_task(olga, tasks[2][1], "w3", "from the shell", seen[tasks[2][1]])
    logged = {e.payload["action_id"]: e.payload for session_id, _ in tasks
              for e in kernel.entries(operations_log_id(session_id))}
    assert logged["w1"]["via"] == f"API token 'ci' (#{token_id})"
    assert logged["w2"]["via"] == "browser session"
    assert "via" not in logged["w3"]  # no request: the shell names itself as the actor


def test_one_operators_action_id_is_never_answered_for_another() -> None:
    """Both pages got the same live render, so the same action id in the retry form;
    the second operator's retry runs instead of being told it was done already."""
    (task_id,) = failed_batches(1)
    kernel = runtime().kernel
    form = {"action_id": "shared-nonce-retry", "reason": "provider back"}
    for name in ("olga", "omar"):
        client = _operator(name)
        seen = {"expected_seq": kernel.task(task_id).updated_seq}  # its failure, as shown
        done = client.post(f"/tasks/{task_id}/retry", {**form, **seen},
                           HTTP_X_CSRFTOKEN=client.cookies["csrftoken"].value,
                           HTTP_HX_REQUEST="true")
        assert done.status_code == 200, done.content
        assert b"already" not in done.content
        assert kernel.task(task_id).status == "pending"
        Scheduler(kernel).run_until_idle()  # the unknown channel fails it again
        assert kernel.task(task_id).outcome["kind"] == "failed"


def _operator(name: str) -> Client:
    from django.contrib.auth.models import Group, User

    user = User.objects.create_user(name, password="pw")
    user.groups.add(Group.objects.get_or_create(name="operator")[0])
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    client.get("/")  # its CSRF cookie
    return client


def test_every_page_says_its_content_security_policy() -> None:
    from controlplane.web.middleware import ContentSecurityPolicy

    operator = login("operator")
    for path in ("/", "/tasks/", "/attention/", "/workers/", "/accounts/login/",
                 "/api/sessions", "/admin/login/"):
        policy = operator.get(path)["Content-Security-Policy"]
        assert policy == ContentSecurityPolicy.POLICY, path
        assert "script-src 'self';" in policy and "unsafe" not in policy
        assert "frame-ancestors 'none'" in policy
    docs = operator.get("/api/docs")["Content-Security-Policy"]
    assert "style-src 'self' 'unsafe-inline'" in docs and "script-src 'self';" in docs
    page = operator.get("/").content.decode()
    assert "<script>" not in page and " style=" not in page  # nothing inline to allow
    assert '"includeIndicatorStyles": false' in page


def test_the_readiness_probe_reuses_its_answer_and_names_no_migration(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from controlplane.web import health

    asked: list[int] = []
    real = health._readiness
    monkeypatch.setattr(health, "_readiness", lambda: asked.append(1) or real())
    monkeypatch.setattr(health, "_last", None)
    for _ in range(20):
        assert Client().get("/readyz").status_code == 200
    assert len(asked) == 1  # one check, then its answer for READINESS_SECONDS
    monkeypatch.setattr(health, "_last", None)
    monkeypatch.setattr(health, "_migrated", False)
    monkeypatch.setattr(health, "unapplied_migrations",
                        lambda alias="default": ["controlplane.0099_next"])
    answer = Client().get("/readyz")
    assert answer.status_code == 503
    assert answer.json()["missing"] == {"migrations": "1 not applied"}
    assert "controlplane.0099_next" in caplog.text


def test_the_api_schema_is_built_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    from ninja import NinjaAPI

    from controlplane.api import api

    built: list[int] = []
    real = NinjaAPI.get_openapi_schema

    def counting(self: NinjaAPI, **kwargs: object) -> object:
        built.append(1)
        return real(self, **kwargs)

    monkeypatch.setattr(NinjaAPI, "get_openapi_schema", counting)
    api.forget_schema()
    first = Client().get("/api/openapi.json").json()
    for _ in range(5):
        assert Client().get("/api/openapi.json").json() == first
    assert len(built) == 1


def test_a_form_field_carrying_nul_is_refused_naming_it_and_changes_nothing() -> None:
    """Postgres text cannot hold NUL: a form's field with one (a tampered hidden action
    id, a pasted name) is refused at the edge (422 naming the field), not answered with
    a server error from inside the database."""
    (task_id,) = failed_batches(1)
    kernel = runtime().kernel
    head = kernel.storage.session(kernel.task(task_id).session_id).head_seq
    client = _operator("olga")
    refused = client.post(f"/tasks/{task_id}/retry",
                          {"action_id": "form\x00retry", "reason": "provider back",
                           "expected_seq": kernel.task(task_id).updated_seq},
                          HTTP_X_CSRFTOKEN=client.cookies["csrftoken"].value,
                          HTTP_HX_REQUEST="true")
    assert refused.status_code == 422, refused.content
    assert b"action_id" in refused.content and b"NUL" in refused.content
    assert kernel.task(task_id).outcome["kind"] == "failed"
    assert kernel.storage.session(kernel.task(task_id).session_id).head_seq == head
    login_page = Client().post("/accounts/login/", {"username": "olga\x00", "password": "pw"})
    assert login_page.status_code == 422, login_page.content
    assert b"username" in login_page.content


def test_a_retry_form_of_a_task_changed_since_the_page_is_refused_and_changes_nothing() -> None:
    """Another operator retried it and it failed again: a second retry from the page
    that showed the first failure would repeat its side effects."""
    (task_id,) = failed_batches(1)
    kernel = runtime().kernel
    seen = kernel.task(task_id).updated_seq
    client = _operator("olga")
    token = client.cookies["csrftoken"].value

    def retry(**fields: object) -> Any:
        return client.post(f"/tasks/{task_id}/retry",
                           {"action_id": f"r-{len(fields)}-{seen}", "reason": "again", **fields},
                           HTTP_X_CSRFTOKEN=token, HTTP_HX_REQUEST="true")

    page = client.get(f"/tasks/{task_id}/").content.decode()
    assert f'name="expected_seq" value="{seen}"' in page  # what the retry form sends
    missing = retry()
    assert missing.status_code == 422 and b"expected_seq" in missing.content
    from controlplane import commands

    commands.retry_task(user("omar", "operator"), task_id, "by-omar", "provider back", seen)
    Scheduler(kernel).run_until_idle()  # it fails again
    head = kernel.storage.session(kernel.task(task_id).session_id).head_seq
    stale = retry(expected_seq=seen)
    assert stale.status_code == 409 and b"look again" in stale.content, stale.content
    assert kernel.storage.session(kernel.task(task_id).session_id).head_seq == head
