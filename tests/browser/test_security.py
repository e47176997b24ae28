"""Cross-site websocket hijacking, in Chromium (issue 15, point 4).

A page on another origin of the same host (another port: the same *site*, so the
browser sends the dashboard's SameSite=Lax session cookie with the handshake) must not
open a cookie-authenticated socket; the dashboard's own page can. Channels' host-name
check let the first through.
"""

from __future__ import annotations

import threading
import time
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


def until(page: Any, expression: str, timeout: float = 10.0) -> Any:
    """Poll ``expression`` from here: Playwright's wait_for_function evaluates its
    predicate with eval() in the page, which the policy refuses (as it should)."""
    deadline = time.monotonic() + timeout
    while not (value := page.evaluate(expression)):
        assert time.monotonic() < deadline, f"timed out waiting for {expression}"
        time.sleep(0.05)
    return value


WATCH_VIOLATIONS = """() => { window.__violations = [];
    document.addEventListener('securitypolicyviolation',
        (e) => window.__violations.push(e.violatedDirective + ' ' + e.blockedURI)); }"""


def test_the_content_security_policy_lets_the_live_dashboard_work_and_refuses_inline_script(
    web: Daphne, browser: Any
) -> None:
    """Under the policy every answer carries, the pages go live and refuse nothing of
    their own; a script injected inline is refused (the browser reports it)."""
    page = logged_in(browser, web, "olga", "operator", bypass_csp=False)
    for path in ("/", "/tasks/", "/attention/"):
        page.goto(f"{web.http}{path}")
        page.evaluate(WATCH_VIOLATIONS)
        until(page, "document.documentElement.dataset.connection === 'live'")
        assert page.evaluate("window.__violations") == [], path
    page.goto(f"{web.http}/workers/")  # not live: refreshed by htmx every 2 s
    page.evaluate(WATCH_VIOLATIONS)
    page.wait_for_timeout(2500)
    assert page.evaluate("window.__violations") == []
    page.evaluate("""() => { const s = document.createElement('script');
        s.textContent = 'window.__pwned = 1'; document.body.appendChild(s); }""")
    until(page, "window.__violations.length > 0")
    assert page.evaluate("window.__pwned") is None
    assert page.evaluate("window.__violations")[0].startswith("script-src")
