"""Operator actions: each one a durable commit with the operator's identity and reason.

Every action carries a client-chosen ``action_id`` that becomes the commit's
idempotency key, so a retried request (a double click, a timeout) does nothing
new and answers with the commit that did it (``replayed: true``). Each action is
also recorded in the session's operations log, with who and why.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib.auth.models import User
from django.http import HttpRequest
from ninja import Router
from ninja.errors import HttpError

from controlplane import models
from controlplane.execution import runtime
from kernel import CommitRejected, Draft, DuplicateCommit, Status, Task, UnknownRecord, agent

from .auth import actor, operator, require_operator
from .schemas import (
    ActionIn,
    ActionOut,
    BulkFilter,
    BulkIn,
    BulkOut,
    BulkPreview,
    ResolveIn,
)
from .tasks import filtered

router = Router(tags=["actions"])
MAX_BULK = 1000
DECISIONS = {"sent": "sent", "not_sent_send_again": "send_again", "give_up": "give_up"}


def _task(task_id: str) -> Task:
    found = runtime().kernel.storage.task(task_id)
    if found is None:
        raise UnknownRecord(f"no task {task_id}")
    return found


def _record(draft: Draft, user: User, key: str, action: str, target: str, reason: str) -> None:
    """The action's entry in the session's operations log: what, on what, who and why."""
    draft.record_operation(
        action, {"target": target, "reason": reason, "by": actor(user), "action_id": key}
    )


def _commit(
    user: User,
    session_id: str,
    key: str,
    action: str,
    target: str,
    reason: str,
    build: Callable[[Draft], None],
) -> tuple[int, bool]:
    """Commit one action; return its seq and whether it had been done already."""
    draft = Draft(actor=actor(user), key=key)
    build(draft)
    _record(draft, user, key, action, target, reason)
    try:
        written = runtime().kernel.open(session_id).commit(draft)
    except DuplicateCommit as exc:
        return exc.existing.seq, True
    return written.commit.seq, False


def _act(
    user: User,
    action_id: str,
    reason: str,
    action: str,
    task: Task,
    build: Callable[[Draft], None],
    may_repeat: list[str] | None = None,
) -> dict[str, Any]:
    seq, replayed = _commit(user, task.session_id, action_id, action, task.id, reason, build)
    return {
        "action_id": action_id,
        "action": action,
        "target": task.id,
        "session_id": task.session_id,
        "seq": seq,
        "replayed": replayed,
        "may_repeat": may_repeat or [],
    }


def _refuse_unless(condition: bool, message: str) -> None:
    if not condition:
        raise HttpError(409, message)


# -- the actions themselves: the API below and the browser pages (controlplane.ui) call
# these same functions, so both check, commit and log an action in exactly one way. ------


def cancel_task(user: User, task_id: str, action_id: str, reason: str) -> dict[str, Any]:
    """Cancel a task and its owned subtasks (see :func:`cancel`); 403 unless an operator."""
    require_operator(user)
    task = _task(task_id)
    if not _already_done(task, action_id):
        _refuse_unless(not task.terminal, f"task {task_id} already ended {task.outcome}")
    return _act(user, action_id, reason, "cancel", task, lambda d: d.cancel(task_id, reason))


def retry_task(user: User, task_id: str, action_id: str, reason: str) -> dict[str, Any]:
    """Run a failed task again from its last saved phase (see :func:`retry`)."""
    require_operator(user)
    task = _task(task_id)
    repeat = [
        f"phase {task.phase!r} of {task.kind} runs again from its beginning: external calls it "
        "makes before its next commit may happen again"
    ]
    return _act(user, action_id, reason, "retry", task, lambda d: d.retry(task_id), repeat)


def resolve_task(
    user: User,
    task_id: str,
    action_id: str,
    reason: str,
    decision: str,
    receipt: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Decide an uncertain operation (see :func:`resolve`); ``decision`` is one of
    :data:`DECISIONS`."""
    require_operator(user)
    if decision not in DECISIONS:
        raise HttpError(422, f"decision: one of {sorted(DECISIONS)}")
    task = _task(task_id)
    signal = (task.wait or {}).get("signal")
    if not _already_done(task, action_id):
        _refuse_unless(
            task.status is Status.WAITING and signal is not None,
            f"task {task_id} is not waiting for a resolution (it is {task.status})",
        )
    payload: dict[str, Any] = {"decision": DECISIONS[decision], "by": actor(user), "reason": reason}
    if receipt is not None:
        payload["receipt"] = receipt
    repeat = ["the operation is performed again"] if DECISIONS[decision] == "send_again" else []
    return _act(
        user,
        action_id,
        reason,
        f"resolve:{decision}",
        task,
        lambda d: d.signal(task_id, signal or "", payload),
        repeat,
    )


def wake_task(user: User, task_id: str, action_id: str, reason: str) -> dict[str, Any]:
    """End a sleep early (see :func:`wake`)."""
    require_operator(user)
    task = _task(task_id)
    if not _already_done(task, action_id):
        _refuse_unless(task.status is Status.SLEEPING, f"task {task_id} is {task.status}")
    return _act(user, action_id, reason, "wake", task, lambda d: d.wake(task_id))


