"""Operator actions on one task: cancel, retry, restart from a phase, migrate to the
environment a worker offers, resolve an uncertain step, wake."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib.auth.models import User

from controlplane.access import actor, require_operator
from controlplane.commands.actions import (
    ActionResult,
    Step,
    act_on_task,
    done_before,
    refuse_unless,
)
from controlplane.commands.graphs import retry_of_a_run
from controlplane.errors import Conflict, Invalid
from controlplane.reads import environments as environment_reads
from controlplane.reads import restarts as restart_reads
from controlplane.reads import tasks as task_reads
from controlplane.worker.runtime import runtime
from kernel import (
    Blocked,
    Decision,
    DocumentConflict,
    Draft,
    Status,
    Task,
    UnknownRecord,
)
from kernel.environment import BLOCKED_DOCUMENT


def cancel_task(
    user: User, task_id: str, action_id: str, reason: str, expected_run: int
) -> ActionResult:
    """Cancel a task and its owned subtasks: the running phase cannot commit any more, each
    cancel handler commits its wrap-up, then the tree ends ``cancelled``. ``expected_run``
    is the task's ``run`` as the operator saw it: the run they meant to stop, whatever
    phase it has reached since. Refused by the commit itself, under the session's lock, so
    that nothing is recorded: a task that has ended (``IllegalTransition``: the cancel
    lost the race to its ending), or one started again since (retried or restarted from
    a phase: ``StaleStep``), which is not the run the operator saw."""
    require_operator(user)
    task = task_reads.record(task_id)
    # An id used otherwise, or by someone else: refused.
    done_before(user, task.session_id, action_id, "cancel", task_id)
    return act_on_task(user, action_id, reason, "cancel", task,
                       lambda d: d.cancel(task_id, reason, expected_run=expected_run),
                       seen={"expected_run": expected_run})


def retry_task(
    user: User, task_id: str, action_id: str, reason: str, expected_seq: int
) -> ActionResult:
    """Run a failed task again from its last saved phase (a graph run: see
    :func:`~controlplane.commands.graphs.retry_of_a_run`). ``expected_seq`` is the
    task's ``updated_seq`` as the operator saw it: a task that changed since (retried by
    someone else, and failed again, say) is refused (the kernel's ``StaleStep``, checked
    in the commit under the session's lock), as a second retry would repeat its side
    effects."""
    require_operator(user)
    task = task_reads.record(task_id)
    repeat = [
        f"phase {task.phase!r} of {task.kind} runs again from its beginning: external calls it "
        "makes before its next commit may happen again"
    ]
    repeated = done_before(user, task.session_id, action_id, "retry", task_id)
    also = retry_of_a_run(task, repeated)
    return act_on_task(user, action_id, reason, "retry", task,
                       lambda d: retrying(d, task_id, also, expected_seq), repeat,
                       seen={"expected_seq": expected_seq})


def retrying(draft: Draft, task_id: str, also: Callable[[Draft], None] | None,
             expected_seq: int | None = None) -> None:
    """A retry of ``task_id`` in ``draft`` (refused if the task changed after
    ``expected_seq``, when given), with what a graph run's retry adds."""
    draft.retry(task_id, expected_seq=expected_seq)
    if also is not None:
        also(draft)


def restart_preview(user: User, task_id: str, seq: int) -> restart_reads.RestartPreview:
    """What starting ``task_id`` again from the phase it entered at commit ``seq`` would
    do: the phases that stay and those that run again, the external calls made after that
    point (made again as new calls, under new operation ids), and whether the task's state
    allows it now. Show it, then confirm with :func:`restart_task`."""
    require_operator(user)
    return restart_reads.preview(task_reads.record(task_id), seq)


def restart_task(
    user: User, task_id: str, action_id: str, reason: str, seq: int, expected_seq: int,
    expected_report: str | None = None,
) -> ActionResult:
    """Start ``task_id`` again from the phase it entered at commit ``seq``, with the
    checkpoint it entered it with (read from the commit log): what it committed before
    stays, no phase before it runs again. ``expected_seq`` is the task's ``updated_seq`` as
    the operator saw it: a task that changed since is refused (Conflict), as is one whose
    state does not allow it (see :mod:`controlplane.reads.restarts`). While a worker
    reports the run's environment different, the restart runs under what that worker
    offers: ``expected_report`` is the identity of the report the operator saw (None: they
    saw none), and another report now is refused (Conflict), as is a report a worker
    wrote after it was read here (checked in the commit). One commit, naming who and why,
    with the restart point in the operations log."""
    require_operator(user)
    task = task_reads.record(task_id)
    try:
        chosen = restart_reads.point(task, seq)
    except UnknownRecord as exc:
        raise Invalid(f"seq: {exc}") from exc
    # A worker found the run's environment different: the fork runs under what it offers.
    found = environment_reads.seen(task)
    report = found.report
    if not done_before(user, task.session_id, action_id, "restart", task_id):
        refused = restart_reads.refusal(task)
        refuse_unless(refused is None, refused or "")
        refuse_unless(
            task.updated_seq == expected_seq,
            f"task {task_id} changed at #{task.updated_seq} after the #{expected_seq} you saw: "
            "look again",
        )
        _refuse_unless_report_seen(task_id, report, expected_report)
    said = restart_reads.preview(task, seq).may_repeat()
    offered = report.get("offered") if report is not None else None
    detail: dict[str, Any] = {"restart": {"from_seq": seq, "phase": chosen.phase}}
    if report is not None:
        detail["environment"] = {"worker": report.get("worker"),
                                 "differences": report.get("differences")}

    def build(draft: Draft) -> None:
        draft.restart(task_id, chosen.entry(task_id), expected_seq=expected_seq,
                      environment=offered)
        draft.expect_document(BLOCKED_DOCUMENT, task_id, found.version)

    try:
        return act_on_task(user, action_id, reason, "restart", task, build, said, detail,
                           {"expected_seq": expected_seq, "expected_report": expected_report})
    except DocumentConflict as exc:
        raise _report_rewritten(task_id) from exc


def migrate_environment(
    user: User, task_id: str, action_id: str, reason: str, expected_seq: int,
    expected_report: str,
) -> ActionResult:
    """Let a task that a worker found blocked by its environment (a tool removed or
    changed, a model no longer configured: :mod:`kernel.environment`) continue, from
    where it stands, under the environment that worker offers. ``expected_seq`` is the
    task's ``updated_seq`` the operator saw and ``expected_report`` the identity of the
    worker's report they saw (:func:`controlplane.reads.environments.identity`); refused
    (Conflict) when either changed, in the commit too (a worker's rewrite of the report
    after it was read here), or when no worker reports a difference for the task as it
    is now. One commit naming who and why, with the differences accepted in the
    operations log."""
    require_operator(user)
    task = task_reads.record(task_id)
    found = environment_reads.seen(task)
    report = found.report
    if not done_before(user, task.session_id, action_id, "migrate", task_id):
        refuse_unless(report is not None,
                      f"no worker reports task {task_id}'s environment different as it is "
                      f"now (it is {task.shown_status}): nothing to migrate")
        refuse_unless(
            task.updated_seq == expected_seq,
            f"task {task_id} changed at #{task.updated_seq} after the #{expected_seq} you saw: "
            "look again",
        )
        _refuse_unless_report_seen(task_id, report, expected_report)
    offered = (report or {}).get("offered") or {}
    detail = {"environment": {"worker": (report or {}).get("worker"),
                              "differences": (report or {}).get("differences")}}

    def build(draft: Draft) -> None:
        draft.migrate_environment(task_id, offered, expected_seq=expected_seq)
        draft.expect_document(BLOCKED_DOCUMENT, task_id, found.version)

    try:
        return act_on_task(user, action_id, reason, "migrate", task, build, [], detail,
                           {"expected_seq": expected_seq, "expected_report": expected_report})
    except DocumentConflict as exc:
        raise _report_rewritten(task_id) from exc


def _report_rewritten(task_id: str) -> Conflict:
    """The refusal of an action whose commit found the task's environment report
    rewritten after the command read it (the only document its commit expects)."""
    return Conflict(f"a worker rewrote the environment report on task {task_id} while "
                    "your action was under way: look again")


def _refuse_unless_report_seen(
    task_id: str, report: dict[str, Any] | None, expected: str | None
) -> None:
    """Refuse (Conflict) an action that would commit an environment report other than the
    one the operator saw: another worker may have rewritten it, offering something else,
    while the task stayed as it was."""
    if report is None:
        refuse_unless(expected is None, f"no worker reports task {task_id}'s environment "
                      "different now, unlike the report you saw: look again")
        return
    refuse_unless(environment_reads.identity(report) == expected,
                  f"the environment report on task {task_id} is not the one you saw: "
                  f"{environment_reads.reason(report)}; look again")


def resolve_task(
    user: User,
    task_id: str,
    action_id: str,
    reason: str,
    decision: str,
    step: Step,
    receipt: dict[str, Any] | None = None,
) -> ActionResult:
    """Decide the uncertain step the operator saw (``step``: the signal it waits on, at
    the task's epoch then) with one of the decisions its task's definition declares
    (:class:`kernel.registry.Decision`): the task finds the decision's value in that
    signal, with ``receipt`` if the decision takes one of that shape (Invalid otherwise).
    A step answered already, or replaced by a later one, is refused (Conflict or the
    kernel's ``StaleStep``) and nothing changes: of two operators deciding at once,
    exactly one decision is committed, checked in the commit under the session's lock."""
    require_operator(user)
    task = task_reads.record(task_id)
    offered = {d.name: d for d in _declared_decisions(task)}
    chosen = offered.get(decision)
    if chosen is None:
        raise Invalid(f"decision: one of {sorted(offered)}" if offered else
                      f"decision: task {task_id} ({task.kind}) offers no decisions")
    try:
        chosen.check_receipt(receipt)
    except ValueError as exc:
        raise Invalid(str(exc)) from exc
    if not done_before(user, task.session_id, action_id, f"resolve:{decision}", task_id):
        signal = task.waits_on.signal if task.status is Status.WAITING else None
        refuse_unless(
            signal is not None,
            f"task {task_id} is not waiting for a resolution (it is {task.shown_status})",
        )
        current = Step(signal or "", task.epoch)
        refuse_unless(
            step == current and step.signal not in task.signals,
            f"task {task_id} waits on {current.signal} at epoch {current.epoch}, not on "
            f"{step.signal} at epoch {step.epoch}: the step you saw was answered or "
            "replaced; look again",
        )
    payload: dict[str, Any] = {"decision": chosen.value, "by": actor(user), "reason": reason}
    if receipt is not None:
        payload["receipt"] = receipt
    return act_on_task(
        user,
        action_id,
        reason,
        f"resolve:{decision}",
        task,
        lambda d: d.signal(task_id, step.signal, payload, step_epoch=step.epoch),
        [chosen.may_repeat] if chosen.may_repeat else [],
        seen={"signal": step.signal, "epoch": step.epoch},
    )


def _declared_decisions(task: Task) -> tuple[Decision, ...]:
    """What the task's definition lets an operator answer (whatever its state now: a
    repeated action finds the task moved on)."""
    resolved = runtime().kernel.registry.resolve(task)
    return () if isinstance(resolved, Blocked) else resolved.definition.decisions


def wake_task(
    user: User, task_id: str, action_id: str, reason: str, expected_seq: int
) -> ActionResult:
    """End a sleep early: the task runs its next phase now. ``expected_seq`` is the
    task's ``updated_seq`` as the operator saw its sleep: a task that changed since (woke
    and slept again, say) is refused by the commit (``StaleStep``, under the session's
    lock), as that sleep is not the one the operator meant to end."""
    require_operator(user)
    task = task_reads.record(task_id)
    if not done_before(user, task.session_id, action_id, "wake", task_id):
        refuse_unless(task.status is Status.SLEEPING, f"task {task_id} is {task.status}")
    return act_on_task(user, action_id, reason, "wake", task,
                       lambda d: d.wake(task_id, expected_seq=expected_seq),
                       seen={"expected_seq": expected_seq})
