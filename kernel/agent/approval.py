"""The approval gate: what a gated call's tool task records while it waits, and what an
operator's decision sends it.

A call its tool's :class:`~kernel.agent.tools.Gate` holds is committed as awaiting
approval: the tool task's checkpoint holds ``approval`` (the call's name, arguments,
their digest, why it is gated and until when it waits) and the task sleeps in phase
``approval`` until that time, holding no worker. A decision is one commit that sends
the task the signal :data:`SIGNAL` and wakes it (:func:`decide`): refused under the
session's lock if the task no longer sleeps there, so of two decisions exactly one
is committed. The task then runs the call with exactly the approved arguments
(committing its intent first, as every call does), or gives the model a denial with the reason. When
the time runs out first, it denies the call itself.

An agent that runs its tools itself (a framework's agent on a host) asks through a task
of its own, :data:`TASK_KIND`: it holds the same record in the same phase and takes the
same decisions, and its result is the decision, which the agent's turn (waiting for it,
holding no worker) applies as its framework says.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import jsonschema_rs

from kernel.commit import Draft
from kernel.forks import restart_count
from kernel.records import Status, Task
from kernel.registry import Registry
from kernel.run import Run
from kernel.tasks import Transition

from .tools import DAY, digest

JSON = Any
SIGNAL = "approval"
PHASE = "approval"
APPROVAL_PHASE = PHASE
APPROVE = "approve"
DENY = "deny"
TIMED_OUT = "timeout"
TASK_KIND = "agent-approval"
"""A call that an agent running its own tools asks an operator about: input ``call``
(``id``, ``name``, ``arguments``), ``conversation_id`` and ``approval`` (what
:func:`requested` builds but ``until``); its result is the decision."""
WHO = "operators"
"""Who may decide, as the pending call shows it: people with the operator role."""


def requested(name: str, arguments: JSON, *, why: str, timeout: float = DAY,
              parameters: JSON = None, who: str = WHO) -> JSON:
    """The record of a call waiting for approval, without its deadline (set when the
    wait starts): what an operator is shown and what a decision must name."""
    if not timeout > 0:
        raise ValueError("an approval's timeout is a positive number of seconds")
    return {"name": name, "arguments": arguments, "digest": digest(arguments),
            "parameters": parameters or {}, "why": why, "timeout": timeout, "who": who}


def wait(run: Run, record: JSON, checkpoint: JSON = None) -> Transition:
    """Commit ``record`` as awaiting approval: the task sleeps in :data:`PHASE` (holding
    no worker) until a decision wakes it or its timeout is up."""
    until = run.now + timedelta(seconds=record["timeout"])
    return run.sleep(until=until, then=PHASE, checkpoint={
        **(checkpoint or {}), "approval": {**record, "until": until.isoformat(),
                                           "restarts": restart_count(run.checkpoint)}})


def _started_again(run: Run) -> bool:
    """Whether the task was started again from a phase (:mod:`kernel.forks`) since it
    asked: its decision was dropped, and its deadline is that of a request nobody is
    asked by any more."""
    asked = int(run.checkpoint["approval"].get("restarts", 0))
    return restart_count(run.checkpoint) > asked


def decision(run: Run) -> JSON | None:
    """In :data:`PHASE`: the operator's decision, the timeout's denial once the time is
    up, or None when neither is there yet (woken early, or started again since it asked:
    :func:`wait_on`)."""
    record = run.checkpoint["approval"]
    decided = run.signal(SIGNAL)
    if decided is not None:
        return dict(decided)
    if run.now < datetime.fromisoformat(record["until"]) or _started_again(run):
        return None
    return {"decision": TIMED_OUT, "by": "kernel",
            "reason": f"no operator decided within {record['timeout']:g} s",
            "digest": record["digest"]}


def wait_on(run: Run) -> Transition:
    """Sleep on until the deadline; started again since it asked, ask again: a request of
    its own, for the full timeout."""
    record = run.checkpoint["approval"]
    if _started_again(run):
        return wait(run, {k: v for k, v in record.items() if k not in ("until", "restarts")})
    return run.sleep(until=datetime.fromisoformat(record["until"]), then=PHASE)


def register_approvals(registry: Registry, queue: str = "brain") -> None:
    """Add :data:`TASK_KIND` to ``registry`` (once, whoever asks first)."""
    if TASK_KIND in registry.kinds():
        return

    @registry.task(TASK_KIND, queue=queue)
    class Approval:
        initial = "ask"
        no_restart_ended = (
            "its decision is the call's answer, which the turn that asked has taken: "
            "started again, it would ask for a decision nothing waits for")

        def ask(self, run: Run) -> Transition:
            return wait(run, run.input["approval"])

        def approval(self, run: Run) -> Transition:
            decided = decision(run)
            if decided is None:
                return wait_on(run)
            record = {**decided, "proposed_digest": run.checkpoint["approval"]["digest"]}
            if "arguments" in decided:
                record["edited"] = True
            return run.succeed(record)


def pending(task: Task) -> JSON | None:
    """The approval ``task`` (an ``agent-tool`` or :data:`TASK_KIND` task) waits for now,
    or None."""
    if task.status is not Status.SLEEPING or task.phase != PHASE or task.cancel is not None:
        return None
    if SIGNAL in task.signals:
        return None
    return (task.checkpoint or {}).get("approval")


def check_arguments(requested: JSON, arguments: JSON) -> str | None:
    """Why edited ``arguments`` do not fit the parameters the gated tool declared when
    it asked (``requested["parameters"]``), or None when they do."""
    try:
        jsonschema_rs.validator_for(requested.get("parameters") or {}).validate(arguments)
    except jsonschema_rs.ValidationError as exc:
        where = "/".join(str(p) for p in exc.instance_path)
        return f"arguments{'/' + where if where else ''}: {exc.message}"
    return None


def decide(
    draft: Draft,
    task_id: str,
    decision: str,
    *,
    by: str,
    reason: str,
    seen: str,
    arguments: JSON = None,
) -> JSON:
    """Add an operator's decision on a pending call to ``draft`` (the signal and the wake
    in one commit): ``seen`` is the digest of the arguments they decided on;
    ``arguments``, when given with an approval, are what runs instead (edited)."""
    if decision not in (APPROVE, DENY):
        raise ValueError(f"decision: {APPROVE!r} or {DENY!r}")
    payload: JSON = {"decision": decision, "by": by, "reason": reason, "digest": seen}
    if arguments is not None:
        if decision != APPROVE:
            raise ValueError("arguments: only an approval takes edited arguments")
        payload["arguments"] = arguments
        payload["arguments_digest"] = digest(arguments)
    draft.signal(task_id, SIGNAL, payload)
    draft.wake(task_id)
    return payload
