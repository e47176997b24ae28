"""``fakellm`` (a mock OpenAI-compatible server from PyPI) as a real process, for tests.

Started with its own CLI (``fakellm serve``) on a free loopback port, with the rules the
test gives (its YAML format: ``when`` a request matches, ``respond`` so); ready once its
stats endpoint answers. :meth:`FakeLLM.requests` reads what it recorded of each request
(the model asked for, streamed or not, the rule that answered).
"""

from __future__ import annotations

import json
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from controlplane.dev.ports import free_port
from controlplane.dev.processes import Process

FAKELLM = str(Path(sys.executable).parent / "fakellm")


class FakeLLM:
    def __init__(self, port: int) -> None:
        self.root = f"http://127.0.0.1:{port}"
        self.url = f"{self.root}/v1"

    def stats(self) -> Any:
        with urllib.request.urlopen(f"{self.root}/_fakellm/stats", timeout=5) as answer:
            return json.load(answer)

    def requests(self) -> list[dict[str, Any]]:
        """What it recorded of each request, oldest first."""
        return list(reversed(self.stats()["recent"]))

    def answers(self) -> bool:
        try:
            self.stats()
        except OSError:
            return False
        return True


@contextmanager
def fakellm(tmp: Path, rules: list[dict[str, Any]]) -> Iterator[FakeLLM]:
    config = tmp / "fakellm.yaml"
    config.write_text(yaml.safe_dump({"version": 1, "rules": rules}))
    port = free_port()
    server = FakeLLM(port)
    process = Process(
        "fakellm", [FAKELLM, "serve", "--host", "127.0.0.1", "--port", str(port),
                    "--config", str(config)],
        log=tmp / "fakellm.log", cwd=tmp, ready_check=server.answers,
    )
    process.start()
    try:
        yield server
    finally:
        process.stop()
