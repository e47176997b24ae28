"""One account's many live-page sockets cannot keep another account's page waiting.

One viewer opens twenty tasks-page sockets, each with a filter of its own (twenty page
views, twenty renders a commit); another account follows the tasks page too. The
viewer's renders are held on their threads until the test lets them go, so what each
account gets is decided by the order renders are given threads, not by how fast they
are: the other account's frame must come while the viewer's renders are still held,
the viewer must never hold more than its share of the threads, and the renders it asked
for while it waited must coalesce into one per page view at the newest commit.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import Group, User
from django.db import connection

from controlplane.access import issue_token
from controlplane.dev.ports import reserved_redis_url
from controlplane.reads.pages import last_commit_id
from controlplane.sockets import page_threads, pages
from controlplane.sockets.page_threads import PAGE_THREADS
from controlplane.sockets.render_turns import RENDERS_PER_ACCOUNT
from controlplane.sockets.routes import websocket_urlpatterns
from controlplane.sockets.sharing import SharedReads, SharedRenders
from controlplane.ui import live
from controlplane.web import rates
from controlplane.worker.runtime import runtime
from kernel import Draft

pytestmark = pytest.mark.django_db(transaction=True)

HEAVY_SOCKETS = 20
SHOWN = re.compile(r'id="feed-state" data-seq="(\d+)"')


@pytest.fixture(autouse=True)
def isolated(settings: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    settings.CHANNEL_LAYERS = {}  # no hints: each socket reads on its own poll clock
    settings.FEED_POLL_SECONDS = 0.1
    settings.FEED_HEARTBEAT_SECONDS = 600
    settings.USER_SOCKET_LIMIT = HEAVY_SOCKETS
    monkeypatch.setattr(runtime().dispatcher, "deliver", lambda task, queue: None)
    monkeypatch.setattr(pages, "shared_renders", SharedRenders())  # none kept from before
    with reserved_redis_url(settings.REDIS_URL) as url:  # the sockets' slots
        settings.REDIS_URL = url
        yield


def token(name: str, role: str) -> str:
    user = User.objects.create_user(name)
    user.groups.add(Group.objects.get_or_create(name=role)[0])
    return issue_token(user, "turns")


def commit(value: Any) -> int:
    handle = runtime().kernel.create_session()
    draft = Draft(actor="user:ann")
    draft.set("email-plan", "doc", ["n"], value)
    handle.commit(draft)
    return last_commit_id()


class HeldRenders:
    """The tasks page's renders, the heavy viewer's held until :meth:`release`."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.lock = threading.Lock()
        self.released = threading.Event()
        self.held_now = 0
        self.most_held = 0
        self.made: list[tuple[str, int]] = []  # (filter, commit id) of each render made
        original = live.Tasks.update

        def update(this: Any, seq: int, can_act: bool, **params: str) -> str:
            heavy = params.get("q", "").startswith("heavy")
            if heavy:
                with self.lock:
                    self.held_now += 1
                    self.most_held = max(self.most_held, self.held_now)
                try:
                    assert self.released.wait(60), "the test never released the renders"
                finally:
                    with self.lock:
                        self.held_now -= 1
            html = original(this, seq, can_act, **params)
            with self.lock:
                self.made.append((params.get("q", ""), seq))
            return html

        monkeypatch.setattr(live.Tasks, "update", update)

    def release(self) -> None:
        self.released.set()


async def opened(app: Any, key: str, query: str, after: int) -> WebsocketCommunicator:
    socket = WebsocketCommunicator(app, f"/ws/ui/tasks/?{query}", headers=[
        (b"authorization", f"Bearer {key}".encode())])
    connected, _ = await socket.connect()
    assert connected
    await socket.send_json_to({"after": after})
    return socket


async def shown(socket: WebsocketCommunicator, target: int) -> int:
    """Frames read until one shows ``target`` (or later); the position shown."""
    position = 0
    while position < target:
        text = (await socket.receive_output(timeout=20))["text"]
        position = max([position, *map(int, SHOWN.findall(text))])
    return position


