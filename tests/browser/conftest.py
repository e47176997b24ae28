"""Browser tests: the Debian chromium (never a downloaded browser) driven by Playwright,
against a real Daphne process and real Celery worker and beat processes.

The stack (provider, workers, beat, a Redis db of its own) is the chaos tests' harness;
the web server is the e2e tests' :class:`~tests.e2e.server.Daphne`, pointed at the same
test database and Redis db, so hints from the workers reach it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Group, User

from tests.chaos.harness import Stack, chaos_stack
from tests.databases import url_of_test_database
from tests.e2e.server import Daphne, daphne_env

CHROMIUM = "/usr/bin/chromium"
PASSWORD = "browser-pw"
@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Chromium, for one module at a time: Playwright's sync API runs an event loop in
    this thread while it is started, which Django's sync-only calls (and the async
    views that the test client runs through ``async_to_sync``) must not see later."""
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: `make test-stack` installs Debian's chromium as root")
    from playwright.sync_api import sync_playwright

    # The test's own ORM calls between browser steps are plain synchronous calls.
    with pytest.MonkeyPatch.context() as patch, sync_playwright() as playwright:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield launched
        launched.close()


@pytest.fixture
def stack(tmp_path: Path, transactional_db: None) -> Iterator[Stack]:
    with chaos_stack(tmp_path) as running:
        yield running


@pytest.fixture
def web(stack: Stack, tmp_path: Path) -> Iterator[Daphne]:
    server = Daphne(
        tmp_path / "daphne.log",
        daphne_env(url_of_test_database(), stack.redis_url,
                   FEED_POLL_SECONDS="0.5", FEED_HEARTBEAT_SECONDS="2"),
    )
    server.start()
    try:
        yield server
    finally:
        server.kill()


def account(name: str, role: str) -> User:
    user = User.objects.filter(username=name).first() or User.objects.create_user(
        name, password=PASSWORD)
    user.set_password(PASSWORD)
    user.save()
    user.groups.add(Group.objects.get_or_create(name=role)[0])
    return user


def logged_in(
    browser: Any, web: Daphne, name: str, role: str, viewport: tuple[int, int] = (1280, 900),
    *, bypass_csp: bool = True,
) -> Any:
    """A new page of a new browser context, logged in through the login form. The
    context bypasses the pages' Content-Security-Policy unless asked not to: Playwright's
    own waits evaluate strings in the page, which the policy refuses (test_security.py
    checks the policy with it on)."""
    account(name, role)
    width, height = viewport
    page = browser.new_context(viewport={"width": width, "height": height},
                               bypass_csp=bypass_csp).new_page()
    page.set_default_timeout(30_000)
    page.on("console", lambda m: print(f"[{name} console] {m.type}: {m.text}"))
    page.goto(f"{web.http}/accounts/login/")
    page.get_by_label("Username").fill(name)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{web.http}/")
    return page
