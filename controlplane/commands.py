"""The control plane's commands: everything an operator or a program changes.

Each command checks the caller's role, checks that the records allow it, and makes one
durable commit naming who acted and why (an operator action is also an entry in the
session's operations log). They raise domain errors (:mod:`controlplane.errors`, or
the kernel's ``UnknownRecord`` / ``CommitRejected``), never web types: the API, the
pages and the management commands are thin callers that translate them at their edge.

Operator actions carry a client-chosen ``action_id`` that becomes the commit's
idempotency key, so a retried request (a double click, a timeout) does nothing new and
answers with the commit that did it (``replayed``). An id means one action on one target:
duplicates are recognised by (action, target, id), and an id already used in the session
for another action or target is refused (Conflict), never answered "replayed".
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.utils import timezone

from controlplane import model_catalog
from controlplane.access import actor, audit, credential, require_operator
from controlplane.errors import Conflict, Invalid
from controlplane.models import ApiToken
from controlplane.models import BulkAction as BulkActionRow
from controlplane.reads import approvals as approval_reads
from controlplane.reads import bulk_actions as bulk_reads
from controlplane.reads import environments as environment_reads
from controlplane.reads import graphs as graph_reads
from controlplane.reads import restarts as restart_reads
from controlplane.reads import sessions as session_reads
from controlplane.reads import tasks as task_reads
from controlplane.reads.tasks import TaskFilter, TaskSet
from controlplane.reads.tokens import TokenView, token_view
from controlplane.storage import PruneRunning, prepare_partitions, referenced_artifacts
from controlplane.worker.runtime import runtime
from kernel import (
    Blocked,
    CommitRejected,
    Decision,
    Draft,
    DuplicateCommit,
    ReservedConversation,
    Status,
    Task,
    UnknownRecord,
    agent,
)
from kernel.agent import Submitted
from kernel.agent import approval as approvals
from kernel.agent import branches as agent_branches
from kernel.commit import operations_log_id
from kernel.errors import UnstorableValue
from kernel.hosts.langgraph.interrupts import check_resume, resume_signal
from kernel.hosts.langgraph.layout import HOST, INDEX, INDEX_KEY
from kernel.records import Conversation, SessionRecord
from kernel.retention import Progress, PruneReport, RetentionPolicy, quiet
from kernel.values import storable

log = logging.getLogger(__name__)

MAX_BULK = 1000


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


# -- how an action is committed ------------------------------------------------------------


def _record(draft: Draft, user: User, key: str, action: str, target: str, reason: str,
            detail: dict[str, Any] | None = None) -> None:
    """The action's entry in the session's operations log: what, on what, who, why, and
    through which credential (an API token by name and id, or the browser session);
    ``detail``: what the action chose (say, the commit a restart starts from)."""
    entry = {"target": target, "reason": reason, "by": actor(user), "action_id": key,
             **(detail or {})}
    via = credential()
    if via is not None:
        entry["via"] = via
    draft.record_operation(action, entry)


def _commit(
    user: User,
    session_id: str,
    key: str,
    action: str,
    target: str,
    reason: str,
    build: Callable[[Draft], None],
    detail: dict[str, Any] | None = None,
) -> tuple[int, bool]:
    """Commit one action; return its seq and whether it had been done already (the same
    action on the same target under this id). Conflict if the id did something else."""
    draft = Draft(actor=actor(user), key=key)
    build(draft)
    _record(draft, user, key, action, target, reason, detail)
    try:
        written = runtime().kernel.open(session_id).commit(draft)
    except DuplicateCommit as exc:
        if not _done_before(session_id, key, action, target):
            raise Conflict(f"action id {key!r} was used by another commit: use a fresh id"
                           ) from exc
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
    detail: dict[str, Any] | None = None,
) -> ActionResult:
    seq, replayed = _commit(user, task.session_id, action_id, action, task.id, reason, build,
                            detail)
    return ActionResult(action_id, action, task.id, task.session_id, seq, replayed,
                        may_repeat or [])


def _done_before(session_id: str, action_id: str, action: str, target: str) -> bool:
    """Whether ``action`` on ``target`` was done already under ``action_id``: a repeat,
    answered with the original commit whatever the state now. An id used in the session
    for anything else (another action, another target) is refused with Conflict."""
    done = session_reads.actions_by_id(session_id, action_id)
    if not done:
        return False
    if done == [(action_id, action, target)]:
        return True
    _, other, on = next((d for d in done if (d[1], d[2]) != (action, target)), done[0])
    raise Conflict(
        f"action id {action_id!r} was used for {other} on {on}: an action id names one "
        "action on one target; send a fresh one"
    )


def _refuse_unless(condition: bool, message: str) -> None:
    if not condition:
        raise Conflict(message)


# -- actions on one task ----------------------------------------------------------------


def cancel_task(user: User, task_id: str, action_id: str, reason: str) -> ActionResult:
    """Cancel a task and its owned subtasks: the running phase cannot commit any more, each
    cancel handler commits its wrap-up, then the tree ends ``cancelled``. A task that has
    ended is refused by the commit itself (``IllegalTransition``, under the session's
    lock), so a cancel that loses the race to the task's ending records nothing."""
    require_operator(user)
    task = task_reads.record(task_id)
    _done_before(task.session_id, action_id, "cancel", task_id)  # an id used otherwise: refused
    return _act(user, action_id, reason, "cancel", task, lambda d: d.cancel(task_id, reason))


