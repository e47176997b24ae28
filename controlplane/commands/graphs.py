"""Operator actions on a LangGraph thread (:mod:`kernel.hosts.langgraph`): resume an
interrupted run, start a run, fork one from a checkpoint."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib.auth.models import User

from controlplane.access import actor, require_operator
from controlplane.commands.actions import (
    ActionResult,
    act_on_task,
    commit_action,
    done_before,
    refuse_unless,
)
from controlplane.errors import Conflict, Invalid
from controlplane.reads import graphs as graph_reads
from controlplane.reads import sessions as session_reads
from controlplane.reads import tasks as task_reads
from kernel import DocumentConflict, Draft, Task
from kernel.errors import UnstorableValue
from kernel.hosts.langgraph.interrupts import (
    check_resume,
    interrupted,
    resume_signal,
    waited_signal,
)
from kernel.hosts.langgraph.layout import FORKS, INDEX, INDEX_KEY, STARTS
from kernel.values import storable


def resume_graph(
    user: User, task_id: str, action_id: str, reason: str, checkpoint_id: str, value: Any,
    interrupt_ids: list[str],
) -> ActionResult:
    """Resume a hosted LangGraph run interrupted at ``checkpoint_id`` with ``value``,
    checked against the schema the node declared, if any: one commit naming the
    operator. ``interrupt_ids`` are the interrupts the operator saw there: a node that
    interrupts again after its resume does so at the same checkpoint, so a run no longer
    waiting there, or waiting there on other interrupts, is refused (Conflict); a value
    that cannot be stored is Invalid."""
    require_operator(user)
    task = task_reads.record(task_id)
    try:
        storable(value, "value")
    except UnstorableValue as exc:
        raise Invalid(str(exc)) from exc
    if not done_before(user, task.session_id, action_id, "resume", task_id):
        try:
            check_resume(task, checkpoint_id, value, interrupt_ids)
        except LookupError as exc:
            raise Conflict(f"{exc} (it is {task.shown_status}): look again") from exc
        except ValueError as exc:
            raise Invalid(str(exc)) from exc
    payload = {"value": value, "by": actor(user), "reason": reason}
    waiting = interrupted(task)  # None for a repeat whose resume was taken already
    signal = waited_signal(waiting) if waiting else resume_signal(checkpoint_id)
    return act_on_task(user, action_id, reason, "resume", task,
                       lambda d: d.signal(task_id, signal, payload, step_epoch=task.epoch),
                       seen={"checkpoint_id": checkpoint_id, "interrupt_ids": interrupt_ids})


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
    try:
        storable(graph_input, "input")
    except UnstorableValue as exc:
        raise Invalid(str(exc)) from exc
    expected: int | None = None  # a repeat is answered with the first commit, as it is
    if not done_before(user, session_id, action_id, "start", kind):
        _check_graph(kind)
        thread = graph_reads.thread(session_id)
        _refuse_unless_thread_is(thread, expected_version, "start a run")
        expected = expected_version

    def build(draft: Draft) -> str:
        run = draft.create_task(kind, run_input(graph_input))
        _name_in_index(draft, STARTS, run, expected)
        return run

    return _start_run(user, session_id, action_id, "start", kind, reason, build,
                      ["the graph runs from the thread's newest checkpoint, with its side "
                       "effects"], {"expected_version": expected_version})


def fork_graph(
    user: User, session_id: str, action_id: str, reason: str, checkpoint_id: str,
    expected_version: int, values: Any = None, kind: str | None = None,
    as_node: str | None = None,
) -> ActionResult:
    """Start a new run of the session's graph from its thread's checkpoint
    ``checkpoint_id`` (time travel): nothing before that checkpoint runs again; with
    ``values`` (a JSON object) the state there is updated first (LangGraph's
    ``update_state``), as if node ``as_node`` wrote them: LangGraph needs it where the
    checkpoint's step ran several nodes (else the run fails, saying so), and by default
    takes the node that wrote last. The fork is a new branch of the thread: the
    checkpoints after the fork point stay readable. One commit naming the operator,
    which creates the run. The run is of ``kind``, a graph registered here (a new version
    of the graph, say, to go on with fixed nodes), or of the thread's newest run's kind
    when none is given.

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
    elif as_node is not None:
        raise Invalid("as_node: names the node that writes `values`; there are none")
    thread = graph_reads.thread(session_id)
    if thread is None:
        raise Conflict(f"session {session_id} holds no graph thread to fork")
    kind = kind or thread.kind
    if kind is None:
        raise Invalid(f"kind: session {session_id} holds no graph run whose kind a fork "
                      "could take: name the graph to run")
    expected: int | None = None  # a repeat is answered with the first commit, as it is
    if not done_before(user, session_id, action_id, "fork", checkpoint_id):
        _check_graph(kind, as_node)
        namespaces, _ = graph_reads.versioned_index(session_id)
        refuse_unless(checkpoint_id in namespaces.get(graph_reads.ROOT, {}),
                      f"checkpoint {checkpoint_id} is not in the thread (any more): look again")
        _refuse_unless_thread_is(thread, expected_version, "fork")
        expected = expected_version

    def build(draft: Draft) -> str:
        run = draft.create_task(kind, fork_input(checkpoint_id, values, as_node))
        _name_in_index(draft, FORKS, run, expected)
        return run

    return _start_run(user, session_id, action_id, "fork", checkpoint_id, reason, build,
                      ["the nodes after the fork point run again, with their side effects"],
                      {"expected_version": expected_version})


