"""manage.py send_notices / tasks / sweep, as an operator uses them."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command

from controlplane.worker.runtime import runtime
from kernel import Draft

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def offline_broker(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record deliveries instead of sending them: these tests run no worker."""
    delivered: list[str] = []
    monkeypatch.setattr(runtime().dispatcher, "deliver", lambda task, queue: delivered.append(task))
    return delivered


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_send_notices_starts_a_batch_and_refuses_bad_addresses(offline_broker) -> None:
    out = run("send_notices", "a@example.com", "b@example.com", "--actor", "user:ann")
    task_id = out.split("task ")[1].strip()
    task = runtime().kernel.task(task_id)
    assert (task.kind, task.status, task.input["recipients"]) == (
        "send-batch",
        "pending",
        ["a@example.com", "b@example.com"],
    )
    assert offline_broker == [task_id]
    with pytest.raises(CommandError, match="not email addresses: 'nope'"):
        run("send_notices", "nope")


def test_send_notices_refuses_addresses_with_spaces_or_control_characters(offline_broker
                                                                          ) -> None:
    from controlplane.models import Commit, Task

    bad = ["a b@example.com", "c\n@example.com", "d@exa\x07mple.com", "@example.com",
           '"e\x07"@example.com']
    with pytest.raises(CommandError) as refused:
        run("send_notices", "ok@example.com", *bad)
    message = str(refused.value)
    assert message.startswith("not email addresses: ") and "\n" not in message
    assert all(repr(address) in message for address in bad), message
    assert "ok@example.com" not in message
    assert not Task.objects.exists() and not Commit.objects.exists()
    assert offline_broker == []


def test_tasks_lists_what_is_stuck_and_shows_one_history() -> None:
    kernel = runtime().kernel
    task_id = a_notice()
    assert run("tasks") == "nothing stuck\n"
    now = kernel.clock.now()
    kernel.storage.claim(
        task_id, "gone-worker", now - timedelta(seconds=60), now - timedelta(seconds=30)
    )
    listing = run("tasks")
    assert task_id in listing and "lease of gone-worker expired" in listing
    detail = run("tasks", task_id)
    assert "status running, phase send" in detail and "user:ann" in detail
    assert ", run 0, " in detail  # what a cancel names (expected_run)
    assert "#1" in detail
    with pytest.raises(CommandError, match="no task task_nope"):
        run("tasks", "task_nope")


def test_sweep_delivers_expired_leases(offline_broker) -> None:
    kernel = runtime().kernel
    handle = kernel.create_session()
    draft = Draft()
    task_id = draft.create_task(
        "send-notice", {"plan": "p", "to": "x@example.com", "operation_id": "op_1"}
    )
    handle.commit(draft)
    now = kernel.clock.now()
    kernel.storage.claim(
        task_id, "gone-worker", now - timedelta(seconds=60), now - timedelta(seconds=30)
    )
    offline_broker.clear()
    assert run("sweep") == "delivered 1, failed 0\n"
    assert offline_broker == [task_id]


def test_api_token_is_shown_once_and_works() -> None:
    from django.contrib.auth.models import Group, User
    from django.test import Client

    account = User.objects.create_user("bot")
    with pytest.raises(CommandError, match="has no role"):
        run("api_token", "bot")
    account.groups.add(Group.objects.get_or_create(name="viewer")[0])
    key = run("api_token", "bot", "--name", "ci").strip()
    assert Client().get("/api/sessions", HTTP_AUTHORIZATION=f"Bearer {key}").status_code == 200
    with pytest.raises(CommandError, match="no user 'ghost'"):
        run("api_token", "ghost")


@pytest.mark.parametrize("seconds", ["nan", "inf", "-5", "1e12"])
def test_tasks_refuses_an_older_than_that_is_not_a_sensible_number_of_seconds(
    seconds: str,
) -> None:
    with pytest.raises(CommandError, match="--older-than must be"):
        run("tasks", "--older-than", seconds)


def test_api_token_revoke_with_an_unknown_id_revokes_none_of_them() -> None:
    from django.contrib.auth.models import Group, User

    from controlplane.models import ApiToken

    account = User.objects.create_user("bot")
    account.groups.add(Group.objects.get_or_create(name="viewer")[0])
    run("api_token", "bot", "--name", "ci")
    [token] = ApiToken.objects.all()
    with pytest.raises(CommandError, match="no token 987654"):
        run("api_token", "--revoke", str(token.pk), "987654")
    token.refresh_from_db()
    assert token.revoked_at is None
    assert "revoked" in run("api_token", "--revoke", str(token.pk))