def retry_task(user: User, task_id: str, action_id: str, reason: str) -> ActionResult:
    """Run a failed task again from its last saved phase."""
    require_operator(user)
    task = task_reads.record(task_id)
    repeat = [
        f"phase {task.phase!r} of {task.kind} runs again from its beginning: external calls it "
        "makes before its next commit may happen again"
    ]
    return _act(user, action_id, reason, "retry", task, lambda d: d.retry(task_id), repeat)


def restart_preview(user: User, task_id: str, seq: int) -> restart_reads.RestartPreview:
    """What starting ``task_id`` again from the phase it entered at commit ``seq`` would
    do: the phases that stay and those that run again, the external calls made after that
    point (made again as new calls, under new operation ids), and whether the task's state
    allows it now. Show it, then confirm with :func:`restart_task`."""
    require_operator(user)
    return restart_reads.preview(task_reads.record(task_id), seq)


def restart_task(
    user: User, task_id: str, action_id: str, reason: str, seq: int, expected_seq: int
) -> ActionResult:
    """Start ``task_id`` again from the phase it entered at commit ``seq``, with the
    checkpoint it entered it with (read from the commit log): what it committed before
    stays, no phase before it runs again. ``expected_seq`` is the task's ``updated_seq`` as
    the operator saw it: a task that changed since is refused (Conflict), as is one whose
    state does not allow it (see :mod:`controlplane.reads.restarts`). One commit, naming
    who and why, with the restart point in the operations log."""
    require_operator(user)
    task = task_reads.record(task_id)
    try:
        chosen = restart_reads.point(task, seq)
    except UnknownRecord as exc:
        raise Invalid(f"seq: {exc}") from exc
    if not _done_before(task.session_id, action_id, "restart", task_id):
        refused = restart_reads.refusal(task)
        _refuse_unless(refused is None, refused or "")
        _refuse_unless(
            task.updated_seq == expected_seq,
            f"task {task_id} changed at #{task.updated_seq} after the #{expected_seq} you saw: "
            "look again",
        )
    said = restart_reads.preview(task, seq).may_repeat()
    # A worker found the run's environment different: the fork runs under what it offers.
    report = environment_reads.report(task)
    offered = report.get("offered") if report is not None else None
    detail: dict[str, Any] = {"restart": {"from_seq": seq, "phase": chosen.phase}}
    if report is not None:
        detail["environment"] = {"worker": report.get("worker"),
                                 "differences": report.get("differences")}
    return _act(
        user, action_id, reason, "restart", task,
        lambda d: d.restart(task_id, chosen.entry(task_id), expected_seq=expected_seq,
                            environment=offered),
        said, detail,
    )