def test_one_accounts_sockets_do_not_keep_another_accounts_page_waiting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    held = HeldRenders(monkeypatch)
    heavy, other = token("heavy", "viewer"), token("other", "operator")
    start = commit("start")

    async def scenario() -> tuple[int, int]:
        app = URLRouter(websocket_urlpatterns)
        sockets = [await opened(app, heavy, f"q=heavy{i:02}", start)
                   for i in range(HEAVY_SOCKETS)]
        watcher = await opened(app, other, "q=other", start)
        try:
            first = await database_sync_to_async(commit)("one")
            # The heavy viewer's renders hold threads (and never let go until released);
            # the other account's page gets its frame meanwhile.
            assert await shown(watcher, first) == first
            assert held.most_held <= RENDERS_PER_ACCOUNT < PAGE_THREADS
            # Commits while the viewer's renders wait: its page views do not queue one
            # render per commit, and the other account keeps getting its frames.
            for value in ("two", "three"):
                newest = await database_sync_to_async(commit)(value)
                assert await shown(watcher, newest) == newest
            assert held.most_held <= RENDERS_PER_ACCOUNT
            held.release()
            for socket in sockets:
                assert await shown(socket, newest) == newest
        finally:
            held.release()
            for socket in [*sockets, watcher]:
                await socket.disconnect()
            await database_sync_to_async(lambda: connection.close())()
        page_threads.end_page_threads()
        return first, newest

    first, newest = asyncio.run(scenario())
    made = [(q, seq) for q, seq in held.made if q.startswith("heavy")]
    views = {q for q, _ in made}
    assert len(views) == HEAVY_SOCKETS
    # Only the renders that were holding threads when the later commits came were made
    # at the first commit; every other page view was rendered once, at the newest.
    at_first = [q for q, seq in made if seq == first]
    assert len(at_first) == RENDERS_PER_ACCOUNT
    for view in views - set(at_first):
        assert [seq for q, seq in made if q == view] == [newest]


