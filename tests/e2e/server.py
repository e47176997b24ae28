"""A real Daphne process serving the project, and a websocket feed client for tests.

pytest-django's ``live_server`` speaks no websockets (DESIGN §13), so the feed is tested
against ``daphne controlplane.asgi:application`` in a subprocess, pointed at the test
database and at a Redis database of its own for the channel layer.
"""

from __future__ import annotations

import json
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from django.conf import settings
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from controlplane.dev import processes
from controlplane.dev.ports import free_port, reserved_redis_url
from controlplane.dev.processes import Process, process_env
from controlplane.process.entrypoint import command
from tests.databases import url_of_test_database

database_url_of_tests = url_of_test_database


def channel_layers(redis_url: str, capacity: int = 100) -> dict[str, Any]:
    """CHANNEL_LAYERS for this process, matching what a server started with ``redis_url``
    and ``CHANNEL_LAYER_CAPACITY=capacity`` uses."""
    config = dict(settings.CHANNEL_LAYERS["default"]["CONFIG"])
    config.update(hosts=[redis_url], capacity=capacity)
    return {"default": {**settings.CHANNEL_LAYERS["default"], "CONFIG": config}}


class Daphne(processes.Daphne):
    """The project's Daphne with the settings' websocket timeout, as the demo runs it;
    start it again after a kill and it listens on the same port."""

    def __init__(self, log: Path, env: dict[str, str]) -> None:
        super().__init__(log, env, websocket_timeout=settings.DAPHNE_WEBSOCKET_TIMEOUT)


def hints_from_here(settings: Any, redis_url: str, monkeypatch: Any) -> None:
    """Hints from this process's commits go to the servers' Redis database; no Celery."""
    from controlplane.worker.runtime import runtime

    settings.CHANNEL_LAYERS = channel_layers(redis_url)
    monkeypatch.setattr(runtime().dispatcher, "deliver", lambda task, queue: None)


def viewer_token(username: str = "vic") -> str:
    """An API token of a new account with the viewer role."""
    from django.contrib.auth.models import Group, User

    from controlplane.access import issue_token

    user = User.objects.create_user(username)
    user.groups.add(Group.objects.get_or_create(name="viewer")[0])
    return issue_token(user, "e2e")


def daphne_env(database_url: str, redis_url: str, **extra: str) -> dict[str, str]:
    return process_env(database_url, redis_url, DJANGO_DEBUG="0", **extra)


@contextmanager
def daphne_alone(log: Path, **extra: str) -> Iterator[Daphne]:
    """A Daphne on the test database and a Redis database of its own, without workers:
    enough to open sockets."""
    with reserved_redis_url(settings.REDIS_URL) as redis_url:
        server = Daphne(log, daphne_env(url_of_test_database(), redis_url, **extra))
        server.start()
        try:
            yield server
        finally:
            server.kill()


class Feed:
    """A websocket feed client: commit frames in arrival order, heartbeats aside."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.heartbeats: list[dict[str, Any]] = []
        self.batches: list[int] = []  # the size of each ``commits`` frame received
        self._unread: list[dict[str, Any]] = []

    def frame(self, timeout: float = 15.0) -> dict[str, Any]:
        return dict(json.loads(self.ws.recv(timeout=timeout)))

    def commit(self, timeout: float = 15.0) -> dict[str, Any]:
        """The next commit, whether it came in a frame of its own or in a batch."""
        while not self._unread:
            frame = self.frame(timeout)
            if frame["type"] == "heartbeat":
                self.heartbeats.append(frame)
            elif frame["type"] == "commits":
                self.batches.append(len(frame["commits"]))
                self._unread.extend(frame["commits"])
            else:
                assert frame["type"] == "commit", frame
                return frame
        return self._unread.pop(0)

    def commits(self, count: int, timeout: float = 15.0) -> list[dict[str, Any]]:
        return [self.commit(timeout) for _ in range(count)]

    def heartbeat(self, timeout: float = 15.0) -> dict[str, Any]:
        """The next frame, which must be a heartbeat (no commit frame in between)."""
        frame = self.frame(timeout)
        assert frame["type"] == "heartbeat", frame
        return frame

    def closed_with(self, timeout: float = 15.0) -> int | None:
        """Read until the server closes; the close code."""
        try:
            while True:
                self.ws.recv(timeout=timeout)
        except ConnectionClosed as closed:
            return closed.rcvd.code if closed.rcvd is not None else None


@contextmanager
def feed(
    url: str, *, first: dict[str, Any] | None = None, token: str | None = None,
    **connect_args: Any,
) -> Iterator[Feed]:
    """Connect to ``url`` (with ``token`` as an ``Authorization: Bearer`` header, never in
    the URL); send ``first`` (cursor and/or token) in-band on opening."""
    if token is not None:
        headers = dict(connect_args.pop("additional_headers", None) or {})
        connect_args["additional_headers"] = {**headers, "Authorization": f"Bearer {token}"}
    with connect(url, open_timeout=10, close_timeout=2, **connect_args) as ws:
        if first is not None:
            # A socket the server refuses (a revoked token) may be closed before this
            # goes: the close is what the test reads next (Feed.closed_with).
            with suppress(ConnectionClosed):
                ws.send(json.dumps(first))
        yield Feed(ws)


@contextmanager
def web_role(tmp_path: Path, port: int | None = None, **extra: str) -> Iterator[str]:
    """The image's web role (controlplane.process.entrypoint: Daphne, production settings) on
    the test database and a Redis database of its own; its base URL."""
    port = port or free_port()
    with reserved_redis_url(settings.REDIS_URL) as redis_url:
        env = process_env(
            url_of_test_database(), redis_url, DJANGO_DEBUG="0",
            DJANGO_SECRET_KEY="web-role-test-" + uuid.uuid4().hex * 2,
            DJANGO_ALLOWED_HOSTS="127.0.0.1", WEB_BIND="127.0.0.1", PORT=str(port),
            **extra,
        )
        env.pop("DJANGO_SETTINGS_MODULE", None)  # the product's settings, as deployed
        base = f"http://127.0.0.1:{port}"

        def alive() -> bool:
            try:
                with urllib.request.urlopen(f"{base}/healthz", timeout=1) as answer:
                    return bool(answer.status == 200)
            except OSError:
                return False

        argv = command("web", env=env)
        web = Process("web", [sys.executable, *argv[1:]], log=tmp_path / "web.log", env=env,
                      ready_check=alive)
        web.start()
        try:
            yield base
        finally:
            web.stop()
