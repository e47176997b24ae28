"""The approval gate (:mod:`kernel.agent.approval`): approving or denying a gated tool
call as the operator saw it."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib.auth.models import User

from controlplane.access import actor, require_operator
from controlplane.commands.actions import (
    ActionResult,
    act_on_task,
    done_before,
    refuse_unless,
)
from controlplane.errors import Invalid
from controlplane.reads import approvals as approval_reads
from controlplane.worker.runtime import runtime
from kernel.agent import approval as approvals
from kernel.errors import UnstorableValue
from kernel.values import storable


def decide_call(
    user: User,
    session_id: str,
    call_id: str,
    action_id: str,
    reason: str,
    decision: str,
    seen: str,
    expected_request: str,
    arguments: Any = None,
) -> ActionResult:
    """Approve or deny a gated tool call (:mod:`kernel.agent.approval`) that the operator
    saw with arguments of digest ``seen``, in the request ``expected_request`` names
    (:func:`controlplane.reads.approvals.request_identity`: a call asked again with the
    same arguments is another request); an approval may carry edited ``arguments``
    (checked against the tool's parameters: Invalid naming the field), which then run
    instead, both versions kept. A call no longer waiting, or waiting with other
    arguments, is refused (Conflict) and nothing changes; of two decisions at once,
    exactly one is committed (checked in the commit, under the session's lock)."""
    require_operator(user)
    if decision not in (approvals.APPROVE, approvals.DENY):
        raise Invalid(f"decision: {approvals.APPROVE!r} or {approvals.DENY!r}")
    task = approval_reads.call_task(session_id, call_id, expected_request)
    if not done_before(user, session_id, action_id, decision, task.id):
        requested = approvals.pending(task)
        refuse_unless(
            requested is not None,
            f"call {call_id} waits for no approval (its task {task.id} is "
            f"{task.shown_status} in phase {task.phase!r}): decided already, or timed out",
        )
        assert requested is not None
        # Past its deadline a call has timed out even while no worker has run its
        # timeout yet (the task sleeps on until one does): a decision then changes nothing.
        until = datetime.fromisoformat(requested["until"])
        refuse_unless(
            runtime().kernel.clock.now() < until,
            f"call {call_id} timed out at {until.isoformat()}: nobody decided by then, "
            "so it is denied",
        )
        refuse_unless(
            seen == requested["digest"],
            f"call {call_id} waits with arguments of digest {requested['digest']}, not "
            f"{seen}: the arguments you saw are not those waiting; look again",
        )
        refuse_unless(
            approval_reads.request_identity(requested) == expected_request,
            f"call {call_id} was asked again since the request you saw (it waits until "
            f"{until.isoformat()}): look again",
        )
        if arguments is not None:
            try:
                storable(arguments, "arguments")
            except UnstorableValue as exc:
                raise Invalid(str(exc)) from exc
            problem = approvals.check_arguments(requested, arguments)
            if problem is not None:
                raise Invalid(problem)
    return act_on_task(
        user, action_id, reason, decision, task,
        lambda d: approvals.decide(d, task.id, decision, by=actor(user), reason=reason,
                                   seen=seen, arguments=arguments),
        seen={"digest": seen, "expected_request": expected_request},
    )
