"""Live pages render once per commit however many sockets show them (per page and role),
even when the sockets read at different moments: here without hints, every socket polls
the log on its own clock, the sockets opened a little apart."""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Callable, Iterator
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
from controlplane.sockets.routes import websocket_urlpatterns
from controlplane.ui import live
from controlplane.worker.runtime import runtime
from kernel import Draft, SessionHandle

pytestmark = pytest.mark.django_db(transaction=True)

PLAN = "email-plan"
COMMITS = 4
SOCKETS_PER_ROLE = 3
SHOWN = re.compile(r'id="feed-state" data-seq="(\d+)"')


@pytest.fixture(autouse=True)
def polling_only(settings: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    settings.CHANNEL_LAYERS = {}  # no hints: each socket reads on its own poll clock
    settings.FEED_POLL_SECONDS = 0.25
    settings.FEED_HEARTBEAT_SECONDS = 600
    monkeypatch.setattr(runtime().dispatcher, "deliver", lambda task, queue: None)
    with reserved_redis_url(settings.REDIS_URL) as url:  # the sockets' slots
        settings.REDIS_URL = url
        yield


def token(name: str, role: str) -> str:
    user = User.objects.create_user(name)
    user.groups.add(Group.objects.get_or_create(name=role)[0])
    return issue_token(user, "renders")


def commit(handle: SessionHandle, value: Any) -> None:
    draft = Draft(actor="user:ann")
    draft.set(PLAN, "doc", ["n"], value)
    handle.commit(draft)


def counted(monkeypatch: pytest.MonkeyPatch, owner: type, name: str) -> list[Any]:
    """Calls of ``owner.name`` that rendered something, by role."""
    made: list[Any] = []
    original = getattr(owner, name)
    lock = threading.Lock()

    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        found = original(self, *args, **kwargs)
        if found is not None:
            with lock:
                made.append(args[-1])  # can_act
        return found

    monkeypatch.setattr(owner, name, wrapper)
    return made


async def watch(path: str, tokens: list[str], after: int,
                commits: Callable[[int], Any], position: Callable[[], int]) -> None:
    """Open a socket per token (a little apart, so their poll clocks differ), then make
    each commit and wait until every socket shows it."""
    app = URLRouter(websocket_urlpatterns)
    sockets = []
    for key in tokens:
        socket = WebsocketCommunicator(app, path, headers=[
            (b"authorization", f"Bearer {key}".encode())])
        connected, _ = await socket.connect()
        assert connected
        await socket.send_json_to({"after": after})
        sockets.append(socket)
        await asyncio.sleep(0.25 / len(tokens))
    try:
        for i in range(COMMITS):
            await database_sync_to_async(commits)(i)
            target = await database_sync_to_async(position)()
            for socket in sockets:
                shown = 0
                while shown < target:
                    text = (await socket.receive_output(timeout=5))["text"]
                    shown = max([shown, *map(int, SHOWN.findall(text))])
                assert shown == target
    finally:
        for socket in sockets:
            await socket.disconnect()
        # The sockets' reads and the commits ran on the one database thread: its
        # connection must not outlive the test (the test database is dropped at the end).
        await database_sync_to_async(lambda: connection.close())()


def test_a_session_page_renders_once_per_commit_and_role(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    handle = runtime().kernel.create_session()
    commit(handle, "start")
    renders = counted(monkeypatch, live.SessionLivePage, "update")
    tokens = [token(f"v{i}", "viewer") for i in range(SOCKETS_PER_ROLE)] + [
        token(f"o{i}", "operator") for i in range(SOCKETS_PER_ROLE)]

    def head() -> int:
        return runtime().kernel.storage.session(handle.id).head_seq  # type: ignore[union-attr]

    asyncio.run(watch(f"/ws/ui/sessions/{handle.id}/", tokens, 1,
                      lambda i: commit(handle, i), head))
    # One render per commit for the viewers and one for the operators (action buttons),
    # not one per socket.
    assert sorted(renders) == [False] * COMMITS + [True] * COMMITS


def test_a_page_over_every_session_renders_once_per_commit_and_role(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    handle = runtime().kernel.create_session()
    commit(handle, "start")
    renders = counted(monkeypatch, live.LivePage, "update")
    tokens = [token(f"v{i}", "viewer") for i in range(SOCKETS_PER_ROLE)] + [
        token(f"o{i}", "operator") for i in range(SOCKETS_PER_ROLE)]
    asyncio.run(watch("/ws/ui/attention/", tokens, last_commit_id(),
                      lambda i: commit(handle, i), last_commit_id))
    assert sorted(renders) == [False] * COMMITS + [True] * COMMITS
