"""Counting the round trips of a commit: a kernel whose ``steps`` task runs a chosen number of
phases (something may change its task or session behind its back, as another process
would), the pipelines a block runs, and a check that a session's commit log is whole."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from controlplane.storage import PostgresStorage
from kernel import Kernel, ManualClock, Registry, Run, Transition

Meddle = Callable[[Kernel, str, int], None]


def kernel_with(meddle: Meddle | None = None, phases: int = 4) -> Kernel:
    """A kernel whose ``steps`` task runs ``phases`` phases; ``meddle(kernel, task, n)``
    runs inside phase ``n`` (as another process would, meanwhile)."""
    registry = Registry()
    holder: list[Kernel] = []

    @registry.task("steps")
    class Steps:
        initial = "step"

        def step(self, run: Run) -> Transition:
            done = int(run.checkpoint.get("done", 0)) + 1
            if meddle is not None:
                meddle(holder[0], run.task_id, done)
            if done >= phases:
                return run.succeed({"done": done})
            return run.next("step", {"done": done})

    kernel = Kernel(PostgresStorage(), registry, ManualClock())
    holder.append(kernel)
    return kernel


@contextmanager
def counting_pipelines() -> Iterator[list[int]]:
    """How many pipelines (each one round trip) the connection runs in the block: a
    usual commit runs two, an inline one none (it is one statement)."""
    count = [0]
    original = psycopg.Connection.pipeline

    def pipeline(self: Any) -> Any:
        count[0] += 1
        return original(self)

    psycopg.Connection.pipeline = pipeline  # type: ignore[method-assign]
    try:
        yield count
    finally:
        psycopg.Connection.pipeline = original  # type: ignore[method-assign]


def log_is_whole(kernel: Kernel, session_id: str) -> list[int]:
    """The session's commit seqs, checked gapless and ending at its head."""
    seqs = [c.seq for c in kernel.commits_after(session_id, 0)]
    head = kernel.storage.session(session_id)
    assert head is not None
    assert seqs == list(range(1, head.head_seq + 1)), seqs
    return seqs
