"""Start again from a phase, in a real browser: on a batch's task page, "Start again from
here…" on its summarize row shows the preview (what stays, what runs again), the
operator confirms it with a reason through the form (CSRF and all), and the batch runs
its summary again without sending anything again (counted at the provider)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.chaos.harness import Stack, wait_for
from tests.e2e.server import Daphne

from .conftest import logged_in

pytestmark = [pytest.mark.slow, pytest.mark.browser]
RECIPIENTS = ["ana@example.com", "ben@example.com"]


def sent_batch(stack: Stack) -> str:
    """A batch a worker process sent to its end."""
    stack.worker("w1")
    stack.beat()
    _, batch = stack.send_batch(RECIPIENTS)
    assert stack.wait_terminal(batch).outcome["kind"] == "succeeded"
    return batch


def test_start_again_from_a_phase_with_the_preview_and_the_form(
    stack: Stack, web: Daphne, browser: Any
) -> None:
    batch = sent_batch(stack)
    assert [len(stack.posts(to)) for to in RECIPIENTS] == [1, 1]
    page = logged_in(browser, web, "olga", "operator")
    page.goto(f"{web.http}/tasks/{batch}/")
    rows = page.locator("tr.phase-row")
    assert rows.count() == 2
    summarize = page.locator("tr.phase-row[data-phase=summarize]")
    summarize.locator("a.restart").click()
    confirm = page.locator("#restart-confirm")
    confirm.wait_for()
    shown = confirm.inner_text()
    assert "Stays as committed: plan" in shown and "summarize" in shown
    before = stack.task(batch).updated_seq
    confirm.locator("input[name=reason]").fill("summarise it again")
    confirm.locator("button[type=submit]").click()
    page.wait_for_selector("#action-result:has-text('restart done')")
    again = wait_for(lambda: (t := stack.task(batch)).terminal and t.updated_seq > before
                     and t, "the batch to summarise again")
    assert again.outcome["kind"] == "succeeded" and again.phase == "summarize"
    assert again.checkpoint["_restarted"][0]["by"] == "user:olga"
    assert [len(stack.posts(to)) for to in RECIPIENTS] == [1, 1]  # nothing sent again

    # The same form again names a task that changed since: refused, nothing done.
    confirm.locator("button[type=submit]").click()
    page.wait_for_selector("#action-result:has-text('look again')")
