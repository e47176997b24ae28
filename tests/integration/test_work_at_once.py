"""One account's work runs one piece at a time in a web process (``USER_WORK_AT_ONCE``,
controlplane.web.rates.AtOnce): its second request waits while its first runs, whether
each came with a token or a browser's login, while another account's request is served;
a request that waits past ``USER_WORK_WAIT_SECONDS`` is answered 429 with
``Retry-After``; a long-poll's wait holds no turn; and an account's live renders wait
while its request runs, and are handed their turn when it ends."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.db import connections
from django.test import Client

from controlplane.access import issue_token
from controlplane.reads import sessions as reads
from controlplane.sockets.render_turns import RenderTurns
from controlplane.web import rates

pytestmark = pytest.mark.django_db(transaction=True)  # the requests run on threads of their own


@pytest.fixture(autouse=True)
def one_at_a_time(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rates, "KEY_PREFIX", f"test:rate:{uuid.uuid4().hex}")
    settings.USER_WORK_AT_ONCE = 1
    settings.USER_WORK_WAIT_SECONDS = 30


def account(name: str) -> User:
    user = User.objects.create_user(name)
    user.groups.add(Group.objects.get_or_create(name="viewer")[0])
    return user


def with_token(user: User) -> Client:
    return Client(headers={"Authorization": f"Bearer {issue_token(user, 't')}"})


def logged_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


class HeldReads:
    """``/api/sessions``'s read, held on the test's own threads until :meth:`release`
    (a request from the test's main thread goes through); how many came in."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.released = threading.Event()
        self.entered: list[str] = []
        self.inside = threading.Semaphore(0)
        read = reads.sessions

        def sessions(*args: Any, **kwargs: Any) -> Any:
            main = threading.current_thread() is threading.main_thread()
            self.entered.append("main" if main else "thread")
            self.inside.release()
            if not main:
                self.released.wait(60)
            return read(*args, **kwargs)

        monkeypatch.setattr(reads, "sessions", sessions)

    def release(self) -> None:
        self.released.set()


@pytest.fixture
def threads() -> Iterator[Callable[[Callable[[], Any]], Future[Any]]]:
    pool = ThreadPoolExecutor(4)

    def run(call: Callable[[], Any]) -> Future[Any]:
        def on_thread() -> Any:
            try:
                return call()
            finally:
                connections.close_all()  # this thread's, before the test database goes
        return pool.submit(on_thread)

    try:
        yield run
    finally:
        pool.shutdown(wait=True)


def test_an_accounts_second_request_waits_for_its_first_and_others_do_not(
    monkeypatch: pytest.MonkeyPatch, threads: Callable[[Callable[[], Any]], Future[Any]],
) -> None:
    vic, ann = account("vic"), account("ann")
    held = HeldReads(monkeypatch)
    token, browser = with_token(vic), logged_in(vic)
    first = threads(lambda: token.get("/api/sessions").status_code)
    assert held.inside.acquire(timeout=30)
    second = threads(lambda: browser.get("/api/sessions").status_code)
    # Another account is served while vic's first request runs; vic's second is not let in.
    assert logged_in(ann).get("/api/sessions").status_code == 200
    time.sleep(0.3)
    assert held.entered == ["thread", "main"]
    assert not second.done()
    held.release()
    assert first.result(timeout=30) == 200
    assert second.result(timeout=30) == 200
    assert held.entered == ["thread", "main", "thread"]
    assert rates.at_once.running(vic.pk) == 0


def test_a_request_that_waits_too_long_for_its_turn_is_answered_429(
    settings: Any, monkeypatch: pytest.MonkeyPatch,
    threads: Callable[[Callable[[], Any]], Future[Any]],
) -> None:
    settings.USER_WORK_WAIT_SECONDS = 0.2
    vic = account("vic")
    held = HeldReads(monkeypatch)
    token = with_token(vic)
    first = threads(lambda: token.get("/api/sessions").status_code)
    assert held.inside.acquire(timeout=30)
    refused = token.get("/api/sessions")
    page = logged_in(vic).get("/tasks/")
    held.release()
    assert first.result(timeout=30) == 200
    assert refused.status_code == 429 and refused["Retry-After"] == "1"
    assert "(USER_WORK_AT_ONCE)" in refused.json()["detail"]
    assert page.status_code == 429 and b"USER_WORK_AT_ONCE" in page.content
    assert token.get("/api/sessions").status_code == 200  # its turn came back


def test_a_long_polls_wait_holds_no_turn(
    settings: Any, threads: Callable[[Callable[[], Any]], Future[Any]],
) -> None:
    from controlplane.reads.feed import MAX_CURSOR

    settings.USER_WORK_WAIT_SECONDS = 1
    vic = account("vic")
    token = with_token(vic)
    waiting = threads(lambda: token.get(f"/api/changes?after_id={MAX_CURSOR}&wait=5"))
    time.sleep(1)  # the long-poll is waiting for a commit that never comes
    assert not waiting.done()
    assert token.get("/api/sessions").status_code == 200
    assert waiting.result(timeout=30).status_code == 200


def test_an_accounts_renders_wait_while_its_request_runs(settings: Any) -> None:
    async def scenario() -> None:
        work = rates.AtOnce()
        turns = RenderTurns(4, work=work)
        # A request of the viewer's holds its turn, on a thread of its own.
        assert await asyncio.to_thread(work.take, "viewer", 0)
        viewers, operators = turns.ask({"viewer"}), turns.ask({"operator"})
        await asyncio.sleep(0.1)
        assert operators.granted.done()  # another account's render is not held up
        assert not viewers.granted.done()
        # The request ends (on its thread): the viewer's render is handed its turn.
        await asyncio.to_thread(work.give_back, "viewer")
        assert await asyncio.wait_for(asyncio.shield(viewers.granted), 5) == "viewer"
        # While the render runs, the viewer's next request waits for it.
        rendering, done = asyncio.Event(), asyncio.Event()

        async def render() -> None:
            rendering.set()
            await done.wait()

        running = asyncio.create_task(turns.run(viewers, render))
        await rendering.wait()
        assert not await asyncio.to_thread(work.take, "viewer", 0.05)
        done.set()
        await running
        assert await asyncio.to_thread(work.take, "viewer", 0)
        work.give_back("viewer")
        await turns.run(operators, lambda: asyncio.sleep(0))
        assert work.running("viewer") == work.running("operator") == 0

    asyncio.run(scenario())