def test_an_accounts_renders_are_paid_from_its_server_time_and_wait_while_it_owes(
    settings: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A page's render is charged to its account's budget of server time, as a request
    is; an account past its burst gets no render until it has paid off."""
    settings.USER_SERVER_SECONDS_PER_SECOND = 0.5
    settings.USER_SERVER_SECONDS_BURST = 1.0
    monkeypatch.setattr(pages, "render_budget", pages.RenderBudget())
    original = live.Tasks.update

    def slow_update(this: Any, seq: int, can_act: bool, **params: str) -> str:
        time.sleep(0.3)  # a heavy page: 0.3 s of this account's budget
        return original(this, seq, can_act, **params)

    monkeypatch.setattr(live.Tasks, "update", slow_update)
    reads = settled_reads(monkeypatch)
    key = token("spender", "viewer")
    budget = rates.server_time(User.objects.get(username="spender").pk)
    assert budget is not None
    start = commit("start")

    async def scenario() -> None:
        socket = await opened(URLRouter(websocket_urlpatterns), key, "q=spend", start)
        try:
            first = await database_sync_to_async(commit)("one")
            assert await shown(socket, first) == first
            # The render took 0.3 s: charged at 0.5 s a second, 0.6 s ahead of now.
            assert await asyncio.to_thread(rates._client().pttl, budget.key) > 300
            await asyncio.to_thread(rates.charge, budget, 30.0)  # far past the burst
            assert await asyncio.to_thread(rates.arrears, budget) > 50
            # The process trusts what it last learnt of the account (here: paid up, from the
            # render's own charge) for PAID_UP_SECONDS before it asks again.
            await asyncio.sleep(pages.PAID_UP_SECONDS)
            owed = await database_sync_to_async(commit)("two")
            reads.clear()
            with pytest.raises(TimeoutError):
                await shown_within(socket, owed, 2.0)  # twenty polls: no render
            assert reads == []  # and no read of what settled either
            await asyncio.to_thread(rates.charge, budget, -60.0)  # paid off
            monkeypatch.setattr(pages, "render_budget", pages.RenderBudget())  # as if later
            assert await shown(socket, owed) == owed
        finally:
            await socket.disconnect()
            await database_sync_to_async(lambda: connection.close())()
        page_threads.end_page_threads()

    asyncio.run(scenario())


async def shown_within(socket: WebsocketCommunicator, target: int, seconds: float) -> int:
    async with asyncio.timeout(seconds):
        return await shown(socket, target)


def settled_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The position each of the page sockets' reads of what settled starts from."""
    reads: list[int] = []
    original = pages.settled_global

    async def counted(after_id: int, limit: int, **kwargs: Any) -> Any:
        reads.append(after_id)
        return await original(after_id, limit, **kwargs)

    monkeypatch.setattr(pages, "settled_global", counted)
    return reads



def test_page_sockets_at_different_positions_share_one_read_of_what_settled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Sockets whose renders came at different times stand at positions of their own; a
    read of what settled after each one's position would be a read per socket and hint.
    Once the process knows commit 10 settled, they all read from there, together."""
    reads: list[int] = []
    head = 12

    async def settled_global(after_id: int, limit: int, **_: Any) -> list[tuple[int]]:
        reads.append(after_id)
        await asyncio.sleep(0.01)
        return [(i,) for i in range(after_id + 1, min(head, after_id + limit) + 1)]

    monkeypatch.setattr(pages, "settled_global", settled_global)
    monkeypatch.setattr(pages, "shared_reads", SharedReads())
    settled = pages.SettledCommits()

    async def scenario() -> None:
        nonlocal head
        head = 10
        assert await settled.newest_after(2, 100) == 10  # the first read: from its position
        head = 12
        found = await asyncio.gather(*(settled.newest_after(p, 100) for p in (3, 7, 9, 10)))
        assert found == [12, 12, 12, 12]
        assert reads == [2, 10]  # one read for the four, from what was known
        assert await settled.newest_after(12, 100) is None
        assert await settled.newest_after(30, 100) is None  # a position past it: its own
        assert reads[-1] == 30

    asyncio.run(scenario())


def test_renders_that_waited_for_their_turn_are_not_made_once_the_account_owes(
    settings: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Five page views of one account ask for a render each; the first takes the
    account's turn, the rest wait for theirs. By the time it ends the account is past its
    budget: the renders that waited are not made (each would have been charged past it)."""
    settings.USER_SERVER_SECONDS_PER_SECOND = 0.5
    settings.USER_SERVER_SECONDS_BURST = 1.0
    monkeypatch.setattr(pages, "render_budget", pages.RenderBudget())
    held = HeldRenders(monkeypatch)
    key = token("heavy", "viewer")
    budget = rates.server_time(User.objects.get(username="heavy").pk)
    start = commit("start")

    async def scenario() -> None:
        app = URLRouter(websocket_urlpatterns)
        sockets = [await opened(app, key, f"q=heavy{i}", start) for i in range(5)]
        try:
            await database_sync_to_async(commit)("one")
            async with asyncio.timeout(20):
                while held.held_now < 1:
                    await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)  # the other four have asked and wait for their turn
            await asyncio.to_thread(rates.charge, budget, 30.0)  # the account's other work
            held.release()
            await asyncio.sleep(1.5)
            assert len(held.made) == 1, held.made  # the one that had its turn
        finally:
            held.release()
            for socket in sockets:
                await socket.disconnect()
            await database_sync_to_async(lambda: connection.close())()
        page_threads.end_page_threads()

    asyncio.run(scenario())


def test_a_render_waits_for_its_accounts_turn_and_is_not_made_without_it(
    settings: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While the account's turn is held (as one of its requests would hold it), its live
    page gets no render: each waits ``USER_TURN_WAIT_SECONDS`` and is not made. Once the
    turn is free, the page's next render brings it up to the newest commit."""
    from controlplane.web.turns import account_turns

    settings.USER_TURN_WAIT_SECONDS = 0.3
    monkeypatch.setattr(pages, "render_budget", pages.RenderBudget())
    made: list[int] = []
    original = live.Tasks.update

    def counted(this: Any, seq: int, can_act: bool, **params: str) -> str:
        made.append(seq)
        return original(this, seq, can_act, **params)

    monkeypatch.setattr(live.Tasks, "update", counted)
    key = token("taker", "viewer")
    account = User.objects.get(username="taker").pk
    start = commit("start")

    async def scenario() -> None:
        socket = await opened(URLRouter(websocket_urlpatterns), key, "q=take", start)
        try:
            held = await asyncio.to_thread(account_turns.take, account, 5)
            assert held is not None
            made.clear()
            blocked = await database_sync_to_async(commit)("one")
            with pytest.raises(TimeoutError):
                await shown_within(socket, blocked, 1.5)
            assert made == []  # renders asked for, none made
            held.end()
            assert await shown(socket, blocked) == blocked
            assert made
        finally:
            await socket.disconnect()
            await database_sync_to_async(lambda: connection.close())()
        page_threads.end_page_threads()

    asyncio.run(scenario())
