"""A large tool result in a real browser: its card on the session page shows the excerpt
the model got and a link that downloads the whole artifact (for a viewer), the bytes
the kernel stored, their hash checked by the server. A user message whose text the
kernel stored apart shows its beginning, and its link downloads the whole text."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from tests.chaos.harness import Stack
from tests.e2e.server import Daphne
from tests.integration.sessions import (
    LONG_TEXT,
    REPORT,
    session_with_a_large_result,
    session_with_large_entries,
)

from .conftest import logged_in

pytestmark = [pytest.mark.slow, pytest.mark.browser]


def test_a_viewer_opens_an_artifact_from_its_tool_card(
    stack: Stack, web: Daphne, browser: Any, tmp_path: Any
) -> None:
    session_id, _, reference = session_with_a_large_result()
    page = logged_in(browser, web, "vic", "viewer")
    page.goto(f"{web.http}/sessions/{session_id}/")
    card = page.locator("#call-c1")
    assert reference["excerpt"][:40] in card.locator("pre.result").inner_text()
    link = card.locator("a.artifact-link")
    with page.expect_download() as downloading:
        link.click()
    saved = tmp_path / "artifact.json"
    downloading.value.save_as(saved)
    data = saved.read_bytes()
    assert "sha256:" + hashlib.sha256(data).hexdigest() == reference["artifact"]
    assert json.loads(data) == REPORT


def test_a_viewer_opens_the_text_of_an_entry_stored_apart(
    stack: Stack, web: Daphne, browser: Any, tmp_path: Any
) -> None:
    session_id, _, (user, _) = session_with_large_entries()
    page = logged_in(browser, web, "vic", "viewer")
    page.goto(f"{web.http}/sessions/{session_id}/")
    entry = page.locator(f"#entry-{user}")
    assert entry.locator(".said").inner_text().startswith("word0 <i><script>")
    assert page.evaluate("window.__pwned") is None  # shown as text, never run
    with page.expect_download() as downloading:
        entry.locator("a.artifact-link").click()
    saved = tmp_path / "text.json"
    downloading.value.save_as(saved)
    data = saved.read_bytes()
    assert json.loads(data) == LONG_TEXT
    href = entry.locator("a.artifact-link").get_attribute("href")
    assert href is not None and href.endswith("sha256:" + hashlib.sha256(data).hexdigest())