def test_send_notices_commits_as_the_shell_user_who_ran_it() -> None:
    from controlplane.access import shell_actor

    out = run("send_notices", "a@example.com")
    session_id = out.split("session ")[1].split()[0]
    [commit] = runtime().kernel.storage.commits_after(session_id, 0, 10)
    assert commit.actor == shell_actor()


def test_every_argument_of_every_command_says_what_it_is_in_help() -> None:
    from pathlib import Path

    from django.core.management import BaseCommand, load_command_class

    import controlplane.management.commands as ours

    django_own = {a.dest for a in BaseCommand().create_parser("manage.py", "x")._actions}
    names = sorted(p.stem for p in Path(ours.__file__).parent.glob("*.py")
                   if not p.stem.startswith("_"))
    silent = [
        f"{name} {action.dest}"
        for name in names
        for action in load_command_class("controlplane", name).create_parser(
            "manage.py", name)._actions
        if action.dest not in django_own and not action.help
    ]
    assert silent == []


def a_notice() -> str:
    """A notice task committed to a new session, not run."""
    draft = Draft(actor="user:ann")
    task_id = draft.create_task(
        "send-notice", {"plan": "p", "to": "x@example.com", "operation_id": "op_1"}
    )
    runtime().kernel.create_session().commit(draft)
    return task_id


def test_tasks_lists_a_blocked_task_at_once_as_the_dashboard_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kernel import Registry

    kernel = runtime().kernel
    task_id = a_notice()
    assert run("tasks") == "nothing stuck\n"
    monkeypatch.setattr(kernel, "registry", Registry())  # a deploy that lost the definition
    listing = run("tasks")
    assert task_id in listing and "blocked: no definition registered" in listing


def test_api_token_list_of_an_unknown_user_says_there_is_no_such_user() -> None:
    with pytest.raises(CommandError, match="no user 'ghost'"):
        run("api_token", "--list", "ghost")


def test_tasks_judges_expired_leases_by_the_database_clock_not_the_shells(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from types import SimpleNamespace

    from django.utils import timezone

    from controlplane.management.commands import tasks as command

    kernel = runtime().kernel
    task_id = a_notice()
    now = kernel.clock.now()
    kernel.storage.claim(task_id, "gone-worker", now - timedelta(seconds=30),
                         now - timedelta(seconds=5))
    behind = SimpleNamespace(now=lambda: timezone.now() - timedelta(minutes=1))
    monkeypatch.setattr(command, "timezone", behind, raising=False)  # this machine lags
    assert "lease of gone-worker expired" in run("tasks")


UNDECODED = "jos\udce9"
"""``josé`` typed in a Latin-1 shell: Python keeps the byte its UTF-8 locale could not
decode as a lone surrogate, which no database text holds."""


@pytest.mark.parametrize(("args", "named"), [
    (["api_token", UNDECODED], "username"),
    (["api_token", "bot", "--name", UNDECODED], "name"),
    (["api_token", "--list", UNDECODED], "username"),
    (["role", UNDECODED, "viewer"], "username"),
    (["tasks", UNDECODED], "task_id"),
    (["send_notices", "a@example.com", "--subject", UNDECODED], "subject"),
    (["send_notices", "a@example.com", "--session", UNDECODED], "session"),
    (["send_notices", "a@example.com", "--actor", UNDECODED], "actor"),
])
def test_an_argument_the_database_cannot_hold_is_refused_in_one_line_naming_it(
    args: list[str], named: str, offline_broker: list[str],
) -> None:
    """An argument the shell's locale did not decode (or one holding NUL) is refused
    before the command runs, in one line naming it, instead of a traceback from the
    database driver; nothing is written."""
    from django.contrib.auth.models import Group, User

    from controlplane.models import ApiToken, Commit, Task

    User.objects.create_user("bot").groups.add(Group.objects.get_or_create(name="viewer")[0])
    with pytest.raises(CommandError) as refused:
        run(*args)
    message = str(refused.value)
    assert message.startswith(f"{named}: ") and "\n" not in message, message
    assert not ApiToken.objects.exists() and not Task.objects.exists()
    assert not Commit.objects.exists() and offline_broker == []
