"""Per-account slots (controlplane.sockets.slots): counted in Redis, freed by their holders or by
expiry; a socket beyond its account's limit closed with 4429, a long-poll answered 429
with Retry-After."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from channels.db import database_sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.db import connection
from django.test import Client

from controlplane.access import issue_token
from controlplane.dev.ports import free_port, reserved_redis_url
from controlplane.sockets import slots
from controlplane.sockets.routes import websocket_urlpatterns
from controlplane.worker.runtime import runtime

from .clients import user_in
from .plan_documents import commit

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def own_redis(settings: Any) -> Iterator[str]:
    with reserved_redis_url(settings.REDIS_URL) as url:
        settings.REDIS_URL = url
        settings.USER_SOCKET_LIMIT = 3
        settings.USER_LONG_POLL_LIMIT = 1
        yield url


def held(url: str, kind: str, user_id: Any) -> int:
    return int(redis.Redis.from_url(url).zcard(slots.key(kind, user_id)))


def test_an_account_gets_its_limit_and_no_more_in_any_process(own_redis: str) -> None:
    async def first_process() -> list[slots.Slot | None]:
        return [await slots.take(slots.SOCKETS, 7) for _ in range(4)]

    taken = asyncio.run(first_process())
    assert [s is not None for s in taken] == [True, True, True, False]
    assert held(own_redis, slots.SOCKETS, 7) == 3

    async def second_process() -> tuple[Any, ...]:  # another event loop, another client
        refused = await slots.take(slots.SOCKETS, 7)
        other_account = await slots.take(slots.SOCKETS, 8)
        other_kind = await slots.take(slots.LONG_POLLS, 7)
        slot = taken[0]
        assert slot is not None
        await slot.release()
        await slot.release()  # twice is once
        return refused, other_account, other_kind, await slots.take(slots.SOCKETS, 7)

    refused, other_account, other_kind, after_release = asyncio.run(second_process())
    assert refused is None
    assert other_account is not None and other_kind is not None
    assert after_release is not None
    assert held(own_redis, slots.SOCKETS, 7) == 3


def test_a_dead_holders_slots_expire_and_a_live_holder_keeps_its_own(
    own_redis: str, settings: Any
) -> None:
    settings.USER_SLOT_SECONDS = 0.6

    async def run() -> tuple[Any, ...]:
        kept = await slots.take(slots.SOCKETS, 7)
        assert kept is not None
        keeper = asyncio.get_running_loop().create_task(kept.keep())
        dead = [await slots.take(slots.SOCKETS, 7) for _ in range(2)]  # never renewed
        full = await slots.take(slots.SOCKETS, 7)
        await asyncio.sleep(1.5)  # two and a half lifetimes of an unrenewed slot
        after = [await slots.take(slots.SOCKETS, 7) for _ in range(3)]
        keeper.cancel()
        return dead, full, after

    dead, full, after = asyncio.run(run())
    assert None not in dead and full is None
    # The dead holders' two slots are free again; the kept one is still held.
    assert [s is not None for s in after] == [True, True, False]


def test_without_redis_a_slot_is_granted_at_once(settings: Any) -> None:
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"

    async def run() -> list[slots.Slot | None]:
        return [await slots.take(slots.SOCKETS, 7) for _ in range(5)]

    began = time.monotonic()
    assert None not in asyncio.run(run())
    assert time.monotonic() - began < 2


def changes(client: Client, session_id: str, wait: float) -> Any:
    return client.get(f"/api/sessions/{session_id}/changes", {"after": 0, "wait": wait})


def test_a_long_poll_past_the_accounts_limit_is_answered_429(own_redis: str) -> None:
    session = runtime().kernel.create_session()
    vera, walt = user_in("viewer", "vera"), user_in("viewer", "walt")
    client, other = Client(), Client()
    client.force_login(vera)
    other.force_login(walt)

    async def hold() -> slots.Slot | None:  # vera's one long-poll, waiting elsewhere
        return await slots.take(slots.LONG_POLLS, vera.pk, 30)

    waiting = asyncio.run(hold())
    assert waiting is not None
    refused = changes(client, session.id, wait=5)
    assert refused.status_code == 429, refused.content
    assert refused["Retry-After"] == str(slots.RETRY_AFTER_SECONDS)
    assert "USER_LONG_POLL_LIMIT" in refused.json()["detail"]
    assert changes(client, session.id, wait=0).status_code == 200  # not a long-poll
    began = time.monotonic()
    assert changes(other, session.id, wait=0.3).status_code == 200  # another account
    assert time.monotonic() - began >= 0.3
    assert held(own_redis, slots.LONG_POLLS, walt.pk) == 0  # given back when answered

    asyncio.run(waiting.release())
    assert changes(client, session.id, wait=0.3).status_code == 200


def test_the_schema_documents_the_429_of_the_long_polls() -> None:
    paths = Client().get("/api/openapi.json").json()["paths"]
    for path in ("/api/sessions/{session_id}/changes", "/api/changes"):
        refused = paths[path]["get"]["responses"]["429"]
        assert "Retry-After" in refused["headers"] and "USER_LONG_POLL_LIMIT" in \
            refused["description"]


def test_sockets_past_the_accounts_limit_are_closed_with_4429_whatever_the_credential(
    own_redis: str, settings: Any,
) -> None:
    settings.CHANNEL_LAYERS = {}  # no hints needed: the sockets only open
    settings.USER_SOCKET_LIMIT = 2
    session = runtime().kernel.create_session()
    commit(session, "start")  # something to replay: a socket that is served says so
    user = user_in("viewer", "vera")
    key = issue_token(user, "sockets")
    app = URLRouter(websocket_urlpatterns)
    path = f"/ws/sessions/{session.id}/feed/"

    async def opened(by_header: bool) -> WebsocketCommunicator:
        headers = [(b"authorization", f"Bearer {key}".encode())] if by_header else []
        socket = WebsocketCommunicator(app, path, headers=headers)
        assert (await socket.connect())[0]
        await socket.send_json_to({"after": 0} if by_header else {"token": key, "after": 0})
        return socket

    async def run() -> tuple[Any, ...]:
        first, second = await opened(True), await opened(False)
        for socket in (first, second):
            assert (await socket.receive_json_from(timeout=5))["type"] == "commit"
        third = await opened(False)
        refused = await third.receive_output(timeout=5)
        await first.disconnect()
        await asyncio.sleep(0.2)  # its slot is given back as it closes
        fourth = await opened(True)
        served = await fourth.receive_json_from(timeout=5)
        for socket in (second, fourth):
            await socket.disconnect()
        await database_sync_to_async(lambda: connection.close())()
        return refused, served

    refused, served = asyncio.run(run())
    assert refused["type"] == "websocket.close" and refused["code"] == slots.TOO_MANY_SOCKETS
    assert "2 sockets open" in refused["reason"]
    assert served["type"] == "commit"
    assert held(own_redis, slots.SOCKETS, user.pk) == 0