def migrate_environment(
    user: User, task_id: str, action_id: str, reason: str, expected_seq: int
) -> ActionResult:
    """Let a task that a worker found blocked by its environment (a tool removed or
    changed, a model no longer configured: :mod:`kernel.environment`) continue, from
    where it stands, under the environment that worker offers. ``expected_seq`` is the
    task's ``updated_seq`` the operator saw; refused (Conflict) when it changed or when no
    worker reports a difference for the task as it is now. One commit naming who and why,
    with the differences accepted in the operations log."""
    require_operator(user)
    task = task_reads.record(task_id)
    report = environment_reads.report(task)
    if not _done_before(task.session_id, action_id, "migrate", task_id):
        _refuse_unless(report is not None,
                       f"no worker reports task {task_id}'s environment different as it is "
                       f"now (it is {task.shown_status}): nothing to migrate")
        _refuse_unless(
            task.updated_seq == expected_seq,
            f"task {task_id} changed at #{task.updated_seq} after the #{expected_seq} you saw: "
            "look again",
        )
    offered = (report or {}).get("offered") or {}
    detail = {"environment": {"worker": (report or {}).get("worker"),
                              "differences": (report or {}).get("differences")}}
    return _act(
        user, action_id, reason, "migrate", task,
        lambda d: d.migrate_environment(task_id, offered, expected_seq=expected_seq),
        [], detail,
    )


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
    if not _done_before(task.session_id, action_id, f"resolve:{decision}", task_id):
        signal = task.waits_on.signal if task.status is Status.WAITING else None
        _refuse_unless(
            signal is not None,
            f"task {task_id} is not waiting for a resolution (it is {task.shown_status})",
        )
        current = Step(signal or "", task.epoch)
        _refuse_unless(
            step == current and step.signal not in task.signals,
            f"task {task_id} waits on {current.signal} at epoch {current.epoch}, not on "
            f"{step.signal} at epoch {step.epoch}: the step you saw was answered or "
            "replaced; look again",
        )
    payload: dict[str, Any] = {"decision": chosen.value, "by": actor(user), "reason": reason}
    if receipt is not None:
        payload["receipt"] = receipt
    return _act(
        user,
        action_id,
        reason,
        f"resolve:{decision}",
        task,
        lambda d: d.signal(task_id, step.signal, payload, step_epoch=step.epoch),
        [chosen.may_repeat] if chosen.may_repeat else [],
    )


def resume_graph(
    user: User, task_id: str, action_id: str, reason: str, checkpoint_id: str, value: Any
) -> ActionResult:
    """Resume a hosted LangGraph run interrupted at ``checkpoint_id`` (the interrupt the
    operator saw) with ``value``, checked against the schema the node declared, if any:
    one commit naming the operator. A run no longer waiting there is refused (Conflict)."""
    require_operator(user)
    task = task_reads.record(task_id)
    if not _done_before(task.session_id, action_id, "resume", task_id):
        try:
            check_resume(task, checkpoint_id, value)
        except LookupError as exc:
            raise Conflict(f"{exc} (it is {task.shown_status}): look again") from exc
        except ValueError as exc:
            raise Invalid(str(exc)) from exc
    payload = {"value": value, "by": actor(user), "reason": reason}
    signal = resume_signal(checkpoint_id)
    return _act(user, action_id, reason, "resume", task,
                lambda d: d.signal(task_id, signal, payload, step_epoch=task.epoch))


def _declared_decisions(task: Task) -> tuple[Decision, ...]:
    """What the task's definition lets an operator answer (whatever its state now: a
    repeated action finds the task moved on)."""
    resolved = runtime().kernel.registry.resolve(task)
    return () if isinstance(resolved, Blocked) else resolved.definition.decisions


def wake_task(user: User, task_id: str, action_id: str, reason: str) -> ActionResult:
    """End a sleep early: the task runs its next phase now."""
    require_operator(user)
    task = task_reads.record(task_id)
    if not _done_before(task.session_id, action_id, "wake", task_id):
        _refuse_unless(task.status is Status.SLEEPING, f"task {task_id} is {task.status}")
    return _act(user, action_id, reason, "wake", task, lambda d: d.wake(task_id))


# -- a LangGraph thread ------------------------------------------------------------------


