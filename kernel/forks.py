"""Starting a task again from a committed phase (DESIGN §14, recovery from a node).

Every commit that moves a task into a phase (its creation, a transition to another
phase, a restart) names in the task's summary item the checkpoint and the definition
version the task entered that phase with: the commit log says, for each phase the task
went through, where it stood when that phase began (:func:`phase_entries`). A restart
(:meth:`kernel.commit.Draft.restart`) puts the task back there: that phase runs again
from its beginning with that checkpoint, everything committed before stays, and no
phase before it runs again. The restart is a commit of its own, so the original
history stays readable beside what follows it.

A restart is counted in the checkpoint (:data:`RESTARTED`), so that the work a phase
does after it is new work: :func:`operation_id` gives another operation id after each
restart, and an unsafe call made again is a new call, never a replay of the old one
under its old id.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from .records import Commit, Task
from .registry import TaskDefinition

JSON = Any

RESTARTED = "_restarted"
"""The checkpoint key listing the task's restarts, oldest first: from which commit, into
which phase, at which commit, by whom."""


@dataclass(frozen=True)
class PhaseEntry:
    """Where a task stood when a commit moved it into ``phase``."""

    task_id: str
    seq: int
    phase: str
    checkpoint: JSON
    version: int | None
    restart_of: int | None = None
    """The seq of the entry this one restarted from, for an entry made by a restart."""


@dataclass(frozen=True)
class Restart:
    """A draft's restart of ``task_id`` from ``entry``; refused unless the task is still
    at ``expected_seq`` (the last commit that changed it, as the caller saw it)."""

    task_id: str
    entry: PhaseEntry
    expected_seq: int


def entry_item(item: JSON, task_id: str) -> bool:
    """Whether a commit's summary ``item`` records ``task_id`` entering a phase."""
    return (isinstance(item, dict) and item.get("type") == "task"
            and item.get("id") == task_id and "checkpoint" in item)


def phase_entries(task_id: str, commits: Iterable[Commit]) -> Iterator[PhaseEntry]:
    """The phases ``task_id`` entered, in the order of ``commits`` (its session's)."""
    for commit in commits:
        for item in commit.summary:
            if entry_item(item, task_id):
                yield PhaseEntry(task_id, commit.seq, item["phase"], item["checkpoint"],
                                 item.get("version"), item.get("restart_of"))


def restart_count(checkpoint: JSON) -> int:
    """How often the task with ``checkpoint`` was restarted from a phase."""
    restarted = checkpoint.get(RESTARTED) if isinstance(checkpoint, dict) else None
    return len(restarted) if isinstance(restarted, list) else 0


def operation_id(task_id: str, checkpoint: JSON, name: str = "") -> str:
    """The operation id of the task's external call ``name`` (one per task: ``""``):
    stable across re-entries of a phase (a retry of the same call is deduplicated by the
    other side), another one after each restart from a phase (a new call)."""
    suffix = f"_{name}" if name else ""
    restarts = restart_count(checkpoint)
    return f"op_{task_id}{suffix}" + (f"_r{restarts}" if restarts else "")


def no_restart(task: Task, definition: TaskDefinition) -> str | None:
    """Why ``task``, run by ``definition``, does not start again from a phase (the
    definition's ``no_restart``, or ``no_restart_ended`` once it has ended), in words;
    None when it may."""
    if definition.no_restart:
        return (f"task {task.id} ({task.kind}) does not start again from a phase: "
                f"{definition.no_restart}")
    if task.terminal and definition.no_restart_ended:
        return (f"task {task.id} ({task.kind}) has ended: {definition.no_restart_ended}")
    return None
