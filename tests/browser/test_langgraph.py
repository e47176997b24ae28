"""A hosted LangGraph graph steered from the session page in a real browser, against real
workers and Daphne: the interrupt appears live with its value, a value that does not meet
the node's schema is refused naming the field, a good one resumes the run to its end;
then a fork from an earlier checkpoint starts a new branch that stops at the interrupt
again, both branches listed on the page; once it has ended, a new run started from the
page's form goes on with the thread."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from kernel import Draft
from tests.chaos.harness import Stack, chaos_stack
from tests.databases import url_of_test_database
from tests.e2e.server import Daphne, daphne_env
from tests.langgraph_graphs import APPROVAL, runs

from .conftest import logged_in

pytestmark = [pytest.mark.slow, pytest.mark.browser]
MODULE = "tests.langgraph_graphs.register"


@pytest.fixture
def graph_stack(
    tmp_path: Path, transactional_db: None, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Stack]:
    monkeypatch.setattr(settings, "KERNEL_TASK_MODULES", [MODULE])
    env = {"KERNEL_TASK_MODULES": MODULE, "LANGGRAPH_RUNS": str(tmp_path / "graph-runs")}
    with chaos_stack(tmp_path, env=env) as running:
        yield running


@pytest.fixture
def graph_web(graph_stack: Stack, tmp_path: Path) -> Iterator[Daphne]:
    server = Daphne(
        tmp_path / "daphne.log",
        daphne_env(url_of_test_database(), graph_stack.redis_url, KERNEL_TASK_MODULES=MODULE,
                   FEED_POLL_SECONDS="0.5", FEED_HEARTBEAT_SECONDS="2"),
    )
    server.start()
    try:
        yield server
    finally:
        server.kill()


def test_an_interrupt_is_resumed_and_a_run_forked_from_the_session_page(
    graph_stack: Stack, graph_web: Daphne, browser: Any, tmp_path: Path
) -> None:
    stack, web = graph_stack, graph_web
    handle = stack.kernel.create_session(metadata={"title": "langgraph page"})
    draft = Draft(actor="user:test")
    task_id = draft.create_task(APPROVAL, {"input": {"text": "notice"}})
    handle.commit(draft)
    page = logged_in(browser, web, "olga", "operator")
    page.goto(f"{web.http}/sessions/{handle.id}/")
    page.wait_for_selector("#conn-state.conn-live")
    assert page.locator(".interrupt").count() == 0

    stack.worker("w1")
    stack.beat()
    card = page.locator(f"#interrupt-{task_id}")
    card.wait_for(timeout=60_000)  # pushed live
    assert "draft of notice" in card.locator(".interrupt-value").inner_text()
    card.locator("input[name=reason]").fill("read the draft")
    card.locator("textarea[name=value]").fill('{"approved": "yes"}')
    card.locator("button[type=submit]").click()
    page.wait_for_selector("#action-result .error:has-text(\"value['approved']\")")
    assert stack.task(task_id).status == "waiting"

    card.locator("textarea[name=value]").fill('{"approved": true}')
    card.locator("button[type=submit]").click()
    page.wait_for_selector("#action-result:has-text('resume done')")
    page.wait_for_selector(f"#graph-run-{task_id} .badge:has-text('succeeded')",
                           timeout=60_000)
    assert page.locator(".interrupt").count() == 0
    done = stack.task(task_id)
    assert done.outcome is not None and done.outcome["result"]["output"]["approved"] == {
        "approved": True}
    assert runs(tmp_path / "graph-runs") == ["draft", "approve", "approve", "publish"]

    # Fork from the checkpoint where "approve" is next: it asks again, on a new branch.
    ahead = page.locator("li.checkpoint[data-step='1']").first
    fork_from = ahead.get_attribute("data-checkpoint")
    ahead.locator("summary").click()
    ahead.locator("input[name=reason]").fill("ask again")
    ahead.locator("button[type=submit]").click()
    page.wait_for_selector("#action-result:has-text('fork done')")
    page.locator(".interrupt").wait_for(timeout=60_000)
    assert page.locator(".graph-runs li").count() == 2
    assert page.locator("li.checkpoint[data-branch='1']").count() >= 1
    assert f"#checkpoint-{fork_from}" in page.locator(".graph-runs").inner_html()
    assert runs(tmp_path / "graph-runs")[4:] == ["approve"]  # "draft" did not run again

    # Once the fork has ended, a new run starts on the thread from the page's form.
    forked = page.locator(".interrupt")
    forked.locator("input[name=reason]").fill("fine now")
    forked.locator("textarea[name=value]").fill('{"approved": false}')
    forked.locator("button[type=submit]").click()
    page.wait_for_selector("#action-result:has-text('resume done')")
    start = page.locator("details.start-run")
    start.wait_for(timeout=60_000)  # offered once no run of the thread is open
    start.locator("summary").click()
    start.locator("textarea[name=input]").fill('{"text": "second notice"}')
    start.locator("input[name=reason]").fill("the next notice")
    start.locator("button[type=submit]").click()
    page.wait_for_selector("#action-result:has-text('start done')")
    page.locator(".interrupt").wait_for(timeout=60_000)
    assert "draft of second notice" in page.locator(".interrupt-value").inner_text()
    assert page.locator(".graph-runs li").count() == 3
