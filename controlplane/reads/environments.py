"""What a worker said about a task whose recorded environment it does not offer
(:mod:`kernel.environment`): the differences, what it offers instead, which worker. A
report is current while the task has not changed since the worker looked (its
``updated_seq`` then); a migrate, a restart or any other change of the task makes it
stale."""

from __future__ import annotations

from typing import Any

from controlplane.process.kernel import process_kernel
from kernel import Task
from kernel.environment import BLOCKED_DOCUMENT, recorded

JSON = Any


def report(task: Task) -> dict[str, JSON] | None:
    """The current report on ``task``, or None (none, or stale, or the task has ended)."""
    if task.terminal or recorded(task.checkpoint) is None:
        return None
    found = process_kernel().document(task.session_id, BLOCKED_DOCUMENT, task.id)
    if not isinstance(found, dict) or found.get("task_seq") != task.updated_seq:
        return None
    return found


def reason(found: dict[str, JSON]) -> str:
    """A report in words, as a task's ``blocked`` says it."""
    return (f"worker {found.get('worker')} does not offer the environment this run was "
            f"started under: " + "; ".join(str(d) for d in found.get("differences", [])))