def start_graph(
    user: User, session_id: str, action_id: str, reason: str, kind: str, graph_input: Any,
    expected_version: int,
) -> ActionResult:
    """Start a run of the graph registered as ``kind`` on the session's thread: the graph
    is invoked with ``graph_input`` from the thread's newest checkpoint (from the start
    on a session that holds no thread yet). One commit naming the operator, which creates
    the run and names it in the thread's index.

    Invalid when ``kind`` is not a graph registered here or the input cannot be stored;
    refused (Conflict) while a run of the thread has not ended (two runs would both go on
    from the newest checkpoint), or when the thread changed since the operator saw it:
    ``expected_version`` is the thread's version they were shown, 0 for a session that
    holds no thread yet."""
    from kernel.hosts.langgraph.host import run_input

    require_operator(user)
    session_reads.session(session_id)  # UnknownRecord: 404
    graphs = runtime().kernel.registry.hosted_by(HOST)
    if kind not in graphs:
        raise Invalid(f"kind: {kind!r} is not a graph registered here (graphs: "
                      f"{', '.join(graphs) or 'none'})")
    try:
        storable(graph_input, "input")
    except UnstorableValue as exc:
        raise Invalid(str(exc)) from exc
    expected: int | None = None  # a repeat is answered with the first commit, as it is
    if not _done_before(session_id, action_id, "start", kind):
        thread = graph_reads.thread(session_id)
        _refuse_unless_thread_is(thread, expected_version, "start a run")
        expected = expected_version

    def build(draft: Draft) -> str:
        run = draft.create_task(kind, run_input(graph_input))
        _name_in_index(draft, graph_reads.STARTS, run, {"kind": kind, "by": actor(user),
                                                        "reason": reason}, expected)
        return run

    return _start_run(user, session_id, action_id, "start", kind, reason, build,
                      ["the graph runs from the thread's newest checkpoint, with its side "
                       "effects"])


def fork_graph(
    user: User, session_id: str, action_id: str, reason: str, checkpoint_id: str,
    expected_version: int, values: Any = None,
) -> ActionResult:
    """Start a new run of the session's graph from its thread's checkpoint
    ``checkpoint_id`` (time travel): nothing before that checkpoint runs again; with
    ``values`` (a JSON object) the state there is updated first (LangGraph's
    ``update_state``). The fork is a new branch of the thread: the checkpoints after the
    fork point stay readable. One commit naming the operator, which creates the run.

    Refused (Conflict) when the checkpoint is no longer in the thread (pruned, deleted),
    when a run of the thread has not ended (each run goes on from the thread's newest
    checkpoint, which the fork's run would move under it), or when the thread changed
    since the operator saw it: ``expected_version`` is the version of the thread's index
    they were shown (:attr:`controlplane.reads.graphs.Thread.version`), and the commit
    is refused if the index moved even between the checks here and the commit."""
    from kernel.hosts.langgraph.host import fork_input

    require_operator(user)
    session_reads.session(session_id)  # UnknownRecord: 404
    if values is not None:
        if not isinstance(values, dict):
            raise Invalid("values: a JSON object (the state's channels to update), or none")
        try:
            storable(values, "values")
        except UnstorableValue as exc:
            raise Invalid(str(exc)) from exc
    thread = graph_reads.thread(session_id)
    if thread is None or thread.kind is None:
        raise Conflict(f"session {session_id} holds no graph run to fork")
    kind = thread.kind
    expected: int | None = None  # a repeat is answered with the first commit, as it is
    if not _done_before(session_id, action_id, "fork", checkpoint_id):
        namespaces, _ = graph_reads.versioned_index(session_id)
        _refuse_unless(checkpoint_id in namespaces.get(graph_reads.ROOT, {}),
                       f"checkpoint {checkpoint_id} is not in the thread (any more): look again")
        _refuse_unless_thread_is(thread, expected_version, "fork")
        expected = expected_version

    def build(draft: Draft) -> str:
        run = draft.create_task(kind, fork_input(checkpoint_id, values))
        _name_in_index(draft, graph_reads.FORKS, run, {"checkpoint_id": checkpoint_id,
                                                       "by": actor(user), "reason": reason},
                       expected)
        return run

    return _start_run(user, session_id, action_id, "fork", checkpoint_id, reason, build,
                      ["the nodes after the fork point run again, with their side effects"])


def _refuse_unless_thread_is(
    thread: graph_reads.Thread | None, expected_version: int, what: str,
) -> None:
    """Conflict while a run of the thread has not ended, or when the thread is not at the
    version the operator saw (0: none yet)."""
    version = thread.version if thread is not None else 0
    running = thread.open_runs if thread is not None else []
    _refuse_unless(not running,
                   f"run {', '.join(r.task_id for r in running)} of this thread has not "
                   f"ended: {what} once it has (or cancel it)")
    _refuse_unless(version == expected_version,
                   f"the thread changed since you saw it (it is at version {version}, you "
                   f"saw {expected_version}): look again")


def _name_in_index(draft: Draft, where: str, run: str, value: Any, expected: int | None) -> None:
    """Name an operator's run in the thread's index, at the version the checks read: a
    checkpoint written or pruned meanwhile, or another run started, refuses the commit,
    so two runs never go on from the thread's head at once."""
    draft.update_document(INDEX, INDEX_KEY, {"op": "set", "path": [where, run], "value": value},
                          expected_version=expected)


