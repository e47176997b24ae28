"""The dashboard in a real browser: live trees, reconnects, operator actions, escaping.

Each test drives chromium against a real Daphne and real Celery worker and beat
processes; every wait is a poll with a timeout on what the page shows.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from controlplane import models
from controlplane.worker.runtime import runtime
from kernel import Draft, Status
from tests.chaos.harness import Stack
from tests.chaos.uncertain_smtp import FOURTH, uncertain_email_4
from tests.e2e.server import Daphne

from .conftest import logged_in

pytestmark = [pytest.mark.slow, pytest.mark.browser]
# The end state's picture in docs/ is refreshed on request (`make screenshot`), so that
# a test run leaves the checkout as it found it.
SCREENSHOT = os.environ.get("UI_SCREENSHOT")


def rows(page: Any) -> list[tuple[str, str]]:
    """(task id, shown status) of every task row on the page, in page order."""
    return [tuple(r) for r in page.eval_on_selector_all(
        ".task-row", "els => els.map(e => [e.id.slice(5), e.dataset.status])")]


def statuses(page: Any) -> list[str]:
    return [status for _, status in rows(page)]


def wait_rows(page: Any, status: str, count: int, timeout: float = 60) -> None:
    from playwright.sync_api import TimeoutError as Timeout

    try:
        page.wait_for_function(
            f"document.querySelectorAll('.task-row[data-status={status}]').length >= {count}",
            timeout=timeout * 1000)
    except Timeout:
        raise AssertionError(f"rows now: {rows(page)}; state: "
                             f"{page.locator('#connection').inner_text()}") from None


def test_the_demo_batch_goes_from_pending_to_succeeded_live(
    stack: Stack, web: Daphne, browser: Any, tmp_path: Path
) -> None:
    call_command("demo", url=f"{web.http}/", force=True)  # the accounts and the five-email batch
    session = models.Session.objects.get()
    page = logged_in(browser, web, "operator", "operator")
    page.goto(f"{web.http}/sessions/{session.id}/")
    page.wait_for_selector("#conn-state.conn-live")
    assert statuses(page) == ["pending"]
    page.evaluate("window.__sameDocument = true")

    stack.worker("w1")
    stack.beat()
    wait_rows(page, "succeeded", 6)

    assert page.evaluate("window.__sameDocument") is True  # no reload happened
    assert statuses(page) == ["succeeded"] * 6
    sent = page.locator("#plans .state-sent")
    assert sent.count() == 5
    head = runtime().kernel.storage.session(session.id).head_seq
    page.wait_for_function(f"document.getElementById('feed-state').dataset.seq == '{head}'")
    assert page.locator("#feed-state").inner_text() == f"caught up to seq {head}"
    shot = Path(SCREENSHOT) if SCREENSHOT else tmp_path / "ui-session.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000  # a rendered page, not an empty canvas


def test_a_killed_web_server_is_caught_up_with_after_restart(
    stack: Stack, web: Daphne, browser: Any
) -> None:
    recipients = [f"r{i:02d}@example.com" for i in range(12)]
    stack.admin.set_faults(latency_ms=250)
    session_id, batch_id = stack.send_batch(recipients)
    page = logged_in(browser, web, "olga", "viewer")
    page.goto(f"{web.http}/sessions/{session_id}/")
    page.wait_for_selector("#conn-state.conn-live")
    stack.worker("w1")
    stack.beat()
    wait_rows(page, "succeeded", 2)

    web.kill()  # SIGKILL, mid-run: no close frame reaches the browser
    page.wait_for_selector("#conn-state.conn-reconnecting", timeout=10_000)
    assert page.locator("#conn-state").inner_text() == "reconnecting"
    web.start()  # the same port
    page.wait_for_selector("#conn-state.conn-live", timeout=30_000)

    stack.wait_terminal(batch_id, timeout=60)
    head = runtime().kernel.storage.session(session_id).head_seq
    page.wait_for_function(f"document.getElementById('feed-state').dataset.seq == '{head}'",
                           timeout=30_000)
    shown = rows(page)
    ids = [task_id for task_id, _ in shown]
    assert len(ids) == len(set(ids)) == len(recipients) + 1  # none missing, none twice
    assert set(ids) == {t.id for t in stack.tasks(session_id)}
    assert {status for _, status in shown} == {"succeeded"}
    assert page.locator("#plans .state-sent").count() == len(recipients)


def test_an_operator_cancels_a_running_batch_from_the_page(
    stack: Stack, web: Daphne, browser: Any
) -> None:
    recipients = [f"r{i:02d}@example.com" for i in range(20)]
    stack.admin.set_faults(latency_ms=300)
    stack.worker("w1")
    stack.beat()
    session_id, batch_id = stack.send_batch(recipients)
    page = logged_in(browser, web, "olga", "operator")
    page.goto(f"{web.http}/sessions/{session_id}/")
    wait_rows(page, "succeeded", 2)

    row = page.locator(f"#task-{batch_id}")
    row.get_by_text("Cancel…").click()
    row.get_by_label(re.compile("Why cancel")).fill("wrong recipients")
    row.get_by_role("button", name="Confirm cancel").click()
    page.wait_for_selector("#action-result .ok")
    page.wait_for_selector(f"#task-{batch_id}[data-status=cancelled]", timeout=60_000)

    batch = stack.wait_terminal(batch_id)
    assert batch.outcome["result"] == {"by": "user:olga", "reason": "wrong recipients"}
    shown = dict(rows(page))
    page.wait_for_function(
        "[...document.querySelectorAll('.task-row')].every(e => "
        "['succeeded', 'cancelled'].includes(e.dataset.status))")
    assert 2 <= list(shown.values()).count("succeeded") < len(recipients)


def test_on_a_phone_an_operator_cancels_with_the_keyboard_alone(
    stack: Stack, web: Daphne, browser: Any
) -> None:
    """Nothing runs the batch (no worker): the page must fit a phone's width, and the
    action must work without a pointer - focus, Enter to open, type, Enter to confirm."""
    session_id, batch_id = stack.send_batch(["ana@example.com", "ben@example.com"])
    page = logged_in(browser, web, "olga", "operator", viewport=(390, 844))
    page.goto(f"{web.http}/sessions/{session_id}/")
    page.wait_for_selector(f"#task-{batch_id}[data-status=pending]")
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")

    page.locator(f"#cancel-{batch_id} summary").focus()
    page.keyboard.press("Enter")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.name") == "reason"
    page.keyboard.type("sent by mistake")
    page.keyboard.press("Enter")
    page.wait_for_selector("#action-result .ok")
    # No worker runs its cancel handler: the intent is durable and shown, live.
    page.wait_for_selector(f"#task-{batch_id} .cancelling")
    assert "cancel requested by user:olga" in page.locator(f"#task-{batch_id}").inner_text()
    assert page.locator(f"#cancel-{batch_id}").count() == 0
    assert stack.task(batch_id).cancel["reason"] == "sent by mistake"


def test_an_operator_resolves_an_uncertain_smtp_email_and_a_viewer_cannot(
    stack: Stack, smtp: Any, web: Daphne, browser: Any  # noqa: F811
) -> None:
    session_id, batch_id, notice = uncertain_email_4(stack, smtp)

    viewer = logged_in(browser, web, "vera", "viewer")
    viewer.goto(f"{web.http}/attention/")
    viewer.wait_for_selector(f"#attn-{notice.id}")
    assert viewer.locator(f"#attn-{notice.id}").get_by_text("Resolve…").count() == 0
    assert viewer.get_by_text("Cancel…").count() == 0
    csrf = next(c["value"] for c in viewer.context.cookies() if c["name"] == "csrftoken")
    for action in ("resolve", "cancel"):
        answer = viewer.request.post(
            f"{web.http}/tasks/{notice.id}/{action}", headers={"X-CSRFToken": csrf},
            form={"reason": "I may not", "decision": "sent", "action_id": f"v-{action}"})
        assert answer.status == 403, (action, answer.text())
    assert stack.task(notice.id).status is Status.WAITING  # nothing changed
    assert stack.task(notice.id).cancel is None

    page = logged_in(browser, web, "olga", "operator")
    page.goto(f"{web.http}/attention/")
    item = page.locator(f"#attn-{notice.id}")
    item.get_by_text("Resolve…").click()
    item.get_by_label("It was sent").check()
    item.get_by_label("Why?").fill("the SMTP log shows it delivered")
    item.get_by_role("button", name="Confirm resolution").click()
    page.wait_for_selector("#action-result .ok")
    page.wait_for_selector(f"#attn-{notice.id}", state="detached", timeout=30_000)
    viewer.wait_for_selector(f"#attn-{notice.id}", state="detached", timeout=30_000)

    batch = stack.wait_terminal(batch_id)
    assert batch.outcome["kind"] == "succeeded"
    assert stack.task(notice.id).signals["resolution-1"]["by"] == "user:olga"
    page.goto(f"{web.http}/sessions/{session_id}/")
    assert page.locator(f"#plans tr[data-recipient='{FOURTH}'] .state-sent").count() == 1


def test_text_from_entries_and_inputs_is_shown_escaped(
    stack: Stack, web: Daphne, browser: Any
) -> None:
    evil = "<script>window.__pwned = 1</script><img src=x onerror='window.__pwned = 2'>"
    handle = runtime().kernel.create_session(metadata={"title": evil})
    draft = Draft(actor="user:mallory")
    conversation = draft.create_conversation()
    draft.append(conversation, "user", {"text": evil})
    task_id = draft.create_task("send-batch", {"recipients": ["a@example.com"],
                                               "subject": evil, "body": evil})
    handle.commit(draft)
    page = logged_in(browser, web, "olga", "viewer")
    for url in (f"/sessions/{handle.id}/", f"/tasks/{task_id}/", "/"):
        page.goto(f"{web.http}{url}")
        assert evil in page.locator("main").inner_text(), url
        assert page.evaluate("window.__pwned") is None, url
