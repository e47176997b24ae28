"""Two web processes behind one address (issue 14, points 2 and 3).

Two real Daphne processes share the database and the Redis channel layer, as the
replicas behind the proxy do (deploy/compose.yaml). They serve the same pages and API
answers, and a feed client moved from one to the other mid-stream (a proxy that sends
its reconnect elsewhere, a deploy) resumes from its last seq and sees every commit of
the stream exactly once, on the session feed (by seq) and the global feed (by id).
A web process stopped with SIGTERM closes its sockets with 4503 (server stopping); the
client reconnects to the other one from its cursor without a missed or repeated frame.

Commits are made here while the client reads, through ``runtime().kernel``, so their
hints reach both servers through Redis as a worker's would.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from controlplane.dev.ports import reserved_redis_url
from controlplane.dev.processes import running
from controlplane.worker.runtime import runtime
from kernel import Draft, SessionHandle

from .server import Daphne, daphne_env, database_url_of_tests

pytestmark = [
    pytest.mark.django_db(transaction=True), pytest.mark.slow,
    pytest.mark.usefixtures("hints_here"),
]
COMMITS = 60


@pytest.fixture
def redis_url() -> Iterator[str]:
    with reserved_redis_url(settings.REDIS_URL) as url:
        yield url


@pytest.fixture
def pair(tmp_path: Path, redis_url: str) -> Iterator[tuple[Daphne, Daphne]]:
    env = daphne_env(database_url_of_tests(), redis_url, FEED_POLL_SECONDS="0.5")
    with running(Daphne(tmp_path / "a.log", env), Daphne(tmp_path / "b.log", env)) as (a, b):
        yield a, b  # type: ignore[misc]


def commit(handle: SessionHandle, value: int) -> Any:
    draft = Draft(actor="user:ann")
    draft.set("email-plan", "doc", ["n"], value)
    return handle.commit(draft).commit


def commit_in_background(handle: SessionHandle, count: int) -> threading.Thread:
    """``count`` commits, 20 ms apart, while the client reads (a thread of its own)."""
    def run() -> None:
        from django.db import connection

        try:
            for i in range(count):
                commit(handle, i)
                time.sleep(0.02)
        finally:
            connection.close()

    thread = threading.Thread(target=run, name="committer")
    thread.start()
    return thread


class Client:
    """A feed client that reads ``count`` commits from a server, then moves on with its
    cursor; what it received, in order."""

    def __init__(self, path: str, token: str, cursor: str) -> None:
        self.path, self.token, self.cursor = path, token, cursor
        self.last = 0
        self.received: list[int] = []

    def read(self, server: Daphne, count: int | None = None, until: int | None = None) -> int:
        """Read from ``server`` until ``count`` commits came, ``until`` was reached, or the
        server closed; returns the close code (None: the client left)."""
        with connect(f"{server.ws}{self.path}", open_timeout=10, close_timeout=2) as ws:
            ws.send(json.dumps({"token": self.token, "after": self.last}))
            got = 0
            try:
                while (count is None or got < count) and (until is None or self.last < until):
                    frame = json.loads(ws.recv(timeout=15))
                    if frame["type"] != "commit":
                        continue
                    self.received.append(frame[self.cursor])
                    self.last = frame[self.cursor]
                    got += 1
            except ConnectionClosed as closed:
                return closed.rcvd.code if closed.rcvd is not None else 1006
        return None


def exactly_once(received: list[int], expected: list[int]) -> None:
    assert received == expected, (
        f"missing {sorted(set(expected) - set(received))}, "
        f"repeated {sorted({r for r in received if received.count(r) > 1})}")


def get_json(url: str, token: str) -> Any:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read())


def test_a_feed_client_moved_between_two_web_processes_sees_each_commit_once(
    pair: tuple[Daphne, Daphne], token: str
) -> None:
    a, b = pair
    handle = runtime().kernel.create_session()
    committer = commit_in_background(handle, COMMITS)
    session = Client(f"/ws/sessions/{handle.id}/feed/", token, "seq")
    everything = Client("/ws/feed/", token, "id")
    try:
        # Back and forth mid-stream, each time from the last seq seen.
        for server, count in ((a, 10), (b, 15), (a, 10), (b, None)):
            session.read(server, count=count, until=COMMITS)
    finally:
        committer.join()
    exactly_once(session.received, list(range(1, COMMITS + 1)))

    ids = [c.id for c in runtime().kernel.storage.commits_after(handle.id, 0, COMMITS)]
    first_id = ids[0] - 1
    everything.last = first_id
    for server, count in ((b, 20), (a, 20), (b, None)):
        everything.read(server, count=count, until=ids[-1])
    exactly_once([i for i in everything.received if i in set(ids)], ids)
    assert everything.received == sorted(set(everything.received))  # in order, no repeat

    # The same answers from either process: the API's session and its tasks page.
    for path in (f"/api/sessions/{handle.id}", f"/api/sessions/{handle.id}/changes?after=50"):
        assert get_json(f"{a.http}{path}", token) == get_json(f"{b.http}{path}", token)


def test_sigterm_to_a_web_process_closes_its_sockets_and_the_client_resumes_elsewhere(
    pair: tuple[Daphne, Daphne], token: str
) -> None:
    a, b = pair
    handle = runtime().kernel.create_session()
    client = Client(f"/ws/sessions/{handle.id}/feed/", token, "seq")
    committer = commit_in_background(handle, COMMITS)
    closed: list[int | None] = []
    try:
        reader = threading.Thread(target=lambda: closed.append(client.read(a)))
        reader.start()
        while client.last < 15 and reader.is_alive():
            time.sleep(0.01)
        a.terminate()  # a deploy stops it: SIGTERM
        reader.join(timeout=20)
        assert not reader.is_alive(), "the socket stayed open after SIGTERM"
        assert a.popen.wait(timeout=20) == 0
        client.read(b, until=COMMITS)
    finally:
        committer.join()
    assert closed == [4503], "a close frame saying the server stops"
    exactly_once(client.received, list(range(1, COMMITS + 1)))