def _start_run(
    user: User, session_id: str, action_id: str, action: str, target: str, reason: str,
    build: Callable[[Draft], str], may_repeat: list[str],
) -> ActionResult:
    """Commit an action that creates one graph run: the result names the run (the one
    the first commit created, for a repeat)."""
    made: list[str] = []
    seq, replayed = _commit(user, session_id, action_id, action, target, reason,
                            lambda draft: made.append(build(draft)))
    if replayed:  # the first commit's run, unless retention has removed that commit
        made = [item["id"] for commit in runtime().kernel.commits_after(session_id, seq - 1, 1)
                if commit.seq == seq for item in commit.summary if item.get("type") == "task"]
    return ActionResult(action_id, action, target, session_id, seq, replayed, may_repeat,
                        task_id=made[0] if made else None)


# -- many tasks at once --------------------------------------------------------------------


def bulk_preview(user: User, found: TaskFilter) -> TaskSet:
    """The tasks a bulk action with this filter would touch, named (their ids and the
    digest of the set): shown, then confirmed with that count and digest. An empty
    filter is refused: "every task" is never what a bulk action means by accident."""
    require_operator(user)
    if not found.any_set():
        raise Invalid("filter: give at least one (session_id, kind, status or outcome)")
    found_set = task_reads.task_set(found, MAX_BULK + 1)
    if found_set.count > MAX_BULK:
        raise Invalid(f"more than {MAX_BULK} tasks match: narrow the filter")
    return found_set


class BulkAction(StrEnum):
    CANCEL = "cancel"
    RETRY = "retry"


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
    another set now (more tasks, fewer, or as many but others), nothing is done
    (Conflict) and the operator previews again. The set and what was done to each task
    are recorded under ``action_id``, so the same request again answers what the first
    did, whatever the tasks' state now (a first run cut short is finished); the id used
    for another action or another set is refused (Conflict).
    """
    require_operator(user)
    if action not in tuple(BulkAction):
        raise Invalid(f"action: one of {[str(a) for a in BulkAction]}")
    if isinstance(expected_count, bool) or not isinstance(expected_count, int):
        raise Invalid("expected_count: the count the preview showed")
    if not isinstance(expected_digest, str) or not DIGEST.fullmatch(expected_digest):
        raise Invalid("expected_digest: the digest the preview showed (64 hex digits)")
    done = bulk_reads.recorded(action_id)
    if done is None:
        found_set = bulk_preview(user, found)
        if found_set.count != expected_count:
            raise Conflict(
                f"{found_set.count} tasks match now, not {expected_count}: preview again")
        if found_set.digest != expected_digest:
            raise Conflict(f"the {found_set.count} tasks that match now are not the ones the "
                           "preview found: preview again")
        _refuse_used_in_sessions(_sessions_of(found_set.task_ids), action, action_id)
        done = _claim_bulk(user, action, action_id, reason, found_set)
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
        for key, other, on in session_reads.actions_by_id(session_id, action_id):
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
                task_ids=found_set.task_ids, by=actor(user), reason=reason,
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
    sessions = _sessions_of(done.task_ids)
    for task_id in done.task_ids:
        session_id = sessions.get(task_id)
        if session_id is None:
            results.append(BulkItem(task_id, False, f"no task {task_id}"))
            continue
        try:
            build = (
                (lambda d, t=task_id: d.cancel(t, done.reason))
                if action == BulkAction.CANCEL
                else (lambda d, t=task_id: d.retry(t))
            )
            seq, replayed = _commit(user, session_id, f"{done.action_id}:{task_id}", action,
                                    task_id, done.reason, build)
        except CommitRejected as exc:
            results.append(BulkItem(task_id, False, str(exc)))
            continue
        results.append(BulkItem(task_id, True, action, seq, replayed))
    BulkActionRow.objects.filter(action_id=done.action_id).update(
        results=[asdict(r) for r in results]
    )
    return BulkResult(done.action_id, len(done.task_ids), results, done.digest)


def _answered_before(done: bulk_reads.BulkRecord) -> BulkResult:
    """A repeat of a bulk request that was carried out: the first's answer, word for
    word, each item done marked ``replayed``; nothing is run again."""
    assert done.results is not None
    items = [BulkItem(**r) for r in done.results]
    return BulkResult(done.action_id, len(done.task_ids), [
        replace(i, replayed=True) if i.ok else i for i in items
    ], done.digest)


# -- sessions, conversations, submissions ----------------------------------------------------


CREATE_SESSION = "create-session"
"""The operations-log entry of a session's creation: who, and with what (``via``)."""


