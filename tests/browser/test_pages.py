"""The dashboard's pages in a real browser, against real workers: the agent demo's
transcript (a tool-call card, token totals), a task's timeline, and the accessibility
check (axe-core, vendored) of every page in light and dark mode.

``make screenshot`` sets ``UI_SCREENSHOTS`` to ``docs/screenshots/``: the accessibility
test then saves each page it checked, light and dark, there.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from controlplane import models
from controlplane.ui import urls as ui_urls
from controlplane.ui.live import GLOBAL_PAGES
from tests.chaos.harness import Stack
from tests.e2e.server import Daphne

from .accessibility import axe_violations
from .batches import send_batch
from .conftest import PASSWORD, account, logged_in

pytestmark = [pytest.mark.slow, pytest.mark.browser]
SCREENSHOTS = os.environ.get("UI_SCREENSHOTS")
NOT_PAGES = {"session_history", "children", "earlier_entries", "activity", "act",
             "act_on_submission", "act_on_conversation", "bulk_preview", "bulk_act", "retry_failed",
             "decide_call", "resume_graph", "start_graph", "fork_graph", "restart_preview",
             "restart", "migrate", "artifact"}
"""The dashboard's routes that are no page of their own: parts a page fetches again, the
actions a page posts (their confirmations and answers are checked on their pages), and
a download (an artifact)."""
REQUEST = "Send the approved notice to ana@example.com and ben@example.com, then summarise."


def agent_demo(stack: Stack) -> tuple[str, str, str]:
    """The demo assistant (the scripted model of controlplane.reference.assistant) asked to send
    notices: it calls ``send_notices``, a real worker runs the batch against the local
    provider, and the model summarises. Returns (session, conversation, submission)."""
    session_id, conversation, submission = stack.converse(REQUEST, model="scripted")
    return session_id, conversation, submission.id


def test_the_agent_demo_shows_a_tool_call_card_and_the_token_totals(
    stack: Stack, web: Daphne, browser: Any
) -> None:
    session_id, conversation, submission_id = agent_demo(stack)
    page = logged_in(browser, web, "vera", "viewer")
    page.goto(f"{web.http}/sessions/{session_id}/")
    page.wait_for_selector("#conn-state.conn-live")
    assert page.locator(f"#submission-{submission_id}").get_attribute("data-status") in (
        "placed", "queued")
    stack.worker("w1")
    stack.beat()

    card = page.locator("#call-call_send_notices_0")
    card.wait_for(timeout=60_000)
    page.wait_for_selector("#call-call_send_notices_0[data-state=succeeded]", timeout=60_000)
    page.wait_for_selector(f"#submission-{submission_id}[data-status=answered]")
    assert card.locator(".tool-name").inner_text() == "send_notices"
    arguments = card.locator("pre.arguments").inner_text()
    assert json.loads(arguments)["recipients"] == ["ana@example.com", "ben@example.com"]
    assert '\n  "recipients": [\n    "ana@example.com",' in arguments  # formatted, not a repr
    result = json.loads(card.locator("pre.result").inner_text())
    assert result["sent"] == 2 and set(result["receipts"]) == {"ana@example.com",
                                                               "ben@example.com"}
    assert "replay unsafe" in card.inner_text()
    assert re.search(r"\d+(\.\d)? (ms|s)", card.locator(".duration").inner_text())

    total = page.locator("#transcript .usage-total").first
    assert (total.get_attribute("data-input"), total.get_attribute("data-output")) == (
        "70", "30")  # the scripted model's two calls: 30 + 40 in, 10 + 20 out
    assert "70 in" in total.inner_text() and "30 out" in total.inner_text()
    answer = page.locator("#transcript .kind-model .markdown").last.inner_text()
    assert answer.startswith("Sent 2 notices.")
    assert page.locator("#transcript .kind-user .said").first.inner_text() == REQUEST
    assert page.locator(f"#submission-{submission_id} .said").inner_text() == REQUEST
    # Nothing is left in the live output once the turn has ended.
    page.wait_for_function("!document.querySelector('#progress figure')")
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")


def test_a_task_page_shows_a_row_per_phase_that_add_up_to_its_span(
    stack: Stack, web: Daphne, browser: Any
) -> None:
    call_command("demo", url=f"{web.http}/", force=True)  # the five-email batch
    session = models.Session.objects.get()
    (batch,) = models.Task.objects.filter(session=session, kind="send-batch")
    stack.worker("w1")
    stack.beat()
    stack.wait_terminal(batch.id)
    phases = [phase for _, phase in stack.history(batch.id)]
    contiguous = [p for i, p in enumerate(phases) if i == 0 or phases[i - 1] != p]

    page = logged_in(browser, web, "vera", "viewer")
    page.goto(f"{web.http}/tasks/{batch.id}/")
    rows = page.locator("table.waterfall tr.phase-row")
    shown = [rows.nth(i).get_attribute("data-phase") for i in range(rows.count())]
    assert shown == contiguous, (shown, phases)
    durations = [float(rows.nth(i).get_attribute("data-seconds") or 0)
                 for i in range(rows.count())]
    span = float(page.locator(".span-seconds").get_attribute("data-seconds") or 0)
    assert span > 0 and sum(durations) == pytest.approx(span, abs=1e-5)
    assert "waits on 5 tasks" in page.locator("table.waterfall").inner_text()
    assert page.locator("table.waterfall .holders code").count() >= len(shown) - 1
    # Times are relative, with the absolute time on hover.
    created = page.locator("dl.facts time[data-ago]").first
    assert re.fullmatch(r"(\d+ (s|min) ago|just now)", created.inner_text())
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} UTC",
                        created.get_attribute("title") or "")
    page.keyboard.press("Tab")  # keyboard: the skip link comes first, and shows its focus
    assert page.evaluate("document.activeElement.className") == "skip"


def test_every_page_passes_the_accessibility_check_in_light_and_dark_mode(
    stack: Stack, web: Daphne, browser: Any, tmp_path: Path
) -> None:
    call_command("demo", url=f"{web.http}/", force=True)
    batch_session = models.Session.objects.get()
    (batch,) = models.Task.objects.filter(session=batch_session, kind="send-batch")
    session_id, _, submission_id = agent_demo(stack)
    # One that fails (no such channel): the attention list and its chart have a row.
    failing = send_batch("Notice by pigeon", "pigeon")
    stack.worker("w1")
    stack.beat()
    stack.wait_terminal(batch.id)
    stack.wait_terminal(failing)
    stack.wait_answered(submission_id)
    turn = models.Task.objects.filter(session_id=session_id, kind="agent-turn").first()
    assert turn is not None
    paths = {
        "login": "/accounts/login/",
        "session-batch": f"/sessions/{batch_session.id}/",
        "session-agent": f"/sessions/{session_id}/",
        "task-batch": f"/tasks/{batch.id}/",
        "task-turn": f"/tasks/{turn.id}/",
        "workers": "/workers/",
        **{name: f"/{page.path}" for name, page in GLOBAL_PAGES.items()},
    }
    # Every page the dashboard routes is here (so `make screenshot` shows it too).
    shown = {"session", "task", "workers", *GLOBAL_PAGES}
    assert {p.name for p in ui_urls.urlpatterns} - NOT_PAGES == shown
    account("olga", "operator")
    shots = Path(SCREENSHOTS) if SCREENSHOTS else tmp_path
    shots.mkdir(parents=True, exist_ok=True)
    failures = {}
    for scheme in ("light", "dark"):
        # axe is injected inline, which the pages' policy refuses (test_security.py).
        context = browser.new_context(viewport={"width": 1280, "height": 900},
                                      color_scheme=scheme, bypass_csp=True)
        page = context.new_page()
        page.set_default_timeout(30_000)
        for name, path in paths.items():
            if name != "login" and "/accounts/login/" in page.url:
                page.get_by_label("Username").fill("olga")
                page.get_by_label("Password").fill(PASSWORD)
                page.get_by_role("button", name="Log in").click()
                page.wait_for_url(f"{web.http}/")
            page.goto(f"{web.http}{path}")
            if page.locator("#conn-state").count():
                page.wait_for_selector("#conn-state.conn-live")
            page.wait_for_load_state("load")
            found = axe_violations(page)
            if found:
                failures[f"{name} ({scheme})"] = found
            page.screenshot(path=str(shots / f"{name}-{scheme}.png"), full_page=True)
        context.close()
    assert not failures, json.dumps(failures, indent=2)
