"""A large tool result in a real browser: its card on the session page shows the excerpt
the model got and a link that downloads the whole artifact (for a viewer), the bytes
the kernel stored, their hash checked by the server."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from tests.chaos.harness import Stack
from tests.e2e.server import Daphne
from tests.integration.sessions import REPORT, session_with_a_large_result

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