def _record_creation(draft: Draft, by: str, via: str) -> None:
    draft.record_operation(CREATE_SESSION, {"by": by, "via": via})


def create_session(user: User, metadata: dict[str, Any], via: str) -> SessionRecord:
    """A new session, its creation the first commit: ``user`` named as its actor and in
    the operations log with ``via`` (the credential used, say an API token). Should that
    commit fail, the session is left empty and unattributed (its head at 0)."""
    require_operator(user)
    kernel = runtime().kernel
    handle = kernel.create_session(metadata=metadata)
    draft = Draft(actor=actor(user))
    _record_creation(draft, actor(user), via)
    handle.commit(draft)
    created = kernel.storage.session(handle.id)
    assert created is not None
    return created


def start_task(
    actor_name: str, kind: str, input: Any, session_id: str | None, title: str = ""
) -> tuple[str, str]:
    """Start a task of ``kind`` in a session (a new one titled ``title`` unless given):
    ``(session_id, task_id)``. For trusted callers (a shell), who name themselves."""
    kernel = runtime().kernel
    if session_id is not None and kernel.storage.session(session_id) is None:
        raise UnknownRecord(f"no session {session_id}")
    handle = (
        kernel.open(session_id) if session_id
        else kernel.create_session(metadata={"title": title})
    )
    draft = Draft(actor=actor_name)
    if session_id is None:
        _record_creation(draft, actor_name, "shell")
    task_id = draft.create_task(kind, input)
    handle.commit(draft)
    return handle.id, task_id


def create_conversation(
    user: User, session_id: str, fork_of: str | None, fork_entry_id: str | None
) -> Conversation:
    require_operator(user)
    kernel = runtime().kernel
    if kernel.storage.session(session_id) is None:
        raise UnknownRecord(f"no session {session_id}")
    draft = Draft(actor=actor(user))
    try:
        conversation_id = draft.create_conversation(fork_of=fork_of, fork_entry_id=fork_entry_id)
    except ValueError as exc:
        raise Invalid(str(exc)) from exc
    try:
        kernel.open(session_id).commit(draft)
    except ReservedConversation as exc:
        raise Invalid(f"fork_of: {exc}") from exc
    created = kernel.storage.conversation(conversation_id)
    assert created is not None
    return created


@dataclass(frozen=True)
class BranchResult:
    """A turn branched from a model response: the new conversation and turn, the commit."""

    action_id: str
    session_id: str
    entry_id: str
    conversation_id: str
    turn_id: str
    seq: int
    replayed: bool


def branch_turn(
    user: User, session_id: str, entry_id: str, action_id: str, reason: str
) -> BranchResult:
    """Branch the turn that committed the model response ``entry_id``: a new conversation
    forked at that entry and a new turn on it that starts from the response as committed
    (the model is asked only from there; its tool calls are made anew, under new operation
    ids). One commit naming who and why; the original conversation and turn stay."""
    require_operator(user)
    kernel = runtime().kernel
    conversation_id = session_reads.entry_conversation(session_id, entry_id)
    key = action_id
    try:
        made = agent_branches.branch_turn(
            kernel.open(session_id), conversation_id, entry_id, actor=actor(user), key=key,
            also=lambda d: _record(d, user, key, "branch", entry_id, reason),
        )
    except DuplicateCommit as exc:
        if not _done_before(session_id, key, "branch", entry_id):
            raise Conflict(f"action id {key!r} was used by another commit: use a fresh id"
                           ) from exc
        log_id = operations_log_id(session_id)
        made_before = {i.get("type"): i.get("id") for i in exc.existing.summary
                       if i.get("type") in ("conversation", "task") and i.get("id") != log_id}
        return BranchResult(action_id, session_id, entry_id,
                            str(made_before.get("conversation")), str(made_before.get("task")),
                            exc.existing.seq, True)
    return BranchResult(action_id, session_id, entry_id, made.conversation_id, made.turn_id,
                        made.seq, False)


