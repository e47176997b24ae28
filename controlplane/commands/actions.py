"""How an operator action is committed: one commit naming who acted and why, its entry
in the session's operations log, and its answer (:class:`ActionResult`), done once per
``action_id`` (a repeat is answered with the first commit; an id used for another
action or target is refused)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth.models import User

from controlplane.access import actor, credential
from controlplane.errors import Conflict
from controlplane.reads import sessions as session_reads
from controlplane.worker.runtime import runtime
from kernel import (
    Draft,
    DuplicateCommit,
    Task,
)


@dataclass(frozen=True)
class ActionResult:
    """What an operator action did: the commit that recorded it, and what may run again."""

    action_id: str
    action: str
    target: str
    session_id: str
    seq: int
    replayed: bool
    may_repeat: list[str] = field(default_factory=list)
    task_id: str | None = None
    """The task the action created (a graph run), if it created one."""


@dataclass(frozen=True)
class Step:
    """An uncertain step an operator may resolve: the signal its task waits on, and the
    task's epoch while it does (a later step, even under the same signal name, has
    another epoch)."""

    signal: str
    epoch: int


def record_action(draft: Draft, user: User, key: str, action: str, target: str, reason: str,
                  detail: dict[str, Any] | None = None,
                  seen: dict[str, Any] | None = None) -> None:
    """The action's entry in the session's operations log: what, on what, who, why, and
    through which credential (an API token by name and id, or the browser session);
    ``detail``: what the action chose (say, the commit a restart starts from); ``seen``:
    the state the operator said they acted on (the ``expected_*`` values the action
    carried), so that an auditor can tell what they were shown."""
    entry = {"target": target, "reason": reason, "by": actor(user), "action_id": key,
             **(detail or {})}
    if seen:
        entry["seen"] = seen
    via = credential()
    if via is not None:
        entry["via"] = via
    draft.record_operation(action, entry)


def commit_action(
    user: User,
    session_id: str,
    key: str,
    action: str,
    target: str,
    reason: str,
    build: Callable[[Draft], None],
    detail: dict[str, Any] | None = None,
    seen: dict[str, Any] | None = None,
) -> tuple[int, bool]:
    """Commit one action; return its seq and whether it had been done already (the same
    action on the same target under this id). Conflict if the id did something else."""
    draft = Draft(actor=actor(user), key=key)
    build(draft)
    record_action(draft, user, key, action, target, reason, detail, seen)
    try:
        written = runtime().kernel.open(session_id).commit(draft)
    except DuplicateCommit as exc:
        if not done_before(user, session_id, key, action, target):
            raise Conflict(f"action id {key!r} was used by another commit: use a fresh id"
                           ) from exc
        return exc.existing.seq, True
    return written.commit.seq, False


def act_on_task(
    user: User,
    action_id: str,
    reason: str,
    action: str,
    task: Task,
    build: Callable[[Draft], None],
    may_repeat: list[str] | None = None,
    detail: dict[str, Any] | None = None,
    seen: dict[str, Any] | None = None,
) -> ActionResult:
    seq, replayed = commit_action(user, task.session_id, action_id, action, task.id, reason, build,
                                  detail, seen)
    return ActionResult(action_id, action, task.id, task.session_id, seq, replayed,
                        may_repeat or [])


def done_before(user: User, session_id: str, action_id: str, action: str,
                target: str) -> bool:
    """Whether ``user`` did ``action`` on ``target`` already under ``action_id``: a
    repeat, answered with the original commit whatever the state now. An id used in the
    session for anything else (another action, another target), or by someone else, is
    refused with Conflict: their action is not the caller's to take as done."""
    done = session_reads.actions_by_id(session_id, action_id)
    if not done:
        return False
    if [(key, what, on) for key, what, on, _ in done] == [(action_id, action, target)]:
        refuse_unless_taken_by(user, done[0][3], action_id)
        return True
    _, other, on, _ = next((d for d in done if (d[1], d[2]) != (action, target)), done[0])
    raise Conflict(
        f"action id {action_id!r} was used for {other} on {on}: an action id names one "
        "action on one target; send a fresh one"
    )


def refuse_unless_taken_by(user: User, by: str, action_id: str) -> None:
    """Conflict unless ``by`` (who recorded an action under ``action_id``) is ``user``."""
    refuse_unless(by == actor(user),
                  f"action id {action_id!r} was used by {by}: an action id is its sender's; "
                  "send a fresh one")


def refuse_unless(condition: bool, message: str) -> None:
    if not condition:
        raise Conflict(message)
