"""A long conversation's transcript in a real browser: the session page shows its latest
entries, "Show earlier entries" loads the ones before by pages, and what was loaded stays
through live updates, with no entry missing between it and the latest page; the page
passes the accessibility check with every page loaded."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.reads import pages
from controlplane.worker.runtime import runtime
from tests.chaos.harness import Stack
from tests.e2e.server import Daphne
from tests.integration.sessions import add_turns, turns_conversation

from .accessibility import axe_violations
from .conftest import logged_in

pytestmark = [pytest.mark.slow, pytest.mark.browser]

TURNS = 60  # 180 entries: the latest page and three pages before it


def shown(page: Any, conversation: str) -> list[str]:
    """The ids of the conversation's entries the page shows, in page order."""
    return page.eval_on_selector_all(
        f"section[aria-labelledby='conv-{conversation}'] li.entry",
        "els => els.map(e => e.id.slice('entry-'.length))")


def rendered(conversation: str) -> list[str]:
    """The ids of every entry of the conversation that the transcript renders (a tool's
    result is shown on its call's card), in order."""
    return [e.id for e in runtime().kernel.entries(conversation) if e.kind != "tool_result"]


def test_earlier_entries_load_by_pages_and_stay_through_live_updates(
    stack: Stack, web: Daphne, browser: Any
) -> None:
    session_id, conversation = turns_conversation(TURNS)
    page = logged_in(browser, web, "vic", "viewer")
    page.goto(f"{web.http}/sessions/{session_id}/")
    page.wait_for_selector("#conn-state.conn-live")
    every = rendered(conversation)
    latest = shown(page, conversation)
    assert 0 < len(latest) <= pages.ENTRY_TAIL and latest == every[-len(latest):]

    earlier = page.get_by_role("button", name="Show earlier entries")
    earlier.click()
    page.wait_for_function(f"document.querySelectorAll('li.entry').length > {len(latest)}")
    loaded = shown(page, conversation)
    assert loaded == every[-len(loaded):] and len(loaded) > len(latest)

    # More turns at once than a page holds: the latest page's entries join the loaded
    # ones, and the ones between (never on the page) are fetched into place.
    add_turns(session_id, conversation, TURNS, 30)
    every = rendered(conversation)
    expected = every[every.index(loaded[0]):]
    page.wait_for_selector(f"#entry-{every[-1]}")
    page.wait_for_function(f"document.querySelectorAll('li.entry').length >= {len(expected)}")
    assert shown(page, conversation) == expected

    while earlier.count():  # back to the first entry
        before = len(shown(page, conversation))
        earlier.click()
        page.wait_for_function(f"document.querySelectorAll('li.entry').length > {before}")
    assert shown(page, conversation) == every
    assert axe_violations(page) == []