def submit(
    user: User,
    session_id: str,
    conversation_id: str,
    input: Any,
    request_id: str,
    when_busy: agent.WhenBusy,
) -> Submitted:
    """Accept input for a conversation once per ``request_id`` (a repeat returns the
    original); an idle conversation starts a turn, a busy one does what ``when_busy``
    says, ``reject`` refusing with Conflict and writing nothing."""
    require_operator(user)
    kernel = runtime().kernel
    if kernel.storage.session(session_id) is None:
        raise UnknownRecord(f"no session {session_id}")
    try:
        model_catalog.check_choice(settings.MODELS, input)
        submitted = agent.submit(
            kernel.open(session_id), conversation_id, input, request_id, when_busy,
            actor=actor(user),
        )
    except ValueError as exc:
        raise Invalid(f"input: {exc}") from exc
    except ReservedConversation as exc:
        raise Invalid(f"conversation_id: {exc}") from exc
    if submitted.outcome == "rejected":
        raise Conflict(
            f"{submitted.reason}; when_busy is reject, so nothing was written "
            "(steer or follow_up would add the input to it)"
        )
    return submitted


def resubmit(user: User, submission_id: str, action_id: str, reason: str) -> ActionResult:
    """Submit the same input again as a new submission linked to the original, as any
    submission: it starts a turn, or follows the one the conversation is busy with."""
    require_operator(user)
    kernel = runtime().kernel
    original = kernel.storage.submission(submission_id)
    if original is None:
        raise UnknownRecord(f"no submission {submission_id}")
    if not _done_before(original.session_id, action_id, "resubmit", submission_id):
        taken = kernel.storage.submission_by_request(original.session_id, action_id)
        _refuse_unless(
            taken is None,
            f"action id {action_id!r} is the request id of submission "
            f"{taken.id if taken else ''}: send a fresh one",
        )
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
        raise Invalid(f"the original submission cannot run again: {exc}") from exc
    assert submitted.submission is not None
    return ActionResult(
        action_id, "resubmit", submission_id, original.session_id,
        submitted.submission.created_seq, submitted.outcome == "duplicate",
        ["the whole request runs again: its model and tool calls may repeat"],
    )


def compact_conversation(
    user: User, conversation_id: str, action_id: str, reason: str, last_entry_id: str
) -> ActionResult:
    """Summarize the older part of a conversation now (an ``agent-compaction`` task,
    :mod:`kernel.agent.compaction`): later model requests see the summary in place of
    the entries it covers; the transcript keeps them. ``last_entry_id``: the newest entry
    the operator saw; a conversation that has moved on since is refused (Conflict)."""
    require_operator(user)
    kernel = runtime().kernel
    conversation = kernel.storage.conversation(conversation_id)
    if conversation is None:
        raise UnknownRecord(f"no conversation {conversation_id}")
    if conversation_id == operations_log_id(conversation.session_id):
        raise Invalid("conversation: the operations log is not a model's conversation")
    session_id = conversation.session_id
    if not _done_before(session_id, action_id, "compact", conversation_id):
        newest = session_reads.last_entries(conversation_id, 1, 0).entries
        _refuse_unless(
            bool(newest) and newest[-1].id == last_entry_id,
            f"the newest entry of {conversation_id} is "
            f"{newest[-1].id if newest else 'none'}, not {last_entry_id}: look again",
        )
    task_input = {"conversation_id": conversation_id, "reason": "operator", "by": actor(user)}

    def build(draft: Draft) -> None:
        draft.create_task(agent.COMPACTION, task_input)

    seq, replayed = _commit(user, session_id, action_id, "compact", conversation_id, reason,
                            build)
    return ActionResult(action_id, "compact", conversation_id, session_id, seq, replayed, [])


# -- API tokens ----------------------------------------------------------------------------


def revoke_token(user: User | None, token_id: int, by: str | None = None) -> TokenView:
    """Revoke a token from now on (kept, listed as revoked, with who revoked it;
    idempotent: the first revocation is the one kept). ``user`` may revoke only their
    own (another's is "no such token"); None is the shell's authority (``manage.py
    api_token --revoke``, naming itself in ``by``), over every token. Sockets opened with
    it close within ``WEBSOCKET_RECHECK_SECONDS``."""
    found = ApiToken.objects.filter(pk=token_id)
    if user is not None:
        found = found.filter(user=user)
    who = actor(user) if user is not None else (by or "shell")
    revoked = found.filter(revoked_at__isnull=True).update(
        revoked_at=timezone.now(), revoked_by=who)
    token = found.select_related("user").first()
    if token is None:
        raise UnknownRecord(f"no token {token_id} of yours" if user else f"no token {token_id}")
    if revoked:
        audit.info("API token %r (#%s) of %s revoked by %s", token.name, token.pk,
                   token.user.get_username(), who,
                   extra={"token": token.pk, "user": token.user.get_username(), "by": who})
    return token_view(token)


