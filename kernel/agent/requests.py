"""What every model request of the agent shares (a turn's, a compaction's): how often
it is tried, how long it waits between tries, and how its tokens are counted."""

from __future__ import annotations

from typing import Any

from kernel.run import Run

JSON = Any
USAGE = "agent-usage"
MAX_ATTEMPTS = 6


def backoff(attempt: int) -> float:
    return min(30.0, 0.5 * 2.0**attempt)


def record_usage(run: Run, conversation: str, usage: JSON) -> None:
    """Tokens per request, and running totals per conversation and session (counters)."""
    key = f"{run.task_id}:{run.checkpoint.get('attempt', 1)}"
    run.set(USAGE, "session", ["requests", key], {"conversation": conversation, **usage})
    for name, count in usage.items():
        if isinstance(count, int | float):
            run.update(
                USAGE,
                "session",
                {"op": "incr", "path": ["total", name], "value": count},
                {"op": "incr", "path": ["conversations", conversation, name], "value": count},
            )
