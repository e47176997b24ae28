"""Task transitions: what a phase may ask for, and the rules that apply it.

A handler ends by returning one :class:`Transition`. The commit builder applies it
to the task with :func:`apply_transition`; the knock-on effects (waking waiters,
finishing owners, cancelling siblings) are derived in :mod:`kernel.commit`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from .errors import IllegalTransition
from .records import JoinPolicy, Outcome, Status, Task

JSON = Any


@dataclass(frozen=True)
class Next:
    """Run ``phase`` next. ``keep_lease``: the same worker continues inline, and its lease
    is extended to ``lease_until`` (a commit that waited on a lock must not leave the
    worker with a lease that ran out meanwhile). ``intent``: committed from inside a
    phase (``run.commit``), before its external work: the phase has not returned, so
    the count of its interrupted runs is kept (a phase that commits its intent and then
    dies every time still reaches the restart limit)."""

    phase: str
    checkpoint: JSON = None
    keep_lease: bool = False
    lease_until: datetime | None = None
    intent: bool = False


@dataclass(frozen=True)
class WaitTasks:
    """Wait until ``deps`` settle under ``policy``, then run ``then``."""

    deps: tuple[str, ...]
    then: str
    policy: JoinPolicy = JoinPolicy.ALL_SETTLED
    checkpoint: JSON = None


@dataclass(frozen=True)
class WaitSignal:
    """Wait for the named external signal (an operator's resolution, say), then run ``then``."""

    name: str
    then: str
    checkpoint: JSON = None


@dataclass(frozen=True)
class Sleep:
    until: datetime
    then: str
    checkpoint: JSON = None


@dataclass(frozen=True)
class Finish:
    outcome: Outcome
    result: JSON = None
    error: str | None = None


Transition = Next | WaitTasks | WaitSignal | Sleep | Finish
TRANSITIONS = (Next, WaitTasks, WaitSignal, Sleep, Finish)


def released(task: Task, **changes: Any) -> Task:
    """``task`` with its lease dropped: nobody may run it until the next claim."""
    return replace(task, lease_owner=None, lease_until=None, **changes)


def checkpoint_of(task: Task, transition: Next | WaitTasks | WaitSignal | Sleep) -> JSON:
    return task.checkpoint if transition.checkpoint is None else transition.checkpoint


def apply_transition(
    task: Task, transition: Transition, phases: frozenset[str], **changes: Any
) -> Task:
    """The task after a fenced phase commit, with ``changes`` besides (the commit's seq):
    one copy of the task, not one per change. Joins and finishing are the builder's job."""
    if task.status is not Status.RUNNING:
        raise IllegalTransition(f"task {task.id} is {task.status}, not running")
    if isinstance(transition, Finish):
        outcome = {"kind": str(transition.outcome), "result": transition.result}
        if transition.error is not None:
            outcome["error"] = transition.error
        return released(task, outcome=outcome, wait=None, wake_at=None, **changes)
    target = transition.phase if isinstance(transition, Next) else transition.then
    if target not in phases:
        raise IllegalTransition(f"task {task.id} ({task.kind}) has no phase {target!r}")
    checkpoint = checkpoint_of(task, transition)
    if isinstance(transition, Next):
        if transition.keep_lease:
            until = max(filter(None, (task.lease_until, transition.lease_until)), default=None)
            restarts = task.restarts if transition.intent else 0
            return replace(
                task, phase=target, checkpoint=checkpoint, restarts=restarts, lease_until=until,
                **changes,
            )
        return released(
            task, status=Status.PENDING, phase=target, checkpoint=checkpoint, restarts=0,
            **changes,
        )
    if isinstance(transition, Sleep):
        return released(
            task,
            status=Status.SLEEPING,
            phase=target,
            checkpoint=checkpoint,
            wake_at=transition.until,
            restarts=0,
            **changes,
        )
    if isinstance(transition, WaitSignal):
        return released(
            task,
            status=Status.WAITING,
            phase=target,
            checkpoint=checkpoint,
            wait={"signal": transition.name},
            restarts=0,
            **changes,
        )
    if not transition.deps:
        raise IllegalTransition(f"task {task.id}: a join needs at least one task")
    return released(
        task,
        status=Status.WAITING,
        phase=target,
        checkpoint=checkpoint,
        wait={"deps": list(dict.fromkeys(transition.deps)), "policy": str(transition.policy)},
        restarts=0,
        **changes,
    )


def succeeded(task: Task) -> bool:
    return task.outcome is not None and task.outcome.get("kind") == Outcome.SUCCEEDED
