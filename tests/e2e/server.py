"""A real Daphne process serving the project, and a websocket feed client for tests.

pytest-django's ``live_server`` speaks no websockets (DESIGN §13), so the feed is tested
against ``daphne controlplane.asgi:application`` in a subprocess, pointed at the test
database and at a Redis database of its own for the channel layer.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from tests.chaos.harness import ROOT, wait_for
from tests.databases import url_of_test_database

DAPHNE = str(Path(sys.executable).parent / "daphne")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


database_url_of_tests = url_of_test_database


def channel_layers(redis_url: str, capacity: int = 100) -> dict[str, Any]:
    """CHANNEL_LAYERS for this process, matching what a server started with ``redis_url``
    and ``CHANNEL_LAYER_CAPACITY=capacity`` uses."""
    config = dict(settings.CHANNEL_LAYERS["default"]["CONFIG"])
    config.update(hosts=[redis_url], capacity=capacity)
    return {"default": {**settings.CHANNEL_LAYERS["default"], "CONFIG": config}}


@dataclass
class Daphne:
    """``daphne controlplane.asgi:application`` on a fixed port; start it again after a
    kill and it listens on the same port."""

    log: Path
    env: dict[str, str]
    port: int = field(default_factory=free_port)
    popen: subprocess.Popen[bytes] | None = None

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def start(self) -> Daphne:
        return self.spawn().wait_ready()

    def spawn(self) -> Daphne:
        """Start the process; :meth:`wait_ready` waits until it serves (a start takes a
        few seconds of CPU: spawn several, then wait for each)."""
        assert self.popen is None or self.popen.poll() is not None, "already running"
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                [
                    DAPHNE, "-b", "127.0.0.1", "-p", str(self.port),
                    "--websocket_timeout", str(settings.DAPHNE_WEBSOCKET_TIMEOUT),
                    "controlplane.asgi:application",
                ],
                cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT,
            )
        return self

    def wait_ready(self) -> Daphne:
        wait_for(self._ready, "daphne to answer /healthz", timeout=45)
        return self

    def _ready(self) -> bool:
        assert self.popen is not None
        assert self.popen.poll() is None, f"daphne exited:\n{self.output()}"
        try:
            with urllib.request.urlopen(f"{self.http}/healthz", timeout=1) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL: no goodbye to any client, as a crash or an OOM kill."""
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(timeout=10)

    def suspend(self) -> None:
        assert self.popen is not None
        self.popen.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.popen is not None
        self.popen.send_signal(signal.SIGCONT)

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def daphne_env(database_url: str, redis_url: str, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "DJANGO_DEBUG": "0",
        "PYTHONUNBUFFERED": "1",
        **extra,
    }


@contextmanager
def running(*servers: Daphne) -> Iterator[tuple[Daphne, ...]]:
    """Start ``servers`` side by side; kill them all at the end."""
    try:
        for daphne in servers:
            daphne.spawn()
        for daphne in servers:
            daphne.wait_ready()
        yield servers
    finally:
        for daphne in servers:
            daphne.kill()


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
            ws.send(json.dumps(first))
        yield Feed(ws)
