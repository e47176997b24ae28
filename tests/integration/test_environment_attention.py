"""A task a worker left blocked because it does not offer the run's environment is on the
Needs attention page with the worker's reason, like a task no definition can run, until
it ends or changes (the report is then stale)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from controlplane.reads import pages, tasks
from kernel import Draft, Kernel
from kernel.environment import BLOCKED_DOCUMENT

from .clients import login
from .environment_blocks import blocked_by, started

pytestmark = pytest.mark.django_db(transaction=True)


def blocked_by_w2(kernel: Kernel, task_id: str) -> None:
    blocked_by(kernel, task_id, "w2", "2")


def test_an_environment_blocked_task_needs_attention_until_it_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kernel, handle, task_id = started(monkeypatch)
    assert all(t.id != task_id for t in pages.attention().blocked)

    blocked_by_w2(kernel, task_id)
    assert kernel.document(handle.id, BLOCKED_DOCUMENT, task_id)["differences"]

    (shown,) = [t for t in pages.attention().blocked if t.id == task_id]
    assert "worker w2 does not offer the environment" in shown.blocked
    assert "tool pay: 2 here, it was started with 1" in shown.blocked
    page = login("viewer").get("/attention/").content.decode()
    assert task_id in page and "tool pay: 2 here" in page

    # Once it ends (cancelled here) it is off the list.
    cancel = Draft(actor="user:ann")
    cancel.cancel(task_id, "not needed")
    handle.commit(cancel)
    assert all(t.id != task_id for t in pages.attention().blocked)


def test_a_blocked_task_stays_on_the_list_while_the_worker_that_reported_it_looks_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A late message for the task makes the worker that left it blocked claim it again
    for a moment (and give it back): the list must not lose it meanwhile. A worker that
    can run it takes it off the list while it holds it."""
    kernel, handle, task_id = started(monkeypatch)
    blocked_by_w2(kernel, task_id)

    def listed() -> bool:
        return any(t.id == task_id for t in pages.attention().blocked)

    def claimed_by(owner: str) -> None:
        now = kernel.clock.now()
        assert kernel.storage.claim(task_id, owner, now, now + timedelta(minutes=1))

    assert listed()
    claimed_by("w2")
    assert listed()
    assert "tool pay: 2 here" in (tasks.get(task_id).blocked or "")
    task = kernel.storage.task(task_id)
    assert task is not None
    assert kernel.storage.release(task_id, "w2", task.epoch, kernel.clock.now())
    claimed_by("w3")
    assert not listed()
    assert tasks.get(task_id).blocked is None
