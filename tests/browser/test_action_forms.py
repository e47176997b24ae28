"""Action forms in a real browser: an action id names one use of a form (issue 11,
point 9). The "retry all N failed" form used again after the tasks failed again retries
them again; it is not answered as a repeat of its first use while nothing runs."""

from __future__ import annotations

import re
from typing import Any

import pytest

from controlplane import models
from kernel import Task
from kernel.commit import operations_log_id
from tests.chaos.harness import Stack, wait_for
from tests.e2e.server import Daphne

from .conftest import logged_in

pytestmark = [pytest.mark.slow, pytest.mark.browser]


def failed(task: Task, times: int) -> bool:
    retried = len(task.checkpoint.get("_retried", []))
    return task.terminal and task.outcome["kind"] == "failed" and retried == times - 1


def retry_all(page: Any) -> str:
    page.evaluate("document.getElementById('action-result').innerHTML = ''")
    form = page.locator("#retry-failed")
    form.locator("summary").click()
    form.get_by_label("Why retry them all?").fill("the channel is fixed")
    form.get_by_role("button", name=re.compile("Confirm retry of")).click()
    page.wait_for_selector("#action-result .ok")
    return str(page.locator("#action-result").inner_text())


def test_retry_all_used_again_after_they_failed_again_retries_them_again(
    stack: Stack, web: Daphne, browser: Any
) -> None:
    stack.worker("w1")
    stack.beat()
    batches = [stack.send_batch(["a@example.com"], channel="pigeon") for _ in range(2)]
    wait_for(lambda: all(failed(stack.task(b), 1) for _, b in batches), "both to fail")

    page = logged_in(browser, web, "olga", "operator")
    page.goto(f"{web.http}/attention/")
    page.wait_for_selector("#retry-failed summary:has-text('Retry all 2 failed')")
    first_id = page.locator("#retry-failed input[name=action_id]").get_attribute("value")
    assert "retry: 2 of 2 done" in retry_all(page)
    page.wait_for_function(  # used once: the form has another id now, or a fresh render
        "id => [...document.querySelectorAll('#retry-failed input[name=action_id]')]"
        ".every(e => e.value !== id)", arg=first_id)

    wait_for(lambda: all(failed(stack.task(b), 2) for _, b in batches), "both to fail again")
    page.wait_for_selector("#retry-failed summary:has-text('Retry all 2 failed')")
    second = retry_all(page)
    assert "retry: 2 of 2 done" in second and "nothing ran again" not in second
    wait_for(lambda: all(failed(stack.task(b), 3) for _, b in batches), "a third failure")
    for session_id, _ in batches:
        retries = models.Entry.objects.filter(
            conversation_id=operations_log_id(session_id), kind="retry")
        assert len({e.payload["action_id"] for e in retries}) == 2
