"""What a worker said about a task whose recorded environment it does not offer
(:mod:`kernel.environment`): the differences, what it offers instead, which worker. A
report is current while the task has not changed since the worker looked (its
``updated_seq`` then); a migrate, a restart or any other change of the task makes it
stale. It is current too while the worker that made it holds the task again (a late
message for the task has it claim and give it back), not while another worker does: that
one offers the environment, or it would give the task back too."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from controlplane import models
from controlplane.process.kernel import process_kernel
from kernel import Status, Task
from kernel.environment import BLOCKED_DOCUMENT, fingerprint, recorded

JSON = Any


@dataclass(frozen=True)
class Seen:
    """The current report on a task (None: none, or stale, or the task has ended) and
    the version of its report document it was read at (0: never written): an action on
    the report expects that version in its commit, which a worker's rewrite since
    refuses."""

    report: dict[str, JSON] | None
    version: int


def seen(task: Task) -> Seen:
    """The current report on ``task`` and the version it was read at, in one read."""
    found, version = process_kernel().versioned_document(task.session_id, BLOCKED_DOCUMENT,
                                                         task.id)
    if task.terminal or recorded(task.checkpoint) is None:
        return Seen(None, version)
    if not isinstance(found, dict) or found.get("task_seq") != task.updated_seq:
        return Seen(None, version)
    return Seen(found if _waiting_or_rechecked(task, found) else None, version)


def report(task: Task) -> dict[str, JSON] | None:
    """The current report on ``task``, or None (none, or stale, or the task has ended)."""
    if task.terminal or recorded(task.checkpoint) is None:
        return None
    return seen(task).report


def identity(found: dict[str, JSON]) -> str:
    """What names a report as an operator was shown it (a digest of all it says): a
    migrate or a restart carries it, because another worker may rewrite the report (what
    it offers, the differences) while the task stays as it was."""
    return fingerprint(found)


def _waiting_or_rechecked(task: Task, found: dict[str, JSON]) -> bool:
    return task.status is Status.PENDING or (
        task.status is Status.RUNNING and task.lease_owner == found.get("worker"))


def current(tasks: Iterable[Task]) -> dict[str, dict[str, JSON]]:
    """The current report on each of ``tasks`` that has one, by task id: one read of
    their report documents' heads, then the value of each written since the task last
    changed (a task a worker left blocked waits, pending, for another worker)."""
    waiting = {t.id: t for t in tasks
               if t.status in (Status.PENDING, Status.RUNNING)
               and recorded(t.checkpoint) is not None}
    if not waiting:
        return {}
    pairs = models.Document.objects.filter(kind=BLOCKED_DOCUMENT, key__in=list(waiting),
                                           session_id__in={t.session_id for t in
                                                           waiting.values()})
    found = {}
    for key, written in pairs.values_list("key", "updated_seq"):
        task = waiting[key]
        if written >= task.updated_seq:
            said = report(task)
            if said is not None:
                found[key] = said
    return found


def reason(found: dict[str, JSON]) -> str:
    """A report in words, as a task's ``blocked`` says it."""
    return (f"worker {found.get('worker')} does not offer the environment this run was "
            f"started under: " + "; ".join(str(d) for d in found.get("differences", [])))
