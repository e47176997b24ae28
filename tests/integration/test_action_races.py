"""An operator's action acts on what the operator saw, checked in its commit under the
session's lock: a change that lands between the command's read and its commit (another
operator's retry that failed again, a worker rewriting its environment report, another
compaction started, an entry appended to the conversation to compact) refuses the action
(409) and nothing is committed."""

from __future__ import annotations

import pytest
from django.test import Client

from controlplane import commands
from controlplane.commands import actions, sessions
from controlplane.errors import Conflict
from controlplane.reads import sessions as session_reads
from controlplane.worker.runtime import runtime
from kernel import Draft, Kernel, Scheduler, Status, agent
from kernel.environment import ENVIRONMENT

from .api_kinds import start
from .clients import client_as, login_as, post, user
from .environment_blocks import blocked_by, started
from .racing import both_read_first, decide_at_once, just_before
from .sessions import conversation_with_a_tool_call

pytestmark = pytest.mark.django_db(transaction=True)


def head(kernel: Kernel, session_id: str) -> int:
    return kernel.storage.session(session_id).head_seq


@pytest.mark.usefixtures("kernel")
def test_a_retry_of_a_task_retried_and_failed_again_since_the_read_is_refused(
    kernel: Kernel, operator: Client, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Omar's retry lands (and fails again) after Olga's retry read the task: hers would
    run the phase a third time, repeating its side effects."""
    session_id, task_id = start(kernel, "api-step", {"fail": True})
    seen = kernel.task(task_id).updated_seq

    def omar_retries_and_it_fails_again() -> int:
        commands.retry_task(user("omar", "operator"), task_id, "by-omar", "again", seen)
        Scheduler(kernel).run_until_idle()
        return head(kernel, session_id)

    landed = just_before(monkeypatch, actions, "commit_action", omar_retries_and_it_fails_again)
    answer = post(operator, f"/api/tasks/{task_id}/retry",
                  {"action_id": "by-olga", "reason": "go", "expected_seq": seen})
    assert answer.status_code == 409, answer.content
    assert "look again" in answer.json()["detail"]
    assert head(kernel, session_id) == landed[0]  # nothing committed after omar's
    failed = kernel.task(task_id)
    assert failed.status is Status.TERMINAL and len(failed.checkpoint["_retried"]) == 1


def migrated_to(kernel: Kernel, task_id: str) -> str:
    return str(kernel.task(task_id).checkpoint[ENVIRONMENT]["tool pay"])


def test_a_migrate_whose_report_a_worker_rewrote_after_the_read_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kernel, handle, task_id = started(monkeypatch)
    blocked_by(kernel, task_id, "w2", "2")
    olga = login_as("operator")
    seen = olga.get(f"/api/tasks/{task_id}").json()

    def w3_rewrites_the_report() -> int:
        blocked_by(kernel, task_id, "w3", "3")
        return head(kernel, handle.id)

    landed = just_before(monkeypatch, actions, "commit_action", w3_rewrites_the_report)
    answer = post(olga, f"/api/tasks/{task_id}/migrate", {
        "action_id": "m1", "reason": "schema 2 only adds a field",
        "expected_seq": seen["updated_seq"], "expected_report": seen["environment_report"]})
    assert answer.status_code == 409, answer.content
    assert "rewrote the environment report" in answer.json()["detail"]
    assert head(kernel, handle.id) == landed[0]
    assert kernel.task(task_id).updated_seq == seen["updated_seq"]
    assert migrated_to(kernel, task_id) == "1"


def test_a_restart_whose_report_a_worker_rewrote_after_the_read_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kernel, handle, task_id = started(monkeypatch)
    blocked_by(kernel, task_id, "w2", "2")
    olga = login_as("operator")
    seq = int(olga.get(f"/api/tasks/{task_id}/restarts").json()[0]["seq"])
    preview = olga.get(f"/api/tasks/{task_id}/restarts/{seq}").json()

    def w3_rewrites_the_report() -> int:
        blocked_by(kernel, task_id, "w3", "3")
        return head(kernel, handle.id)

    landed = just_before(monkeypatch, actions, "commit_action", w3_rewrites_the_report)
    answer = post(olga, f"/api/tasks/{task_id}/restart", {
        "action_id": "r1", "reason": "again", "seq": seq,
        "expected_seq": preview["expected_seq"], "expected_report": preview["expected_report"]})
    assert answer.status_code == 409, answer.content
    assert "rewrote the environment report" in answer.json()["detail"]
    assert head(kernel, handle.id) == landed[0]
    assert migrated_to(kernel, task_id) == "1"


def test_a_restart_when_no_worker_had_reported_is_refused_once_one_does_before_the_commit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The operator saw no report: a report written since would have the restart run
    under the environment recorded, which that worker says it does not offer."""
    kernel, handle, task_id = started(monkeypatch)
    olga = login_as("operator")
    seq = int(olga.get(f"/api/tasks/{task_id}/restarts").json()[0]["seq"])
    preview = olga.get(f"/api/tasks/{task_id}/restarts/{seq}").json()
    assert preview["expected_report"] is None

    def w2_reports() -> int:
        blocked_by(kernel, task_id, "w2", "2")
        return head(kernel, handle.id)

    landed = just_before(monkeypatch, actions, "commit_action", w2_reports)
    answer = post(olga, f"/api/tasks/{task_id}/restart", {
        "action_id": "r1", "reason": "again", "seq": seq,
        "expected_seq": preview["expected_seq"], "expected_report": None})
    assert answer.status_code == 409, answer.content
    assert head(kernel, handle.id) == landed[0]
    assert kernel.task(task_id).updated_seq == preview["expected_seq"]


def test_a_second_compaction_started_after_the_read_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two operators press compact in the same moment: both find none under way, and
    only the first compaction is committed."""
    session_id, conversation = conversation_with_a_tool_call()
    kernel = runtime().kernel
    seen = kernel.entries(conversation)[-1].id

    def omar_compacts() -> int:
        commands.compact_conversation(user("omar", "operator"), conversation, "c-omar",
                                      "long", seen)
        return head(kernel, session_id)

    landed = just_before(monkeypatch, sessions, "commit_action", omar_compacts)
    answer = post(client_as("olga", "operator"), f"/api/conversations/{conversation}/compact",
                  {"action_id": "c-olga", "reason": "long", "last_entry_id": seen})
    assert answer.status_code == 409, answer.content
    assert "another compaction" in answer.json()["detail"]
    assert head(kernel, session_id) == landed[0]
    compactions = [t for t in kernel.storage.session_tasks(session_id)
                   if t.kind == agent.COMPACTION]
    assert [t.input["by"] for t in compactions] == ["user:omar"]


def test_a_compaction_of_a_conversation_that_moved_on_after_the_read_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An entry lands between the command's check of the newest entry and its commit:
    the operator's summary would cover an entry they never saw, so the commit refuses it."""
    session_id, conversation = conversation_with_a_tool_call()
    kernel = runtime().kernel
    seen = kernel.entries(conversation)[-1].id

    def a_message_lands() -> int:
        draft = Draft(actor="agent:turn")
        draft.append(conversation, "user", {"text": "one more thing"})
        kernel.open(session_id).commit(draft)
        return head(kernel, session_id)

    landed = just_before(monkeypatch, sessions, "commit_action", a_message_lands)
    answer = post(client_as("olga", "operator"), f"/api/conversations/{conversation}/compact",
                  {"action_id": "c-olga", "reason": "long", "last_entry_id": seen})
    assert answer.status_code == 409, answer.content
    newer = kernel.entries(conversation)[-1].id
    assert f"the newest entry of {conversation} is {newer}, not {seen}" in (
        answer.json()["detail"])
    assert head(kernel, session_id) == landed[0]
    assert not [t for t in kernel.storage.session_tasks(session_id)
                if t.kind == agent.COMPACTION]


def test_of_two_compactions_asked_at_once_on_two_connections_one_is_committed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Both operators have found none under way before either commits."""
    session_id, conversation = conversation_with_a_tool_call()
    kernel = runtime().kernel
    seen = kernel.entries(conversation)[-1].id
    accounts = [user("olga", "operator"), user("omar", "operator")]
    both_read_first(monkeypatch, session_reads, "compaction_under_way")
    landed, refused = decide_at_once(lambda i: commands.compact_conversation(
        accounts[i], conversation, f"c-{i}", "long", seen))
    assert isinstance(refused, Conflict) and "another compaction" in str(refused)
    compactions = [t for t in kernel.storage.session_tasks(session_id)
                   if t.kind == agent.COMPACTION]
    winner = accounts[int(landed.action_id[-1])].username
    assert [t.input["by"] for t in compactions] == [f"user:{winner}"]
