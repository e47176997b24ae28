"""How many change-feed websockets this process serves now (for /metrics)."""

from __future__ import annotations

import threading

_lock = threading.Lock()
_count = 0


def joined() -> None:
    global _count
    with _lock:
        _count += 1


def left() -> None:
    global _count
    with _lock:
        _count = max(0, _count - 1)


def count() -> int:
    return _count
