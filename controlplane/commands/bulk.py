"""Actions on many tasks at once: the set a filter finds, previewed (its count and
digest), then acted on only if the filter still finds that set, each task as the
preview found it (:data:`~controlplane.reads.tasks.NAMED_BY`)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from enum import StrEnum
from functools import partial

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.utils import timezone

from controlplane.access import actor, require_operator
from controlplane.commands.actions import commit_action, done_before, refuse_unless_taken_by
from controlplane.commands.graphs import retry_of_a_run
from controlplane.commands.tasks import retrying
from controlplane.errors import Conflict, Invalid
from controlplane.models import BulkAction as BulkActionRow
from controlplane.reads import bulk_actions as bulk_reads
from controlplane.reads import sessions as session_reads
from controlplane.reads import tasks as task_reads
from controlplane.reads.tasks import TaskFilter, TaskSet
from kernel import CommitRejected, Draft

MAX_BULK = 1000


@dataclass(frozen=True)
class BulkItem:
    task_id: str
    ok: bool
    detail: str
    seq: int | None = None
    replayed: bool = False


@dataclass(frozen=True)
class BulkResult:
    action_id: str
    count: int
    results: list[BulkItem]
    digest: str
    """The set acted on (the preview's digest)."""


def bulk_preview(user: User, found: TaskFilter, action: str) -> TaskSet:
    """The tasks ``action`` with this filter would touch, named (their ids, what the
    action names each by, and the digest of the set): shown, then confirmed with that
    count and digest. An empty filter is refused: "every task" is never what a bulk
    action means by accident."""
    require_operator(user)
    _check_action(action)
    if not found.any_set():
        raise Invalid("filter: give at least one (session_id, kind, status or outcome)")
    found_set = task_reads.task_set(found, MAX_BULK + 1, task_reads.NAMED_BY[action])
    if found_set.count > MAX_BULK:
        raise Invalid(f"more than {MAX_BULK} tasks match: narrow the filter")
    return found_set


class BulkAction(StrEnum):
    CANCEL = "cancel"
    RETRY = "retry"


def _check_action(action: str) -> None:
    if action not in tuple(BulkAction):
        raise Invalid(f"action: one of {[str(a) for a in BulkAction]}")


DIGEST = re.compile(r"[0-9a-f]{64}")


def bulk_act(
    user: User,
    action: str,
    found: TaskFilter,
    action_id: str,
    reason: str,
    expected_count: int,
    expected_digest: str,
) -> BulkResult:
    """Cancel or retry exactly the tasks the preview found, one commit per task, a
    result each.

    ``expected_count`` and ``expected_digest`` are the preview's: if the filter finds
    another set now (more tasks, fewer, or as many but others), or the same tasks changed
    in what the action names them by (a retry: a task failed again since; a cancel: a
    task started again since), nothing is done (Conflict) and the operator previews
    again. Each task is then acted on only as the preview found it, checked again at its
    own commit (a task that changed meanwhile is left, its result says why). The set and
    what was done to each task are recorded under ``action_id``, so the same request
    again answers what the first did, whatever the tasks' state now (a first run cut
    short is finished); the id used for another action or another set is refused
    (Conflict).
    """
    require_operator(user)
    _check_action(action)
    if isinstance(expected_count, bool) or not isinstance(expected_count, int):
        raise Invalid("expected_count: the count the preview showed")
    if not isinstance(expected_digest, str) or not DIGEST.fullmatch(expected_digest):
        raise Invalid("expected_digest: the digest the preview showed (64 hex digits)")
    done = bulk_reads.recorded(action_id)
    if done is None:
        found_set = bulk_preview(user, found, action)
        if found_set.count != expected_count:
            raise Conflict(
                f"{found_set.count} tasks match now, not {expected_count}: preview again")
        if found_set.digest != expected_digest:
            changed = ("failed again" if action == BulkAction.RETRY else "started again")
            raise Conflict(f"the {found_set.count} tasks that match now are not the ones the "
                           f"preview found, or some of them changed since ({changed}, "
                           "say): preview again")
        _refuse_used_in_sessions(_sessions_of(found_set.task_ids), action, action_id)
        done = _claim_bulk(user, action, action_id, reason, found_set)
    refuse_unless_taken_by(user, done.by, action_id)
    if (done.action, done.digest, len(done.task_ids)) != (
        action, expected_digest, expected_count
    ):
        raise Conflict(
            f"action id {action_id!r} was used for {done.action} of a set of "
            f"{len(done.task_ids)} tasks ({done.digest[:12]}...): an action id names one "
            "action on one set; send a fresh one"
        )
    if done.results is not None:
        return _answered_before(done)
    return _carry_out(user, done)


def retry_all_failed(
    user: User, action_id: str, reason: str, expected_count: int, expected_digest: str
) -> BulkResult:
    """The attention list's "retry all N failed": a bulk retry of the failed tasks it
    showed (:data:`~controlplane.reads.tasks.RETRY_ALL_FAILED`, their count and digest)."""
    return bulk_act(user, BulkAction.RETRY, task_reads.RETRY_ALL_FAILED, action_id, reason,
                    expected_count, expected_digest)


def _sessions_of(task_ids: list[str]) -> dict[str, str]:
    """Each task's session (one read for the set; a task that is gone is left out)."""
    return {t.id: t.session_id for t in task_reads.find_ids(task_ids)}


def _refuse_used_in_sessions(sessions: dict[str, str], action: str, action_id: str) -> None:
    """Conflict if ``action_id`` was used in these tasks' sessions by another action."""
    for session_id in dict.fromkeys(sessions.values()):
        for key, other, on, _ in session_reads.actions_by_id(session_id, action_id):
            if key == action_id or other != action:
                raise Conflict(
                    f"action id {action_id!r} was used for {other} on {on}: an action id "
                    "names one action on one target; send a fresh one"
                )


def _claim_bulk(
    user: User, action: str, action_id: str, reason: str, found_set: TaskSet
) -> bulk_reads.BulkRecord:
    """Record the set under the action id before acting on any of it; of two requests
    with one id at once, the second finds the first's record (and is answered by it)."""
    try:
        with transaction.atomic():
            BulkActionRow.objects.create(
                action_id=action_id, action=action, digest=found_set.digest,
                task_ids=found_set.task_ids, seen=found_set.seen, by=actor(user), reason=reason,
                at=timezone.now(),
            )
    except IntegrityError:
        pass
    claimed = bulk_reads.recorded(action_id)
    assert claimed is not None
    return claimed


def _carry_out(user: User, done: bulk_reads.BulkRecord) -> BulkResult:
    """Act on each task of the recorded set, one commit each under ``action_id:TASK`` (so
    a task already done by this action is answered, not done again), then record what
    was done."""
    action, results = done.action, []
    tasks = {t.id: t.task for t in task_reads.find_ids(done.task_ids)}
    seen: list[int | None] = [*done.seen] if done.seen else [None] * len(done.task_ids)
    for task_id, expected in zip(done.task_ids, seen, strict=True):
        task = tasks.get(task_id)
        if task is None:
            results.append(BulkItem(task_id, False, f"no task {task_id}"))
            continue
        key = f"{done.action_id}:{task_id}"
        try:
            also = None
            if action == BulkAction.RETRY:
                repeated = done_before(user, task.session_id, key, action, task_id)
                also = retry_of_a_run(task, repeated)
            seq, replayed = commit_action(
                user, task.session_id, key, action, task_id, done.reason,
                partial(_act_on, action, task_id, done.reason, expected, also),
                seen={"expected_run" if action == BulkAction.CANCEL else "expected_seq": expected,
                      "expected_digest": done.digest,
                      "expected_count": len(done.task_ids)})
        except (CommitRejected, Conflict) as exc:
            results.append(BulkItem(task_id, False, str(exc)))
            continue
        results.append(BulkItem(task_id, True, action, seq, replayed))
    BulkActionRow.objects.filter(action_id=done.action_id).update(
        results=[asdict(r) for r in results]
    )
    return BulkResult(done.action_id, len(done.task_ids), results, done.digest)


def _act_on(
    action: str, task_id: str, reason: str, expected: int | None,
    also: Callable[[Draft], None] | None, draft: Draft,
) -> None:
    if action == BulkAction.CANCEL:
        draft.cancel(task_id, reason, expected_run=expected)
    else:
        retrying(draft, task_id, also, expected)


def _answered_before(done: bulk_reads.BulkRecord) -> BulkResult:
    """A repeat of a bulk request that was carried out: the first's answer, word for
    word, each item done marked ``replayed``; nothing is run again."""
    assert done.results is not None
    items = [BulkItem(**r) for r in done.results]
    return BulkResult(done.action_id, len(done.task_ids), [
        replace(i, replayed=True) if i.ok else i for i in items
    ], done.digest)
