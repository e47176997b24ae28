"""The websocket change feeds in this process (channels' communicator, no hints: the
sockets poll the log): how a socket takes its cursor."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import Group, User
from django.db import connection
from django.utils import timezone

from controlplane.access import issue_token
from controlplane.models import ApiToken
from controlplane.sockets import feed as feed_sockets
from controlplane.sockets import pages as page_sockets
from controlplane.sockets.feed import BAD_REQUEST, ENDED, REFUSED, SessionFeedConsumer
from controlplane.sockets.routes import websocket_urlpatterns
from controlplane.worker.runtime import runtime
from kernel import Draft

from .clients import user_in
from .plan_documents import commit

pytestmark = pytest.mark.django_db(transaction=True)

APP = URLRouter(websocket_urlpatterns)


@pytest.fixture(autouse=True)
def polling(settings: Any) -> None:
    settings.CHANNEL_LAYERS = {}  # no hints: the sockets read the log every poll
    settings.FEED_POLL_SECONDS = 0.1
    settings.FEED_HEARTBEAT_SECONDS = 0.3


@pytest.fixture
def token() -> str:
    return issue_token(user_in("viewer", "vera"), "feed sockets")


def run(talk: Callable[[], Awaitable[Any]]) -> Any:
    async def talking() -> Any:
        try:
            return await talk()
        finally:
            await database_sync_to_async(lambda: connection.close())()

    return asyncio.run(talking())


async def opened(path: str) -> WebsocketCommunicator:
    socket = WebsocketCommunicator(APP, path)
    assert (await socket.connect())[0]
    return socket


async def close_of(socket: WebsocketCommunicator) -> dict[str, Any]:
    """What closes the socket within 5 s (frames before it are skipped)."""
    async with asyncio.timeout(5):
        while (out := await socket.receive_output(timeout=5))["type"] != "websocket.close":
            pass
    await socket.wait()
    return out


def test_a_cursor_in_the_url_starts_the_stream_once_the_first_message_authenticates(
    token: str,
) -> None:
    """The token comes in the first message, the cursor in the URL: the stream starts
    after that cursor as soon as the token is taken, not a close for want of a cursor."""
    handle = runtime().kernel.create_session()
    for i in range(3):
        commit(handle, i)

    async def talk() -> list[dict[str, Any]]:
        socket = await opened(f"/ws/sessions/{handle.id}/feed/?after=1")
        await socket.send_json_to({"token": token})
        frames = [await socket.receive_json_from(timeout=5) for _ in range(2)]
        await socket.disconnect()
        return frames

    assert [(f["type"], f["seq"]) for f in run(talk)] == [("commit", 2), ("commit", 3)]


def test_a_cursor_past_the_newest_position_is_refused(token: str) -> None:
    """A cursor this feed never sent (another database's, a made-up one) would be
    followed in silence, heartbeat after heartbeat, until the log passed it: 4400."""
    handle = runtime().kernel.create_session()
    made = [commit(handle, i) for i in range(3)]
    session = f"/ws/sessions/{handle.id}/feed/"

    async def closed(path: str, *messages: dict[str, Any]) -> dict[str, Any]:
        socket = await opened(path)
        for message in messages:
            await socket.send_json_to(message)
        return await close_of(socket)

    async def talk() -> list[Any]:
        refused = [
            await closed(session, {"token": token, "after": 4}),
            await closed(f"{session}?after=10", {"token": token}),
            await closed("/ws/feed/", {"token": token, "after": made[-1].id + 10**6}),
        ]
        # The head itself is a good cursor: the stream goes on from there.
        served = await opened(session)
        await served.send_json_to({"token": token, "after": 3})
        heartbeat = await served.receive_json_from(timeout=5)
        await served.disconnect()
        return [refused, heartbeat]

    refused, heartbeat = run(talk)
    assert [out["code"] for out in refused] == [BAD_REQUEST] * 3
    assert "past the newest seq (3)" in refused[0]["reason"]
    assert "past the newest id" in refused[2]["reason"]
    assert heartbeat == {"type": "heartbeat", "seq": 3}


def test_a_url_with_nul_or_a_message_nested_past_the_parser_is_refused(token: str) -> None:
    """What the database cannot hold in a URL (NUL, in a session id or a page's filter)
    and a message the JSON parser cannot read (nested past its depth) are refused with
    4400 saying why, as an HTTP request's are refused with 422, instead of the socket
    dying of the database's error or the parser's (or a page's live update failing as
    if the log could not be read, which a browser answers by reconnecting)."""
    handle = runtime().kernel.create_session()
    commit(handle, 0)
    deep = "[" * 100_000 + "]" * 100_000

    async def closed(path: str, *messages: str) -> dict[str, Any]:
        socket = WebsocketCommunicator(APP, path, headers=[
            (b"authorization", f"Bearer {token}".encode())])
        assert (await socket.connect())[0]
        for message in messages:
            await socket.send_to(text_data=message)
        return await close_of(socket)

    async def talk() -> list[dict[str, Any]]:
        return [
            await closed("/ws/sessions/a\x00b/feed/", '{"after": 0}'),
            await closed("/ws/ui/sessions/a\x00b/", '{"after": 0}'),
            await closed("/ws/ui/overview/?q=%00", '{"after": 0}'),
            await closed("/ws/ui/tasks/?kind=a%00b", '{"after": 0}'),
            await closed(f"/ws/sessions/{handle.id}/feed/", deep),
            await closed(f"/ws/ui/sessions/{handle.id}/", deep),
        ]

    refused = run(talk)
    assert [out["code"] for out in refused] == [BAD_REQUEST] * 6, refused
    assert all("NUL" in out["reason"] for out in refused[:4]), refused
    assert all("JSON" in out["reason"] for out in refused[4:]), refused


def test_a_message_with_a_field_the_feed_does_not_take_is_refused_naming_it(
    token: str,
) -> None:
    """A field the socket does not take (the URL's other spelling of the cursor,
    ``after_seq``, a typo) is refused with 4400 naming it, as the REST feed refuses an
    unknown parameter with 422, whether it comes first or once the stream runs: ignored,
    a cursor moved under another name would leave the client sent what it said it had,
    and a first message without ``after`` waited ten seconds for a close that did not
    say why."""
    handle = runtime().kernel.create_session()
    commit(handle, 0)
    session = f"/ws/sessions/{handle.id}/feed/"

    async def talk() -> list[dict[str, Any]]:
        first = await opened(session)
        await first.send_json_to({"token": token, "after_seq": 0})
        later = await opened(session)
        await later.send_json_to({"token": token, "after": 0})
        assert (await later.receive_json_from(timeout=5))["seq"] == 1
        await later.send_json_to({"after": 1, "batched": True})
        return [await close_of(first), await close_of(later)]

    refused = run(talk)
    assert [out["code"] for out in refused] == [BAD_REQUEST] * 2, refused
    assert "after_seq" in refused[0]["reason"] and "batched" in refused[1]["reason"]


class Hub:
    """Stands in for the process's HintHub: the test hands each socket its hints."""

    def __init__(self) -> None:
        self.followers: list[Callable[[dict[str, Any]], None]] = []

    async def follow(self, group: str, follower: Callable[[dict[str, Any]], None]) -> None:
        self.followers.append(follower)

    def unfollow(self, group: str, follower: Callable[[dict[str, Any]], None]) -> None:
        self.followers.remove(follower)


def test_a_hint_that_comes_while_a_replay_ends_is_not_lost(
    token: str, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The replay's last page was read ahead, while the page before it was being sent; a
    commit made after that read, hinted before the socket took the page, is sent at
    once, not a poll interval later."""
    settings.FEED_POLL_SECONDS = 30.0  # only a hint can make the socket read again soon
    settings.FEED_HEARTBEAT_SECONDS = 30.0
    monkeypatch.setattr(feed_sockets, "BATCH", 2)
    monkeypatch.setattr(feed_sockets, "REPLAY_BATCH", 2)
    hub = Hub()
    monkeypatch.setattr(feed_sockets, "hint_hub", lambda: hub)
    handle = runtime().kernel.create_session()
    for i in range(3):
        commit(handle, i)
    read, send_rows = SessionFeedConsumer.read, SessionFeedConsumer.send_rows

    async def read_then_commit(self: Any, after: int, limit: int) -> Any:
        rows = await read(self, after, limit)
        if after == 2:  # the page read ahead: a commit lands after it, and is hinted
            made = await database_sync_to_async(commit)(handle, "late")
            for follower in hub.followers:
                follower({"session_id": handle.id, "seq": made.seq})
        return rows

    async def slowly(self: Any, rows: Any) -> None:
        await asyncio.sleep(0.3)  # the read ahead ends while this page is sent
        await send_rows(self, rows)

    monkeypatch.setattr(SessionFeedConsumer, "read", read_then_commit)
    monkeypatch.setattr(SessionFeedConsumer, "send_rows", slowly)

    async def talk() -> list[int]:
        socket = await opened(f"/ws/sessions/{handle.id}/feed/")
        await socket.send_json_to({"token": token, "after": 0})
        seqs = [(await socket.receive_json_from(timeout=5))["seq"] for _ in range(4)]
        await socket.disconnect()
        return seqs

    assert run(talk) == [1, 2, 3, 4]


def test_a_page_socket_renders_by_the_role_its_account_holds_at_each_render(
    settings: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An operator demoted to viewer while their session page is open gets the next
    updates without action forms, also on the rows a commit did not change (made again
    for the role held now) and on a task made since; deactivated, the socket is closed
    with 4403; a page whose token is revoked is closed with 4401 at its next render. The
    feed's own re-check is put off past the test: these come from the renders."""
    settings.WEBSOCKET_RECHECK_SECONDS = 60
    monkeypatch.setattr(page_sockets, "ROLE_SECONDS", 0.0)
    olga, otto = user_in("operator", "olga"), user_in("operator", "otto")
    keys = issue_token(olga, "page"), issue_token(otto, "page")
    handle = runtime().kernel.create_session()
    draft = Draft(actor="user:test")
    task_id = draft.create_task("send-batch", {
        "recipients": ["a@example.com"], "subject": "s", "body": "b", "channel": "http"})
    handle.commit(draft)

    def demote(account: User) -> None:
        account.groups.set([Group.objects.get_or_create(name="viewer")[0]])

    def deactivate(account: User) -> None:
        account.is_active = False
        account.save(update_fields=["is_active"])

    def new_task() -> int:
        draft = Draft(actor="user:test")
        draft.create_task("send-batch", {
            "recipients": ["b@example.com"], "subject": "s", "body": "b", "channel": "http"})
        return int(runtime().kernel.open(handle.id).commit(draft).commit.seq)

    def touch() -> int:  # a commit that changes no task: a plan document
        return int(commit(runtime().kernel.open(handle.id), "touched").seq)

    async def update_at(socket: WebsocketCommunicator, seq: int) -> str:
        """The first update (not a heartbeat) showing ``seq``."""
        while True:
            text = str((await socket.receive_output(5))["text"])
            if f'data-seq="{seq}"' in text and not text.startswith('<span id="feed-state"'):
                return text

    async def talk() -> tuple[list[str], list[int | None]]:
        sockets = [await opened(f"/ws/ui/sessions/{handle.id}/") for _ in keys]
        for socket, key in zip(sockets, keys, strict=True):
            await socket.send_json_to({"token": key, "after": 0})
        shown = [await update_at(socket, 1) for socket in sockets]
        await database_sync_to_async(demote)(olga)
        shown.append(await update_at(sockets[0], await database_sync_to_async(touch)()))
        shown.append(await update_at(sockets[0], await database_sync_to_async(new_task)()))
        await database_sync_to_async(deactivate)(olga)
        await database_sync_to_async(ApiToken.objects.filter(user=otto).update)(
            revoked_at=timezone.now())
        await database_sync_to_async(touch)()
        closed: list[int | None] = []
        for socket in sockets:
            try:
                closed.append((await close_of(socket))["code"])
            except TimeoutError:  # left open
                closed.append(None)
                await socket.disconnect()
        return shown, closed

    shown, closed = run(talk)
    assert ["Cancel…" in text for text in shown] == [True, True, False, False], shown[-1]
    assert f'id="task-{task_id}"' in shown[2], shown[2][-2000:]
    assert closed == [REFUSED, ENDED]
