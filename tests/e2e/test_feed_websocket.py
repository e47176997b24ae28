"""The websocket change feed against a real Daphne process, with a plain websocket client.

Commits are made here, through ``runtime().kernel``, so their after-commit hints come
from this process's publisher through Redis, as they would from a Celery worker. The
server and this process share a Redis database reserved for the module.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.utils import timezone
from websockets.exceptions import ConnectionClosed, InvalidStatus

from controlplane.access import digest, issue_token
from controlplane.commands import revoke_token
from controlplane.dev.ports import free_port
from controlplane.dev.processes import running, wait_for
from controlplane.models import ApiToken
from controlplane.sockets.notify import session_group
from controlplane.worker.runtime import runtime
from kernel import Draft, Preview, SessionHandle
from kernel.retention import RetentionPolicy

from .server import (
    Daphne,
    Feed,
    channel_layers,
    daphne_env,
    database_url_of_tests,
    feed,
)

pytestmark = [
    pytest.mark.django_db(transaction=True), pytest.mark.slow,
    pytest.mark.usefixtures("hints_here"),
]

PLAN = "email-plan"  # a document kind the project registers
# Short intervals, so that the fallbacks are exercised within the test's time.
METRICS_TOKEN = "e2e-prometheus"
FAST = {"FEED_POLL_SECONDS": "0.5", "FEED_HEARTBEAT_SECONDS": "1",
        "WEBSOCKET_RECHECK_SECONDS": "0.5", "METRICS_TOKEN": METRICS_TOKEN}
# REST long-polls read the log only every 30 s: an early answer comes from a hint.
SLOW_LONG_POLL = {"FEED_LONG_POLL_SECONDS": "30"}


@pytest.fixture(scope="module")
def database_url(django_db_setup: None, django_db_blocker: Any) -> str:
    with django_db_blocker.unblock():
        return database_url_of_tests()


@pytest.fixture(scope="module")
def servers(
    database_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Daphne, ...]]:
    """Three servers, started side by side: the default one; one whose channel layer has
    a capacity of 1 (channels_redis drops what does not fit); one whose Redis is gone."""
    logs = tmp_path_factory.mktemp("daphne")
    default = Daphne(
        logs / "default.log", daphne_env(database_url, redis_url, **FAST, **SLOW_LONG_POLL)
    )
    env = daphne_env(database_url, redis_url, CHANNEL_LAYER_CAPACITY="1", **FAST)
    no_redis = daphne_env(database_url, f"redis://127.0.0.1:{free_port()}/0", **FAST)
    with running(
        default, Daphne(logs / "capacity-1.log", env), Daphne(logs / "no-redis.log", no_redis)
    ) as started:
        yield started


@pytest.fixture
def server(servers: tuple[Daphne, ...]) -> Daphne:
    return servers[0]


def commit(handle: SessionHandle, value: Any) -> Any:
    draft = Draft(actor="user:ann")
    draft.set(PLAN, "doc", ["n"], value)
    return handle.commit(draft).commit


def commits(handle: SessionHandle, count: int) -> list[Any]:
    return [commit(handle, i) for i in range(count)]


def session_feed(server: Daphne, handle: SessionHandle) -> str:
    return f"{server.ws}/ws/sessions/{handle.id}/feed/"


def seqs(frames: list[dict[str, Any]]) -> list[int]:
    return [f["seq"] for f in frames]


def test_replay_then_live_then_resume_after_a_disconnect(server: Daphne, token: str) -> None:
    handle = runtime().kernel.create_session()
    made = commits(handle, 3)
    with feed(session_feed(server, handle), token=token, first={"after": 0}) as client:
        replayed = client.commits(3)
        assert seqs(replayed) == [1, 2, 3]
        assert [(f["id"], f["session_id"], f["actor"]) for f in replayed] == [
            (c.id, handle.id, "user:ann") for c in made
        ]
        assert replayed[0]["summary"] == made[0].summary and replayed[0]["at"]
        commits(handle, 5)
        last = client.commits(5)[-1]["seq"]
        assert last == 8

    while_away = commits(handle, 200)
    with feed(session_feed(server, handle), token=token, first={"after": last}) as client:
        resumed = client.commits(200)
        assert seqs(resumed) == list(range(9, 209))
        assert [f["id"] for f in resumed] == [c.id for c in while_away]
        commits(handle, 2)
        assert seqs(client.commits(2)) == [209, 210]
        # Nothing else was sent: the next frame is a heartbeat at the last seq.
        assert client.heartbeat(timeout=5) == {"type": "heartbeat", "seq": 210}


def test_a_client_may_take_its_catch_up_in_batched_frames(server: Daphne, token: str) -> None:
    handle = runtime().kernel.create_session()
    made = commits(handle, 1200)
    first = {"after": 7, "batch": True}
    with feed(session_feed(server, handle), token=token, first=first) as client:
        caught_up = client.commits(1193)
        assert seqs(caught_up) == list(range(8, 1201))
        assert [f["id"] for f in caught_up] == [c.id for c in made[7:]]
        assert len(client.batches) < 10 and max(client.batches) > 1
        commits(handle, 2)
        assert seqs(client.commits(2)) == [1201, 1202]  # live ones too, batched or not
        assert client.heartbeat(timeout=5) == {"type": "heartbeat", "seq": 1202}
    with feed(session_feed(server, handle), token=token, first={"after": 0, "batch": 1}) as client:
        assert client.closed_with() == 4400


def test_a_cursor_behind_retention_gets_a_snapshot_then_live_frames(
    server: Daphne, token: str
) -> None:
    """Retention removed the session's commits (kernel.retention): a socket whose cursor
    is below the marker gets one snapshot frame of the session at its head, alone even
    when it asked for batches, then the commits after it, live."""
    handle = runtime().kernel.create_session(metadata={"retention_days": 0})
    commits(handle, 3)
    report = runtime().kernel.storage.prune(RetentionPolicy(), timezone.now())
    assert report.sessions == 1
    assert runtime().kernel.storage.session(handle.id).pruned_seq == 3
    for first in ({"after": 1}, {"after": 0, "batch": True}):
        head = runtime().kernel.storage.session(handle.id).head_seq
        with feed(session_feed(server, handle), token=token, first=first) as client:
            snapshot = client.frame()
            assert snapshot["type"] == "snapshot", snapshot
            assert (snapshot["session_id"], snapshot["seq"], snapshot["pruned_seq"]) == (
                handle.id, head, 3)
            assert [d["version"] for d in snapshot["documents"]] == [snapshot["seq"]]
            made = commit(handle, "live")
            assert [c["seq"] for c in client.commits(1)] == [made.seq]
            assert client.batches == ([1] if first.get("batch") else [])


def test_previews_reach_the_session_feed_outside_the_seq_order(
    server: Daphne, token: str
) -> None:
    """Progress that is not committed (kernel.Preview) goes from the process that made it
    to live sockets at once; the page socket shows it escaped until the next commit."""
    kernel = runtime().kernel
    handle = kernel.create_session()
    commit(handle, "start")
    text = "<b>partial</b> answer"
    with feed(session_feed(server, handle), token=token, first={"after": 1}) as client, feed(
        f"{server.ws}/ws/ui/sessions/{handle.id}/", token=token, first={"after": 1}
    ) as page:
        assert client.heartbeat(timeout=5)["seq"] == 1  # following, nothing to replay
        kernel.publish_preview(Preview(handle.id, "task_x", "agent-progress", "task_x",
                                       ("text",), "stale"))
        kernel.publish_preview(Preview(handle.id, "task_x", "agent-progress", "task_x",
                                       ("text",), text))
        previews = [client.frame(timeout=5)]
        while previews[-1]["value"] != text:
            previews.append(client.frame(timeout=5))
        assert previews[-1] == {"type": "preview", "task_id": "task_x", "kind": "agent-progress",
                                "key": "task_x", "path": ["text"], "value": text, "after": 0}
        shown = page.ws.recv(timeout=5)
        while "&lt;b&gt;partial&lt;/b&gt; answer" not in shown:
            shown = page.ws.recv(timeout=5)
        assert 'id="previews"' in shown and "<b>" not in shown
        commit(handle, "folded")
        assert seqs(client.commits(1)) == [2]  # the seq order is untouched
        while 'id="previews"' not in (shown := page.ws.recv(timeout=5)) or "task_x" in shown:
            pass  # the commit's update, then the previews it holds leave the page


def test_metrics_count_the_sockets_this_server_serves(server: Daphne, token: str) -> None:
    def subscribers() -> float:
        scrape = urllib.request.Request(
            f"{server.http}/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
        with urllib.request.urlopen(scrape, timeout=10) as answer:
            text = answer.read().decode()
        found = re.search(r"^durable_feed_subscribers (\S+)$", text, re.M)
        assert found, text
        return float(found.group(1))

    handle = runtime().kernel.create_session()
    before = subscribers()
    with feed(session_feed(server, handle), token=token, first={"after": 0}) as one, feed(
        f"{server.ws}/ws/feed/", token=token, first={"after": 0}
    ):
        one.heartbeat(timeout=5)
        assert subscribers() == before + 2
    wait_for(lambda: subscribers() == before, "the closed sockets to be counted out")


def test_the_cursor_in_the_url_and_a_later_in_band_cursor(server: Daphne, token: str) -> None:
    """``?after=`` starts at once; an in-band cursor (a page that reconnects with the URL
    it was rendered with) moves the stream forward, never back."""
    handle = runtime().kernel.create_session()
    commits(handle, 4)
    with feed(session_feed(server, handle) + "?after=2", token=token) as client:
        assert seqs(client.commits(2)) == [3, 4]
        client.ws.send('{"after": 6}')
        client.ws.send('{"after": 1}')
        # Heartbeats carry the cursor: wait until the server has taken the new one.
        while client.heartbeat(timeout=5)["seq"] != 6:
            pass
        commits(handle, 3)  # seqs 5, 6 are skipped: the client said it has them
        assert seqs(client.commits(1)) == [7]


def test_the_global_feed_streams_every_session_in_id_order(server: Daphne, token: str) -> None:
    kernel = runtime().kernel
    a, b = kernel.create_session(), kernel.create_session()
    start = commit(a, 0).id
    with feed(f"{server.ws}/ws/feed/", first={"token": token, "after": start}) as client:
        made = [commit(a, 1), commit(b, 1), commit(b, 2), commit(a, 2)]
        frames = client.commits(4)
        assert [(f["id"], f["session_id"], f["seq"]) for f in frames] == [
            (c.id, c.session_id, c.seq) for c in made
        ]
        assert client.heartbeat(timeout=5) == {"type": "heartbeat", "id": made[-1].id}


def test_a_rest_long_poll_reads_again_on_the_hint(
    server: Daphne, token: str, redis_url: str
) -> None:
    handle = runtime().kernel.create_session()
    commit(handle, 0)
    answer: dict[str, Any] = {}

    def ask() -> None:
        request = urllib.request.Request(
            f"{server.http}/api/sessions/{handle.id}/changes?after=1&wait=25",
            headers={"Authorization": f"Bearer {token}"},
        )
        with urllib.request.urlopen(request, timeout=40) as response:
            answer["page"] = json.loads(response.read())
            answer["at"] = time.monotonic()

    asking = threading.Thread(target=ask)
    asking.start()
    group = f"asgi:group:{session_group(handle.id)}"  # channels_redis's key for the group
    wait_for(lambda: redis.Redis.from_url(redis_url).zcard(group), "the long-poll to follow")
    landed = commit(handle, 1)
    landed_at = time.monotonic()
    asking.join(30)
    assert [(c["seq"], c["id"]) for c in answer["page"]["changes"]] == [(2, landed.id)]
    assert answer["at"] - landed_at < 5, "answered by the 30 s poll, not by the hint"


def test_who_may_subscribe(server: Daphne, token: str) -> None:
    handle = runtime().kernel.create_session()
    commits(handle, 1)
    url = f"{server.ws}/ws/sessions/{handle.id}/feed/"
    with feed(url, first={"after": 0}) as anonymous:
        assert anonymous.closed_with() == 4403
    with feed(url, first={"token": "dcp_wrong", "after": 0}) as wrong:
        assert wrong.closed_with() == 4403
    nobody = User.objects.create_user("nora")
    with feed(url, first={"token": issue_token(nobody, "e2e"), "after": 0}) as roleless:
        assert roleless.closed_with() == 4403
    with feed(f"{server.ws}/ws/sessions/sess_nope/feed/?after=0", token=token) as missing:
        assert missing.closed_with() == 4404
    with feed(url, first={"token": token, "after": "soon"}) as bad:
        assert bad.closed_with() == 4400
    with feed(url, first={"token": token}) as in_band:  # token first, cursor later
        in_band.ws.send('{"after": 0}')
        assert seqs(in_band.commits(1)) == [1]

    # A browser: its Django session cookie, and an Origin among ALLOWED_HOSTS.
    browser = Client()
    browser.force_login(User.objects.get(username="vic"))
    cookie = {"Cookie": f"sessionid={browser.cookies['sessionid'].value}"}
    with feed(url, first={"after": 0}, origin=server.http, additional_headers=cookie) as page:
        assert seqs(page.commits(1)) == [1]
    with (
        pytest.raises(InvalidStatus) as refused,
        feed(url, origin="http://evil.example", additional_headers=cookie),
    ):
        pass
    assert refused.value.response.status_code == 403


def test_a_token_is_taken_from_a_header_or_the_first_message_never_from_the_url(
    server: Daphne, token: str
) -> None:
    handle = runtime().kernel.create_session()
    commits(handle, 1)
    url = session_feed(server, handle)
    with feed(f"{url}?token={token}&after=0") as in_the_url:
        assert in_the_url.closed_with() == 4400
    with feed(url, token=token, first={"after": 0}) as header:
        assert seqs(header.commits(1)) == [1]
    with feed(url, first={"token": token, "after": 0}) as first_message:
        assert seqs(first_message.commits(1)) == [1]


def test_open_sockets_close_soon_after_a_revocation_an_expiry_a_logout_or_a_lost_role(
    server: Daphne, token: str
) -> None:
    """Each socket re-checks its credential every WEBSOCKET_RECHECK_SECONDS (0.5 s here):
    4401 when the token or the login session ended, 4403 when the role went away."""
    handle = runtime().kernel.create_session()
    commits(handle, 1)
    url = session_feed(server, handle)

    def closes_within(client: Feed, code: int, seconds: float = 5.0) -> None:
        started = time.monotonic()
        assert client.closed_with(timeout=seconds + 5) == code
        assert time.monotonic() - started < seconds

    with feed(url, token=token, first={"after": 0}) as client:
        assert seqs(client.commits(1)) == [1]
        revoke_token(None, ApiToken.objects.get(digest=digest(token)).pk)
        closes_within(client, 4401)
    with feed(url, token=token, first={"after": 0}) as again:
        assert again.closed_with() == 4403  # a revoked token opens nothing

    vic = User.objects.get(username="vic")
    soon = issue_token(vic, "short", timezone.now() + timedelta(seconds=2))
    with feed(url, token=soon, first={"after": 0}) as client:
        assert seqs(client.commits(1)) == [1]
        closes_within(client, 4401)

    def browser_socket(browser: Client) -> Any:
        cookie = {"Cookie": f"sessionid={browser.cookies['sessionid'].value}"}
        return feed(url, first={"after": 0}, origin=server.http, additional_headers=cookie)

    browser = Client()
    browser.force_login(vic)
    with browser_socket(browser) as page:
        assert seqs(page.commits(1)) == [1]
        browser.post("/accounts/logout/")
        closes_within(page, 4401)

    browser.force_login(vic)
    with browser_socket(browser) as page:
        assert seqs(page.commits(1)) == [1]
        vic.groups.clear()
        closes_within(page, 4403)


def test_dropped_hints_are_refilled_from_the_log(
    servers: tuple[Daphne, ...],
    redis_url: str,
    token: str,
    settings: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """channels_redis at capacity 1 drops hints; with the server suspended (SIGSTOP)
    nearly all of them. Then no hint at all: this process publishes to another Redis
    database. Every client still gets every commit once, in order, from the log."""
    server = servers[1]
    settings.CHANNEL_LAYERS = channel_layers(redis_url, capacity=1)
    caplog.set_level(logging.INFO, logger="channels_redis.core")
    kernel = runtime().kernel
    handle = kernel.create_session()
    start = commit(handle, 0).id
    url = session_feed(server, handle)
    with (
        feed(url, token=token, first={"after": 1}) as one,
        feed(url, token=token, first={"after": 1}) as two,
        feed(url, token=token, first={"after": 0}) as three,
        feed(f"{server.ws}/ws/feed/", token=token, first={"after": start}) as everything,
    ):
        assert seqs(three.commits(1)) == [1]
        commits(handle, 1)
        for client in (one, two, three):
            assert seqs(client.commits(1)) == [2]
        assert len(everything.commits(1)) == 1

        server.suspend()
        try:
            made = commits(handle, 60)
            wait_for(lambda: "over capacity" in caplog.text, "a hint to be dropped")
        finally:
            server.resume()
        for client in (one, two, three):
            assert seqs(client.commits(60)) == list(range(3, 63))
        assert [f["id"] for f in everything.commits(60)] == [c.id for c in made]

        base, db = redis_url.rsplit("/", 1)
        settings.CHANNEL_LAYERS = channel_layers(f"{base}/{int(db) % 15 + 1}", capacity=1)
        made = commits(handle, 30)
        for client in (one, two, three):
            assert seqs(client.commits(30)) == list(range(63, 93))
            assert client.heartbeat(timeout=5)["seq"] == 92
        assert [f["id"] for f in everything.commits(30)] == [c.id for c in made]


def test_without_redis_the_feed_is_served_by_polling(
    servers: tuple[Daphne, ...], token: str
) -> None:
    """The server's Redis is unreachable: no hint ever arrives and joining the group
    fails, yet the socket stays up and every commit comes, from the log."""
    server = servers[2]
    handle = runtime().kernel.create_session()
    commits(handle, 3)
    with feed(session_feed(server, handle), token=token, first={"after": 0}) as client:
        assert seqs(client.commits(3)) == [1, 2, 3]
        for n in range(4, 7):
            commit(handle, n)
            assert seqs(client.commits(1)) == [n]
        assert client.heartbeat(timeout=5)["seq"] == 6
    assert "channel layer unavailable" in server.output()


def test_a_server_restart_mid_stream_loses_and_repeats_nothing(
    server: Daphne, token: str
) -> None:
    """Kill -9 the server while commits stream, start it again: the client resumes from
    its cursor. (Last in this module: it restarts the module's server.)"""
    handle = runtime().kernel.create_session()
    commits(handle, 5)
    received: list[dict[str, Any]] = []
    committed = threading.Event()

    def keep_committing() -> None:
        try:
            commits(handle, 150)
            committed.set()
        finally:
            connection.close()

    with feed(session_feed(server, handle), token=token, first={"after": 0}) as client:
        received += client.commits(5)
        writer = threading.Thread(target=keep_committing)
        writer.start()
        while received[-1]["seq"] < 25:
            received.append(client.commit())
        server.kill()
        received += drain(client)
    assert not committed.is_set(), "the server was not killed mid-stream"
    server.start()
    writer.join(30)
    assert committed.is_set()
    last = received[-1]["seq"]
    with feed(session_feed(server, handle), token=token, first={"after": last}) as client:
        received += client.commits(155 - received[-1]["seq"])
        commit(handle, "after")
        received.append(client.commit())
        assert client.heartbeat(timeout=5)["seq"] == 156
    assert seqs(received) == list(range(1, 157))


def drain(client: Feed) -> list[dict[str, Any]]:
    """The commit frames that were on their way when the server died."""
    frames = []
    try:
        while True:
            frames.append(client.commit(timeout=10))
    except ConnectionClosed:
        return frames
