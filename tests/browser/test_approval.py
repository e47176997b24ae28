"""The approval gate in a real browser, against real workers: the demo assistant's
``send_notices`` call (gated here above one recipient) appears live on the session page
and on Needs attention, an operator approves it from the page with a reason, the worker
sends each notice once, and the tool's card says who approved it."""

from __future__ import annotations

from typing import Any

import pytest

from tests.chaos.harness import Stack
from tests.e2e.server import Daphne

from .conftest import logged_in

pytestmark = [pytest.mark.slow, pytest.mark.browser]
RECIPIENTS = ["ana@example.com", "ben@example.com"]
REQUEST = f"Send the approved notice to {RECIPIENTS[0]} and {RECIPIENTS[1]}, then summarise."


def test_a_pending_approval_appears_live_and_is_approved_from_the_page(
    stack: Stack, web: Daphne, browser: Any
) -> None:
    session_id, _, submission = stack.converse(REQUEST, model="scripted")
    page = logged_in(browser, web, "olga", "operator")
    page.goto(f"{web.http}/sessions/{session_id}/")
    page.wait_for_selector("#conn-state.conn-live")
    attention = page.context.new_page()
    attention.goto(f"{web.http}/attention/")
    attention.wait_for_selector("#conn-state.conn-live")
    assert attention.locator(".pending-approval").count() == 0

    stack.worker("w1", NOTICE_APPROVAL_ABOVE="1")
    stack.beat()
    card = page.locator("#call-call_send_notices_0")
    page.wait_for_selector("#call-call_send_notices_0[data-state=approval]", timeout=60_000)
    assert "2 recipients, more than 1" in card.inner_text()
    attention.wait_for_selector(".pending-approval", timeout=60_000)  # pushed live there too
    assert "send_notices" in attention.locator(".pending-approval").inner_text()
    assert stack.posts(RECIPIENTS[0]) == []  # nothing sent while it waits

    card.locator("input[name=reason]").fill("both asked for it")
    card.locator("button[value=approve]").click()
    page.wait_for_selector("#action-result:has-text('approve done')")
    page.wait_for_selector("#call-call_send_notices_0[data-state=succeeded]", timeout=60_000)
    decided = card.locator(".approval-decided").inner_text()
    assert "Approved by user:olga" in decided and "both asked for it" in decided
    stack.wait_answered(submission.id)
    assert [len(stack.posts(to)) for to in RECIPIENTS] == [1, 1]
    attention.wait_for_selector(".pending-approval", state="detached", timeout=30_000)
