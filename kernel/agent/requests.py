"""What every model request of the agent shares (a turn's, a compaction's): how often
it is tried, how long it waits between tries, and how its tokens are counted."""

from __future__ import annotations

from typing import Any

from kernel.run import Run

from .models import TransientModelError

JSON = Any
USAGE = "agent-usage"
MAX_ATTEMPTS = 6


LONGEST_RETRY_AFTER = 900.0
"""A server's Retry-After is honoured up to this many seconds (the wait holds no worker,
but a request that sleeps for hours looks dead)."""


def backoff(attempt: int, error: TransientModelError | None = None) -> float:
    """Seconds to wait before the ``attempt``-th retry: doubling up to 30 s, and never
    less than the server asked for (``Retry-After``, up to :data:`LONGEST_RETRY_AFTER`)."""
    wait = min(30.0, 0.5 * 2.0**attempt)
    asked = error.retry_after if error is not None else None
    if asked is not None and asked > 0:
        wait = max(wait, min(asked, LONGEST_RETRY_AFTER))
    return wait


def conversation_key(conversation: str) -> str:
    """The key of a conversation's own usage document: its running totals per model."""
    return f"conversation:{conversation}"


def record_usage(run: Run, conversation: str, usage: JSON, model: str | None) -> None:
    """Tokens per request, and running totals per conversation and session (counters);
    and per model in the conversation's own document (:func:`conversation_key`), which a
    reader of the conversation's total reads in place of every response it made."""
    key = f"{run.task_id}:{run.checkpoint.get('attempt', 1)}"
    run.set(USAGE, "session", ["requests", key], {"conversation": conversation, **usage})
    for name, count in usage.items():
        if not isinstance(count, int | float):
            continue
        run.update(
            USAGE,
            "session",
            {"op": "incr", "path": ["total", name], "value": count},
            {"op": "incr", "path": ["conversations", conversation, name], "value": count},
        )
    count_in_conversation(run, conversation, usage, model)


def count_in_conversation(run: Run, conversation: str, usage: JSON, model: str | None) -> None:
    """Add a response's tokens to its conversation's running totals, per model (``""``
    for a model the kernel does not name, such as a hosted agent's)."""
    ops = [{"op": "incr", "path": ["models", model or "", name], "value": count}
           for name, count in (usage or {}).items() if isinstance(count, int | float)]
    if ops:
        run.update(USAGE, conversation_key(conversation), *ops)
