"""A Pydantic AI agent's session page in a real browser, against real workers
(``tests.chaos.pydantic_billing``: a deferred ``pay`` tool, streamed text): the
transcript shows the model's text and the call's card with its arguments, the token
totals, the pending approval with who may decide and its buttons (Needs attention lists
it too); approving from the
page continues the run, whose streamed answer shows live as a preview, and the card
then says who approved it and what the call returned."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from controlplane.worker.runtime import forget_runtime
from kernel import Draft
from kernel.agent import submit
from tests.chaos.harness import Stack, chaos_stack
from tests.databases import url_of_test_database
from tests.e2e.server import Daphne, daphne_env

from .conftest import logged_in

pytestmark = [pytest.mark.slow, pytest.mark.browser]
AGENTS = json.dumps({"billing": "tests.chaos.pydantic_billing.agent"})


@pytest.fixture
def stack(tmp_path: Path, transactional_db: None) -> Iterator[Stack]:
    saved = settings.KERNEL_AGENTS
    settings.KERNEL_AGENTS = json.loads(AGENTS)
    forget_runtime()
    try:
        with chaos_stack(tmp_path, env={"KERNEL_AGENTS": AGENTS,
                                        "AGENT_TOOL_DIR": str(tmp_path)}) as running:
            yield running
    finally:
        settings.KERNEL_AGENTS = saved
        forget_runtime()


@pytest.fixture
def web(stack: Stack, tmp_path: Path) -> Iterator[Daphne]:
    server = Daphne(tmp_path / "daphne.log", daphne_env(
        url_of_test_database(), stack.redis_url, FEED_POLL_SECONDS="0.5",
        FEED_HEARTBEAT_SECONDS="2", KERNEL_AGENTS=AGENTS, AGENT_TOOL_DIR=str(tmp_path)))
    server.start()
    try:
        yield server
    finally:
        server.kill()


def test_the_session_page_shows_the_run_and_an_approval_from_it_continues_the_run(
    stack: Stack, web: Daphne, browser: Any
) -> None:
    (stack.tmp / "hold-stream").touch()  # the answer's stream waits, so its preview shows
    handle = stack.kernel.create_session(metadata={"title": "billing"})
    draft = Draft(actor="user:olga")
    conversation = draft.create_conversation()
    handle.commit(draft)
    submitted = submit(handle, conversation, {"text": "Pay the supplier", "agent": "billing"},
                       "req-1")
    assert submitted.submission is not None
    page = logged_in(browser, web, "olga", "operator")
    page.goto(f"{web.http}/sessions/{handle.id}/")
    page.wait_for_selector("#conn-state.conn-live")

    stack.worker("w1")
    stack.beat()
    page.wait_for_selector("#call-call_pay[data-state=approval]", timeout=60_000)
    card = page.locator("#call-call_pay")
    assert json.loads(card.locator("pre.arguments").inner_text()) == {"amount": 5}
    assert "Who may decide: operators" in card.locator(".approval-why").inner_text()
    assert card.locator("button[value=approve]").is_visible()
    assert card.locator("button[value=deny]").is_visible()
    assert "I will pay the supplier." in page.locator(".entry.kind-model .said").first.inner_text()
    totals = page.locator(".usage-total").first
    assert int(totals.get_attribute("data-input") or 0) > 0
    assert int(totals.get_attribute("data-output") or 0) > 0
    assert not (stack.tmp / "runs").exists()  # nothing ran while it waits
    attention = page.context.new_page()  # Needs attention lists it as a native call
    attention.goto(f"{web.http}/attention/")
    attention.wait_for_selector("#conn-state.conn-live")
    assert "pay" in attention.locator(".pending-approval").inner_text()

    card.locator("input[name=reason]").fill("invoice checked")
    card.locator("button[value=approve]").click()
    page.wait_for_selector("#action-result:has-text('approve done')")
    preview = page.wait_for_selector("#previews figure.preview", timeout=60_000)
    assert preview is not None and "The payment call" in preview.inner_text()
    (stack.tmp / "release").touch()

    page.wait_for_selector("#call-call_pay[data-state=succeeded]", timeout=60_000)
    decided = card.locator(".approval-decided").inner_text()
    assert "Approved by user:olga" in decided and "invoice checked" in decided
    assert json.loads(card.locator("pre.result").inner_text()) == "paid 5"
    page.wait_for_selector(".entry.kind-model .said strong:has-text('paid 5')", timeout=30_000)
    stack.wait_answered(submitted.submission.id)
    page.wait_for_selector("#previews figure.preview", state="detached", timeout=30_000)
    attention.wait_for_selector(".pending-approval", state="detached", timeout=30_000)
