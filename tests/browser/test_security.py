"""Cross-site websocket hijacking, in Chromium (issue 15, point 4).

A page on another origin of the same host (another port: the same *site*, so the
browser sends the dashboard's SameSite=Lax session cookie with the handshake) must not
open a cookie-authenticated socket; the dashboard's own page can. Channels' host-name
check let the first through.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.server import Daphne, daphne_alone

from .conftest import logged_in

pytestmark = [pytest.mark.slow, pytest.mark.browser]

# Opens a live page's socket with the cookies the browser holds for the dashboard's host,
# and reports what happened: "message" (it was let in) or "closed <code>".
PROBE = """
(url) => new Promise((done) => {
  const ws = new WebSocket(url);
  ws.onopen = () => ws.send(JSON.stringify({after: 0}));
  ws.onmessage = () => { ws.close(); done("message"); };
  ws.onclose = (e) => done("closed " + e.code);
  setTimeout(() => done("timeout"), 15000);
})
"""


@pytest.fixture
def web(tmp_path: Path, transactional_db: None) -> Iterator[Daphne]:
    """Daphne alone: no workers are needed to open a socket."""
    with daphne_alone(tmp_path / "daphne.log", FEED_HEARTBEAT_SECONDS="1") as server:
        yield server


@pytest.fixture
def elsewhere() -> Iterator[str]:
    """Another origin on the same host: a plain page on another port."""

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body = b"<!doctype html><title>elsewhere</title><p>another origin</p>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    # shutdown() waits for the serving loop to look up: every 0.5 s by default.
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02},
                     daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_page_on_another_origin_cannot_open_a_cookie_authenticated_socket(
    web: Daphne, elsewhere: str, browser: Any
) -> None:
    page = logged_in(browser, web, "olga", "operator")
    socket = f"{web.ws}/ws/ui/overview/"
    assert page.evaluate(PROBE, socket) == "message"  # the dashboard's own page

    page.goto(f"{elsewhere}/")  # same browser context: the session cookie is there
    cookies = {c["name"] for c in page.context.cookies(web.http)}
    assert "sessionid" in cookies
    assert page.evaluate(PROBE, socket) == "closed 1006"  # refused at the handshake (403)
    assert page.evaluate(PROBE, socket.replace("/ws/ui/overview/", "/ws/feed/")) == "closed 1006"


def test_logging_out_in_one_tab_closes_the_other_tabs_live_socket(
    tmp_path: Path, transactional_db: None, browser: Any
) -> None:
    """Point 5 of issue 15 in the browser: the socket re-checks its login session every
    WEBSOCKET_RECHECK_SECONDS and closes with 4401, which the page shows, not retries."""
    with daphne_alone(tmp_path / "daphne.log", FEED_HEARTBEAT_SECONDS="1",
                      WEBSOCKET_RECHECK_SECONDS="0.5") as web:
        watching = logged_in(browser, web, "olga", "operator")
        watching.wait_for_function("document.documentElement.dataset.connection === 'live'")
        other = watching.context.new_page()
        other.goto(f"{web.http}/workers/")
        other.get_by_role("button", name="Log out").click()
        other.wait_for_url(f"{web.http}/accounts/login/")
        watching.wait_for_function(
            "document.documentElement.dataset.connection === 'refused'", timeout=5000)
        assert "refused (4401)" in watching.locator("#conn-state").inner_text()