# -- retention -------------------------------------------------------------------------------


def retention_policy() -> RetentionPolicy:
    """The policy the settings configure (KERNEL_RETENTION_DAYS and _BY_STATUS)."""
    try:
        return RetentionPolicy(
            settings.KERNEL_RETENTION_DAYS, dict(settings.KERNEL_RETENTION_DAYS_BY_STATUS)
        )
    except ValueError as exc:
        raise Invalid(f"KERNEL_RETENTION_DAYS_BY_STATUS: {exc}") from exc


def prune(*, dry_run: bool = False, progress: Progress = quiet) -> PruneReport:
    """Make the commit log's partitions ahead, then remove the history of the finished
    sessions the retention policy says are due (kernel.retention); ``dry_run`` only
    counts. The shell (``manage.py prune``) and beat (daily) ask for it; no user does, so
    it is logged rather than recorded in a session. Raises PruneRunning (errors.Conflict)
    if another prune holds the lock."""
    kernel = runtime().kernel
    now = kernel.clock.now()
    if not dry_run:
        made = prepare_partitions(
            now, settings.KERNEL_COMMIT_PARTITION, settings.KERNEL_COMMIT_PARTITIONS_AHEAD
        )
        progress(f"partitions made: {', '.join(made) or 'none needed'}")
    try:
        report = kernel.storage.prune(retention_policy(), now, dry_run=dry_run, progress=progress)
    except PruneRunning as exc:
        raise Conflict(str(exc)) from exc
    log.info("prune: %s", report.summary())
    return report


def sweep_artifacts() -> int:
    """Remove the artifacts older than the grace period (kernel.artifacts.GRACE) that no
    entry references, from the store the settings name; how many. Beat asks for it daily
    (controlplane.celery.ARTIFACT_SWEEP); it is logged, as the prune is."""
    kernel = runtime().kernel
    assert kernel.artifacts is not None  # set by the kernel when not given
    removed = kernel.artifacts.sweep(referenced_artifacts, kernel.clock.now())
    log.info("artifact sweep: %d unreferenced artifact(s) removed", removed)
    return removed


# -- the approval gate ---------------------------------------------------------------------


def decide_call(
    user: User,
    session_id: str,
    call_id: str,
    action_id: str,
    reason: str,
    decision: str,
    seen: str,
    arguments: Any = None,
) -> ActionResult:
    """Approve or deny a gated tool call (:mod:`kernel.agent.approval`) that the operator
    saw with arguments of digest ``seen``; an approval may carry edited ``arguments``
    (checked against the tool's parameters: Invalid naming the field), which then run
    instead, both versions kept. A call no longer waiting, or waiting with other
    arguments, is refused (Conflict) and nothing changes; of two decisions at once,
    exactly one is committed (checked in the commit, under the session's lock)."""
    require_operator(user)
    if decision not in (approvals.APPROVE, approvals.DENY):
        raise Invalid(f"decision: {approvals.APPROVE!r} or {approvals.DENY!r}")
    task = approval_reads.call_task(session_id, call_id)
    if not _done_before(session_id, action_id, decision, task.id):
        requested = approvals.pending(task)
        _refuse_unless(
            requested is not None,
            f"call {call_id} waits for no approval (its task {task.id} is "
            f"{task.shown_status} in phase {task.phase!r}): decided already, or timed out",
        )
        assert requested is not None
        _refuse_unless(
            seen == requested["digest"],
            f"call {call_id} waits with arguments of digest {requested['digest']}, not "
            f"{seen}: the arguments you saw are not those waiting; look again",
        )
        if arguments is not None:
            try:
                storable(arguments, "arguments")
            except UnstorableValue as exc:
                raise Invalid(str(exc)) from exc
            problem = approvals.check_arguments(requested, arguments)
            if problem is not None:
                raise Invalid(problem)
    return _act(
        user, action_id, reason, decision, task,
        lambda d: approvals.decide(d, task.id, decision, by=actor(user), reason=reason,
                                   seen=seen, arguments=arguments),
    )