def retry_of_a_run(task: Task, repeat: bool) -> Callable[[Draft], None] | None:
    """What a retry of ``task`` adds to its commit when the task is a run of its
    session's graph thread (None for any other task). A graph run goes on from its
    thread's newest checkpoint, as a started or forked one does: so its retry is refused
    (Conflict) while another run of the thread has not ended, and it names the run in the
    thread's index at the version read here, so that of a retry and a start or fork made
    meanwhile only one is committed. ``repeat``: the retry was made already under its
    action id (its commit answers it, so nothing is checked)."""
    thread = graph_reads.thread(task.session_id)
    if thread is None or all(r.task_id != task.id for r in thread.runs):
        return None
    expected: int | None = None
    if not repeat:
        others = [r.task_id for r in thread.open_runs if r.task_id != task.id]
        refuse_unless(not others, f"run {', '.join(others)} of this thread has not ended: "
                      "retry once it has (or cancel it)")
        expected = thread.version
    return lambda draft: _name_in_index(draft, STARTS, task.id, expected)


def _check_graph(kind: str, as_node: str | None = None) -> None:
    """Invalid unless ``kind`` is a graph registered in this process, and ``as_node``
    (when named) one of its nodes: the run would otherwise fail at its first step."""
    graphs = graph_reads.registered()
    if kind not in graphs:
        raise Invalid(f"kind: {kind!r} is not a graph registered here (graphs: "
                      f"{', '.join(graphs) or 'none'})")
    if as_node is not None and not as_node.startswith("__"):  # LangGraph's own: its call
        nodes = graph_reads.nodes(kind)
        if as_node not in nodes:
            raise Invalid(f"as_node: graph {kind!r} has no node {as_node!r} (nodes: "
                          f"{', '.join(nodes)})")


def _refuse_unless_thread_is(
    thread: graph_reads.Thread | None, expected_version: int, what: str,
) -> None:
    """Conflict while a run of the thread has not ended, or when the thread is not at the
    version the operator saw (0: none yet)."""
    version = thread.version if thread is not None else 0
    running = thread.open_runs if thread is not None else []
    refuse_unless(not running,
                  f"run {', '.join(r.task_id for r in running)} of this thread has not "
                  f"ended: {what} once it has (or cancel it)")
    refuse_unless(version == expected_version,
                  f"the thread changed since you saw it (it is at version {version}, you "
                  f"saw {expected_version}): look again")


def _name_in_index(draft: Draft, where: str, run: str, expected: int | None) -> None:
    """Name an operator's run in the thread's index (in place of the one named there
    before: who and why are in the operations log), at the version the checks read: a
    checkpoint written or pruned meanwhile, or another run started, refuses the commit,
    so two runs never go on from the thread's head at once."""
    draft.update_document(INDEX, INDEX_KEY, {"op": "set", "path": [where], "value": {run: True}},
                          expected_version=expected)


def _start_run(
    user: User, session_id: str, action_id: str, action: str, target: str, reason: str,
    build: Callable[[Draft], str], may_repeat: list[str], seen: dict[str, Any],
) -> ActionResult:
    """Commit an action that creates one graph run: the result names the run (the one
    the first commit created, for a repeat)."""
    made: list[str] = []
    try:
        seq, replayed = commit_action(user, session_id, action_id, action, target, reason,
                                      lambda draft: made.append(build(draft)), seen=seen)
    except DocumentConflict as exc:  # the index moved between the checks and the commit
        raise Conflict(f"the thread changed since you saw it ({exc}): look again") from exc
    if replayed:  # the first commit's run, unless retention has removed that commit
        made = session_reads.tasks_committed(session_id, seq)
    return ActionResult(action_id, action, target, session_id, seq, replayed, may_repeat,
                        task_id=made[0] if made else None)
