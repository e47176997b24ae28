"""Issue 13 in a real browser: finding tasks across sessions and acting on the result,
the Workers page telling an idle worker from a dead one, the overview's live chart.

Chromium against a real Daphne and real Celery worker and beat processes; every wait is
a poll with a timeout on what the page shows.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.chaos.harness import Stack
from tests.e2e.server import Daphne

from .batches import send_batch
from .conftest import logged_in

pytestmark = [pytest.mark.slow, pytest.mark.browser]


def test_a_search_across_sessions_finds_tasks_by_a_word_and_retries_the_previewed_count(
    stack: Stack, web: Daphne, browser: Any
) -> None:
    wanted = [send_batch(f"Zebracorn notice {i}", "nope") for i in range(2)]
    other_failed = send_batch("Another notice", "nope")
    succeeded = send_batch("Zebracorn sent fine", "http")
    stack.worker("w1")
    stack.beat()
    for task_id in [*wanted, other_failed, succeeded]:
        stack.wait_terminal(task_id)
    assert {stack.task(t).outcome["kind"] for t in wanted} == {"failed"}

    page = logged_in(browser, web, "olga", "operator")
    page.goto(f"{web.http}/tasks/")
    page.get_by_label("Text in the input").fill("zebracorn")
    page.get_by_label("Status").select_option("failed")
    page.get_by_role("button", name="Find").click()
    page.wait_for_url("**/tasks/?*q=zebracorn*")
    assert "status=failed" in page.url  # a shareable URL
    page.wait_for_selector("#conn-state.conn-live")
    shown = page.eval_on_selector_all("tr.found", "els => els.map(e => e.id.slice(6))")
    assert sorted(shown) == sorted(wanted)
    assert len({stack.task(t).session_id for t in shown}) == 2  # across sessions

    page.get_by_role("button", name="Preview retry…").click()
    page.wait_for_selector("#preview-count")
    assert page.locator("#preview-count").inner_text() == "2"
    page.locator("#preview-tasks summary").click()  # the preview names the set it acts on
    listed = page.eval_on_selector_all("#preview-tasks li", "els => els.map(e => e.innerText)")
    assert sorted(listed) == sorted(wanted)
    page.get_by_label("Why retry them?").fill("the channel is configured now")
    page.get_by_role("button", name="Confirm retry of 2").click()
    page.wait_for_selector("#action-result .ok")
    assert "retry: 2 of 2 done." in page.locator("#action-result").inner_text()

    retried = {t: stack.task(t).checkpoint.get("_retried", []) for t in
               [*wanted, other_failed, succeeded]}
    assert [len(retried[t]) for t in wanted] == [1, 1]
    assert retried[other_failed] == [] and retried[succeeded] == []
    assert {r[0]["by"] for t in wanted for r in [retried[t]]} == {"user:olga"}


def test_the_workers_page_lists_an_idle_worker_then_shows_it_dead_after_a_kill(
    stack: Stack, web: Daphne, browser: Any
) -> None:
    worker = stack.worker("idle")
    page = logged_in(browser, web, "vera", "viewer")
    page.goto(f"{web.http}/workers/")
    row = f"tr.worker[data-pid='{worker.pid}']"
    page.wait_for_selector(f"{row}[data-state=live]", timeout=15_000)
    assert "idle" in page.locator(row).inner_text()
    assert "default" in page.locator(row).inner_text()

    worker.kill()  # SIGKILL: no shutdown handler runs, the heartbeats just stop
    killed = time.monotonic()
    page.wait_for_selector(f"{row}[data-state=dead]", timeout=20_000)
    assert time.monotonic() - killed <= 15


def test_the_overview_chart_gains_points_while_a_batch_runs(
    stack: Stack, web: Daphne, browser: Any
) -> None:
    page = logged_in(browser, web, "vera", "viewer")
    page.wait_for_selector("#conn-state.conn-live")
    page.evaluate("window.__sameDocument = true")
    points = "Number(document.getElementById('chart-phases').dataset.points)"
    assert page.evaluate(points) == 0  # a fresh database: nothing ran in the last hour
    attention = "document.querySelectorAll('#chart-failures .series-attention circle').length"
    assert page.evaluate(attention) == 0

    stack.admin.set_faults(latency_ms=300)
    session_id, batch_id = stack.send_batch([f"r{i:02d}@example.com" for i in range(16)])
    stack.worker("w1")
    stack.beat()
    total = "Number(document.getElementById('chart-phases').dataset.total)"
    page.wait_for_function(f"{points} >= 1", timeout=60_000)
    during = page.evaluate(total)
    assert not stack.task(batch_id).terminal  # seen while the batch still runs
    stack.wait_terminal(batch_id, timeout=120)
    page.wait_for_function(f"{total} > {during}", timeout=30_000)  # and it kept growing
    assert page.evaluate("window.__sameDocument") is True  # live, no reload
    assert page.locator("#chart-phases circle").count() >= 1
    assert page.locator("#chart-latency circle").count() >= 1

    # A task that fails comes to need attention: the series shows it, still live.
    stack.wait_terminal(send_batch("Attention please", "nope"))
    page.wait_for_function(f"{attention} >= 1", timeout=30_000)
    assert "1 need attention" in page.locator("#activity h2").inner_text()
    assert page.evaluate("window.__sameDocument") is True