@router.post("/tasks/{task_id}/cancel", response=ActionOut)
def cancel(request: HttpRequest, task_id: str, body: ActionIn) -> Any:
    """Cancel a task and its owned subtasks: the running phase cannot commit any more, each
    cancel handler commits its wrap-up, then the tree ends ``cancelled``."""
    return cancel_task(operator(request), task_id, body.action_id, body.reason)


@router.post("/tasks/{task_id}/retry", response=ActionOut)
def retry(request: HttpRequest, task_id: str, body: ActionIn) -> Any:
    """Run a failed task again from its last saved phase."""
    return retry_task(operator(request), task_id, body.action_id, body.reason)


@router.post("/tasks/{task_id}/resolve", response=ActionOut)
def resolve(request: HttpRequest, task_id: str, body: ResolveIn) -> Any:
    """Decide an uncertain operation: it happened, it did not (send again), or give up."""
    return resolve_task(
        operator(request), task_id, body.action_id, body.reason, body.decision, body.receipt
    )


@router.post("/tasks/{task_id}/wake", response=ActionOut)
def wake(request: HttpRequest, task_id: str, body: ActionIn) -> Any:
    """End a sleep early: the task runs its next phase now."""
    return wake_task(operator(request), task_id, body.action_id, body.reason)


def resubmit_submission(
    user: User, submission_id: str, action_id: str, reason: str
) -> dict[str, Any]:
    """Submit the same input again as a new submission linked to the original, as any
    submission: it starts a turn, or follows the one the conversation is busy with."""
    require_operator(user)
    kernel = runtime().kernel
    original = kernel.storage.submission(submission_id)
    if original is None:
        raise UnknownRecord(f"no submission {submission_id}")
    try:
        submitted = agent.submit(
            kernel.open(original.session_id),
            original.conversation_id,
            original.input,
            action_id,
            agent.WhenBusy.FOLLOW_UP,
            actor=actor(user),
            resubmit_of=original.id,
            also=lambda draft: _record(draft, user, action_id, "resubmit", submission_id, reason),
        )
    except ValueError as exc:
        raise HttpError(422, f"the original submission cannot run again: {exc}") from exc
    assert submitted.submission is not None
    return {
        "action_id": action_id,
        "action": "resubmit",
        "target": submission_id,
        "session_id": original.session_id,
        "seq": submitted.submission.created_seq,
        "replayed": submitted.outcome == "duplicate",
        "may_repeat": ["the whole request runs again: its model and tool calls may repeat"],
    }


@router.post("/submissions/{submission_id}/resubmit", response=ActionOut)
def resubmit(request: HttpRequest, submission_id: str, body: ActionIn) -> Any:
    """Submit the same input again as a new submission linked to the original: it starts
    a turn, or follows the one the conversation is busy with."""
    return resubmit_submission(operator(request), submission_id, body.action_id, body.reason)


def _already_done(task: Task, action_id: str) -> bool:
    """A repeated action id answers with the original commit whatever the state now."""
    return models.Commit.objects.filter(session_id=task.session_id, key=action_id).exists()


def _matching(body: BulkFilter) -> list[str]:
    rows = filtered(body.session_id, body.kind, body.status, body.outcome)
    return list(rows.values_list("id", flat=True)[: MAX_BULK + 1])


@router.post("/actions/bulk/preview", response=BulkPreview)
def bulk_preview(request: HttpRequest, body: BulkFilter) -> Any:
    """How many tasks a bulk action with this filter would touch: show it, then confirm."""
    operator(request)
    ids = _matching(body)
    if len(ids) > MAX_BULK:
        raise HttpError(422, f"more than {MAX_BULK} tasks match: narrow the filter")
    return {"count": len(ids), "task_ids": ids}


@router.post("/actions/bulk", response=BulkOut)
def bulk(request: HttpRequest, body: BulkIn) -> Any:
    """Cancel or retry every task matching the filter, one commit per task, a result each.

    ``expected_count`` must equal what the preview showed: if the set changed since,
    nothing is done (409) and the operator looks again.
    """
    return bulk_act(operator(request), body)


def bulk_act(user: User, body: BulkIn) -> dict[str, Any]:
    """Cancel or retry every task matching the filter (see :func:`bulk`)."""
    require_operator(user)
    ids = _matching(body)
    if len(ids) > MAX_BULK:
        raise HttpError(422, f"more than {MAX_BULK} tasks match: narrow the filter")
    if body.expected_count is not None and body.expected_count != len(ids):
        raise HttpError(
            409, f"{len(ids)} tasks match now, not {body.expected_count}: preview again"
        )
    results = []
    for task_id in ids:
        task = _task(task_id)
        if body.action == "cancel" and task.terminal:
            results.append({"task_id": task_id, "ok": False, "detail": "already ended"})
            continue
        build = (
            (lambda d, t=task_id: d.cancel(t, body.reason))
            if body.action == "cancel"
            else (lambda d, t=task_id: d.retry(t))
        )
        try:
            seq, replayed = _commit(
                user,
                task.session_id,
                f"{body.action_id}:{task_id}",
                body.action,
                task_id,
                body.reason,
                build,
            )
        except CommitRejected as exc:
            results.append({"task_id": task_id, "ok": False, "detail": str(exc)})
            continue
        detail = "already done by this action id" if replayed else body.action
        results.append({"task_id": task_id, "ok": True, "detail": detail, "seq": seq})
    return {"action_id": body.action_id, "count": len(ids), "results": results}
