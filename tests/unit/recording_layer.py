"""A channel layer that records what it is asked to send, for the notifier's tests."""

from __future__ import annotations

import threading
from typing import Any


class Layer:
    """A channel layer that records its sends."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.lock = threading.Lock()

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        with self.lock:
            self.sent.append((group, message))
