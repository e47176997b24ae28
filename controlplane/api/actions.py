"""Operator actions over HTTP: each endpoint is a thin caller of :mod:`controlplane.commands`.

Every action carries a client-chosen ``action_id`` (a repeat does nothing new and says
``replayed``), needs the operator role, and is one commit naming the operator, logged
with its reason in the session's operations log.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Router

from controlplane import commands
from controlplane.api.auth import caller
from controlplane.api.schemas import (
    ActionOut,
    ApproveIn,
    BulkFilter,
    BulkIn,
    BulkOut,
    BulkPreview,
    CancelIn,
    CompactIn,
    DenyIn,
    ForkIn,
    GraphRunIn,
    ResolveIn,
    ResubmitIn,
    ResumeIn,
    RetryIn,
    WakeIn,
)
from controlplane.api.types import PathText
from controlplane.reads.tasks import TaskFilter

router = Router(tags=["actions"])


@router.post("/tasks/{task_id}/cancel", response=ActionOut)
def cancel(request: HttpRequest, task_id: PathText, body: CancelIn) -> Any:
    """Cancel a task and its owned subtasks: the running phase cannot commit any more, each
    cancel handler commits its wrap-up, then the tree ends ``cancelled``. Send the task's
    `run` you saw as `expected_run`: it stops that run whatever phase it has reached
    since, and a task started again since (retried or restarted by someone else) is
    refused (409), as is one that has ended."""
    return commands.cancel_task(caller(request), task_id, body.action_id, body.reason,
                                body.expected_run)


@router.post("/tasks/{task_id}/retry", response=ActionOut)
def retry(request: HttpRequest, task_id: PathText, body: RetryIn) -> Any:
    """Run a failed task again from its last saved phase. Send the task's `updated_seq`
    you saw as `expected_seq`: a task changed since (retried by someone else and failed
    again, say: a second retry would repeat its side effects) is refused (409)."""
    return commands.retry_task(caller(request), task_id, body.action_id, body.reason,
                               body.expected_seq)


@router.post("/tasks/{task_id}/resolve", response=ActionOut)
def resolve(request: HttpRequest, task_id: PathText, body: ResolveIn) -> Any:
    """Decide an uncertain operation with one of the decisions its task offers (for an
    email: it was sent, it was not and is sent again, or give up), naming the step you
    saw (the task's ``step``): a step answered already or replaced since is refused
    (409) and nothing changes."""
    return commands.resolve_task(
        caller(request), task_id, body.action_id, body.reason, body.decision,
        commands.Step(body.signal, body.epoch), body.receipt,
    )


@router.post("/tasks/{task_id}/resume", response=ActionOut)
def resume(request: HttpRequest, task_id: PathText, body: ResumeIn) -> Any:
    """Resume a hosted LangGraph run that waits on an interrupt (``interrupt(value)`` in a
    node), naming the interrupts you saw (`checkpoint_id` and `interrupt_ids`: a node that
    asks again after its resume does so at the same checkpoint): the node receives
    ``value``. An interrupt answered already or replaced since is refused (409); a value
    that does not meet the schema the interrupt declares is refused (422)."""
    return commands.resume_graph(caller(request), task_id, body.action_id, body.reason,
                                 body.checkpoint_id, body.value, body.interrupt_ids)


@router.post("/sessions/{session_id}/graph/runs", response=ActionOut)
def start_graph(request: HttpRequest, session_id: PathText, body: GraphRunIn) -> Any:
    """Start a run of a registered graph on the session's thread (the session is the
    thread): the graph is invoked with `input` from the thread's newest checkpoint, or
    from the start on a session that holds no thread yet; `task_id` is the run. Refused
    (409) while a run of the thread has not ended, or when the thread changed since the
    `version` you send back (0 for a new thread); 422 for a kind that is not a graph
    registered here."""
    return commands.start_graph(caller(request), session_id, body.action_id, body.reason,
                                body.kind, body.input, body.expected_version)


@router.post("/sessions/{session_id}/graph/fork", response=ActionOut)
def fork_graph(request: HttpRequest, session_id: PathText, body: ForkIn) -> Any:
    """Start a new run of the session's graph from one of its thread's checkpoints (time
    travel): nothing before it runs again, the nodes after it do, with their side
    effects; the checkpoints after it stay, on their branch. Refused (409) while a run
    of the thread has not ended, when the checkpoint is gone, or when the thread changed
    since the `version` you send back (`GET /sessions/{session_id}/graph`)."""
    return commands.fork_graph(caller(request), session_id, body.action_id, body.reason,
                               body.checkpoint_id, body.expected_version, body.values,
                               body.kind, body.as_node)


@router.post("/tasks/{task_id}/wake", response=ActionOut)
def wake(request: HttpRequest, task_id: PathText, body: WakeIn) -> Any:
    """End a sleep early: the task runs its next phase now. Send the task's `updated_seq`
    you saw as `expected_seq`: a task changed since (woke and slept again, say) is
    refused (409)."""
    return commands.wake_task(caller(request), task_id, body.action_id, body.reason,
                              body.expected_seq)


@router.post("/sessions/{session_id}/calls/{call_id}/approve", response=ActionOut)
def approve_call(
    request: HttpRequest, session_id: PathText, call_id: PathText, body: ApproveIn
) -> Any:
    """Approve a tool call that waits for approval (`GET /sessions/{id}/approvals`),
    naming the `digest` of the arguments you saw and, as `expected_request`, the request
    you saw (its `request`): it runs on a worker with exactly those arguments, or with
    the edited `arguments` you send (both kept). A call decided already, timed out,
    waiting with other arguments, or asked again since (another request, even with the
    same arguments) is refused (409)."""
    return commands.decide_call(caller(request), session_id, call_id, body.action_id,
                                body.reason, "approve", body.digest, body.expected_request,
                                body.arguments)


@router.post("/sessions/{session_id}/calls/{call_id}/deny", response=ActionOut)
def deny_call(
    request: HttpRequest, session_id: PathText, call_id: PathText, body: DenyIn
) -> Any:
    """Deny a tool call that waits for approval: it does not run, and the model is told
    it was denied, with your reason. Refused (409) as `approve` is."""
    return commands.decide_call(caller(request), session_id, call_id, body.action_id,
                                body.reason, "deny", body.digest, body.expected_request)


@router.post("/submissions/{submission_id}/resubmit", response=ActionOut)
def resubmit(request: HttpRequest, submission_id: PathText, body: ResubmitIn) -> Any:
    """Submit the same input again as a new submission linked to the original: it starts
    a turn, or follows the one the conversation is busy with. Send the submission's
    `updated_seq` you saw as `expected_seq`: each resubmission changes it, so a
    submission resubmitted (or settled) since is refused (409) rather than run twice."""
    return commands.resubmit(caller(request), submission_id, body.action_id, body.reason,
                             body.expected_seq)


@router.post("/conversations/{conversation_id}/compact", response=ActionOut)
def compact(request: HttpRequest, conversation_id: PathText, body: CompactIn) -> Any:
    """Summarize the older part of a conversation now, naming the newest entry you saw
    (`last_entry_id`): later model requests see the summary instead of the entries it
    covers; the transcript keeps every entry. A conversation with a newer entry, or
    whose compaction (an operator's or a turn's) has not ended, is refused (409)."""
    return commands.compact_conversation(caller(request), conversation_id, body.action_id,
                                         body.reason, body.last_entry_id)


def _filter(body: BulkFilter) -> TaskFilter:
    return TaskFilter(
        session_id=body.session_id, kind=body.kind, status=body.status, outcome=body.outcome
    )


@router.post("/actions/bulk/preview", response=BulkPreview)
def bulk_preview(request: HttpRequest, body: BulkFilter) -> Any:
    """Which tasks a bulk action with this filter would touch (their ids, count and
    digest): show them, then confirm with the count and the digest. The digest covers
    what the action acts on as well as the ids (`seen`): for a retry each task's
    `updated_seq`, for a cancel each task's `run`."""
    found = commands.bulk_preview(caller(request), _filter(body), body.action)
    return {"count": found.count, "task_ids": found.task_ids, "seen": found.seen,
            "digest": found.digest}


@router.post("/actions/bulk", response=BulkOut)
def bulk(request: HttpRequest, body: BulkIn) -> Any:
    """Cancel or retry exactly the tasks the preview found, one commit per task, a result
    each.

    ``expected_count`` and ``expected_digest`` are the preview's: if the filter finds
    another set now, or the same tasks changed since in what the action acts on (a retry:
    a task failed again; a cancel: a task started again), nothing is done (409) and the
    operator previews again. A task that changes between this check and its own commit
    is left, its result saying why. The same
    request again (its action id) answers what the first did; the id used for another
    action or set is refused (409).
    """
    return commands.bulk_act(
        caller(request), body.action, _filter(body), body.action_id, body.reason,
        body.expected_count, body.expected_digest,
    )
