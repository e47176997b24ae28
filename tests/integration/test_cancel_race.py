"""A cancel that loses the race to its task's own ending: the operator's request read the
task while it still ran, the task ended before the cancel was committed. The cancel is
refused (409 "already ended") and nothing is recorded: no operations-log entry says
"cancel" for a task nothing cancelled, through the API and through a bulk cancel."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from controlplane import models
from controlplane.reads import tasks as task_reads
from kernel import Draft, Kernel, Scheduler
from kernel.commit import operations_log_id

from .api_kinds import start
from .clients import post

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("kernel")]


def end_after_it_is_read(
    monkeypatch: pytest.MonkeyPatch, kernel: Kernel, task_id: str, read_name: str
) -> dict[str, Any]:
    """The command's read of ``task_id`` (``reads.tasks.<read_name>``) sees it sleeping;
    right after that read the task is woken and runs to its end (the worker's commit
    lands first)."""
    read = getattr(task_reads, read_name)
    ended: dict[str, Any] = {}

    def read_then_end(*args: Any) -> Any:
        seen = read(*args)
        if not ended:
            session_id = kernel.task(task_id).session_id
            wake = Draft(actor="user:test")
            wake.wake(task_id)
            kernel.open(session_id).commit(wake)
            Scheduler(kernel).run_until_idle()
            ended["head"] = kernel.storage.session(session_id).head_seq
        return seen

    monkeypatch.setattr(task_reads, read_name, read_then_end)
    return ended


def cancels_logged(session_id: str) -> list[Any]:
    entries = models.Entry.objects.filter(conversation_id=operations_log_id(session_id))
    return list(entries.filter(kind="cancel").values_list("payload", flat=True))


def test_a_cancel_that_loses_the_race_to_the_ending_is_refused_and_logs_nothing(
    kernel: Kernel, operator: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    session_id, task_id = start(kernel, "api-step", {"sleep": True})
    ended = end_after_it_is_read(monkeypatch, kernel, task_id, "record")
    answer = post(operator, f"/api/tasks/{task_id}/cancel",
                  {"action_id": "c1", "reason": "r", "expected_run": 0})
    assert answer.status_code == 409, answer.content
    assert f"task {task_id} already ended succeeded" in answer.json()["detail"]
    task = kernel.task(task_id)
    assert task.outcome["kind"] == "succeeded" and task.cancel is None
    assert kernel.storage.session(session_id).head_seq == ended["head"]  # nothing written
    assert cancels_logged(session_id) == []


def test_a_bulk_cancel_that_loses_the_race_says_so_for_that_task_and_logs_nothing(
    kernel: Kernel, operator: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    session_id, task_id = start(kernel, "api-step", {"sleep": True})
    filters = {"action": "cancel", "session_id": session_id}
    preview = post(operator, "/api/actions/bulk/preview", filters).json()
    assert preview["task_ids"] == [task_id]
    ended = end_after_it_is_read(monkeypatch, kernel, task_id, "find_ids")
    answer = post(operator, "/api/actions/bulk",
                  {**filters, **expected(preview), "action_id": "b1", "reason": "r"})
    assert answer.status_code == 200, answer.content
    [result] = answer.json()["results"]
    assert result["ok"] is False and "already ended" in result["detail"]
    assert kernel.task(task_id).cancel is None
    assert kernel.storage.session(session_id).head_seq == ended["head"]
    assert cancels_logged(session_id) == []


def expected(preview: dict[str, Any]) -> dict[str, Any]:
    """What an apply carries from its preview."""
    return {"expected_count": preview["count"], "expected_digest": preview["digest"]}
