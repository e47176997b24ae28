"""A compiled LangGraph graph as a task definition: a graph run is a durable task.

The task's session is the graph's thread. Its one phase, ``run``, invokes the graph with
the Session Store saver bound to the run's lease, so that each super-step's checkpoint
is committed with the task's own progress (``checkpoint["langgraph"]``: the checkpoint
id and step) in one commit, fenced by the lease's epoch, and each finished node's
writes are committed as soon as LangGraph saves them. A worker that dies mid-step leaves
the lease to expire; the next worker re-enters ``run``, which resumes the thread from its
last checkpoint: LangGraph applies the writes saved in that step instead of running
their nodes again, and runs only the nodes whose writes were not saved.

``interrupt(value)`` in a node ends the phase with a durable wait on a signal named for
the interrupted checkpoint (no worker is held); the signal's payload ``{"value": ...}``
is the resume value, and the task then goes on with ``Command(resume=value)``.
A fork (:func:`fork_input`) starts a new task in the same thread from an earlier
checkpoint: LangGraph replays from there, running nothing before it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from langgraph.errors import is_invalid_resume
from langgraph.types import Command

from kernel.errors import UnstorableValue
from kernel.registry import Registry, TaskDefinition
from kernel.run import Run
from kernel.session import Kernel
from kernel.tasks import Transition
from kernel.values import storable

from .interrupts import resume_map, resume_signal, waited_signal
from .layout import CHANNEL, HOST, NODE, register_documents
from .saver import SessionStoreSaver

JSON = Any


NO_RESTART = (
    "a graph run goes on from its thread's newest checkpoint, not from where the task "
    "stood, and run from its first phase again it would start the graph anew on top of "
    "the thread's state: to go back to a saved node, fork a run from its checkpoint "
    "(Fork from here, on the session page)"
)
"""Why a graph run is not started again from a phase (a fork is: :func:`fork_input`)."""


def run_input(graph_input: JSON) -> JSON:
    """The input of a graph task that invokes the graph with ``graph_input`` on its
    session's thread: from its newest checkpoint, as LangGraph does for a thread it
    already holds (a chat's next message), or from the start on a thread with none."""
    return {"input": graph_input}


def fork_input(checkpoint_id: str, input: JSON = None, as_node: str | None = None) -> JSON:
    """The input of a graph task that goes on from ``checkpoint_id`` of its session's
    thread (time travel): ``input`` None replays from there, a value updates the state
    there first (LangGraph's ``update_state``), as a new branch, as if node ``as_node``
    wrote it: LangGraph needs it where the last step ran several nodes, and by default
    takes the node that wrote last."""
    fork = {"checkpoint_id": checkpoint_id, "values": input}
    return {"fork": fork if as_node is None else {**fork, "as_node": as_node}}


def to_json(value: Any) -> JSON:
    """A graph's output as JSON: LangChain objects (messages) by their serialized form."""
    from langchain_core.load import dumpd

    return json.loads(json.dumps(dumpd(value), default=repr))


TEXT_SHOWN = 10_000
"""How much of the text of an interrupt's value that JSON cannot hold is shown."""


def shown_interrupt(found: Any) -> JSON:
    """An interrupt as the task's checkpoint keeps it: its id, its value (as text, saying
    why, when JSON cannot hold it), and the JSON schema of its resume value when the node
    gave ``interrupt()`` a ``response_schema`` (LangGraph turns a model into its JSON
    schema), which a resume must meet."""
    try:
        value = storable(to_json(found.value), "the interrupt's value")
    except UnstorableValue as exc:  # NaN, text with NUL: the operator reads it as text
        value = {"text": repr(found.value)[:TEXT_SHOWN], "not_shown": str(exc)}
    shown = {"id": found.id, "value": value}
    schema = getattr(found, "response_schema", None)
    if isinstance(schema, dict):
        shown["schema"] = to_json(schema)
    return shown


@dataclass
class GraphHost:
    """Runs one compiled graph as the phases of a task kind."""

    graph: Any
    kernel: Callable[[], Kernel]
    output: Callable[[Any], JSON] = to_json
    _saver: SessionStoreSaver | None = field(default=None, init=False)
    _bound_graph: Any = field(default=None, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _needs: dict[str, JSON] | None = field(default=None, init=False)

    def needs(self, input: JSON, checkpoint: JSON) -> dict[str, JSON]:
        """The graph's nodes, by name, and its subgraphs' (``<subgraph>|<node>``, as
        LangGraph names their namespaces), as the environment a run records
        (:mod:`kernel.environment`): a thread's checkpoints name the nodes that run next
        and the ones whose writes were saved, a subgraph's checkpoints its own, so a run
        resumed where one of them is gone is blocked for an operator, not run on a graph
        its checkpoints do not describe (a subgraph without the node that was to run
        next ends as if it had finished). Likewise the channels its checkpoints hold the
        state in (its state's keys, and the barriers of edges that wait for several
        nodes), each with the kind of channel it is: resumed on a graph without one,
        LangGraph drops its value; on one that reduces its writes otherwise, the saved
        writes are applied otherwise. A node or a channel added is compatible; a node's
        code changed is not seen (it is why one deploys)."""
        if self._needs is None:
            graphs = [("", self.graph), *self.graph.get_subgraphs(recurse=True)]
            needs: dict[str, JSON] = {}
            for ns, graph in graphs:
                at = f"{ns}|" if ns else ""
                needs.update({f"{NODE}{at}{name}": "present" for name in graph.nodes
                              if not name.startswith("__")})
                # A node's own trigger channel (branch:to:<node>) comes and goes with it.
                needs.update({f"{CHANNEL}{at}{name}": type(channel).__name__
                              for name, channel in graph.channels.items()
                              if not name.startswith(("__", "branch:to:"))})
            self._needs = needs
        return self._needs

    @property
    def saver(self) -> SessionStoreSaver:
        with self._lock:
            if self._saver is None:
                self._saver = SessionStoreSaver(self.kernel())
                self._bound_graph = self.graph.copy(update={"checkpointer": self._saver})
            return self._saver

    @property
    def bound(self) -> Any:
        """The graph with the Session Store saver as its checkpointer."""
        _ = self.saver
        return self._bound_graph

    def run(self, run: Run) -> Transition:
        config: dict[str, Any] = {"configurable": {"thread_id": run.session_id}}
        graph = self.bound
        progress = run.checkpoint.get("langgraph")
        waiting = run.checkpoint.get("interrupted")
        fork = (run.input or {}).get("fork")
        if progress is None and fork is not None:
            config["configurable"]["checkpoint_id"] = fork["checkpoint_id"]
            if fork.get("values") is not None:
                with self.saver.committing_through(run):
                    config = graph.update_state(config, fork["values"],
                                                as_node=fork.get("as_node"))
            graph_input: Any = None
        elif progress is None:
            graph_input = (run.input or {}).get("input")  # run_input's
        elif waiting is not None and progress["checkpoint_id"] == waiting["checkpoint_id"]:
            # Nothing committed since the interrupt: the resume has not been applied yet.
            answer = run.signal(waited_signal(waiting))
            value = (answer or {}).get("value")
            try:
                graph_input = Command(resume=resume_map(waiting, value))
            except ValueError:  # several wait, not named: LangGraph says why it cannot
                graph_input = Command(resume=value)
        else:
            graph_input = None
        refused: str | None = None
        with self.saver.committing_through(run):
            try:
                result = graph.invoke(graph_input, config, durability="sync")
            except Exception as exc:
                # A resume the node's response_schema refuses: LangGraph saved nothing of
                # it, and the interrupt waits to be answered again (below).
                if not isinstance(graph_input, Command) or not is_invalid_resume(exc):
                    raise
                refused = f"{type(exc).__name__}: {exc}"
        state = graph.get_state({"configurable": {"thread_id": run.session_id}})
        if state.interrupts:
            checkpoint_id = state.config["configurable"]["checkpoint_id"]
            signal = resume_signal(checkpoint_id, [i.id for i in state.interrupts])
            # Asked again at the same checkpoint after an answer was refused: a wait on a
            # signal the task holds already would take that answer again.
            again, asked = 1, signal
            while run.signal(signal) is not None:
                again += 1
                signal = f"{asked}:{again}"
            interrupted = {
                "checkpoint_id": checkpoint_id,
                "interrupts": [shown_interrupt(i) for i in state.interrupts],
                "signal": signal,
            }
            if refused is not None:
                interrupted["refused"] = refused
            return run.wait_for(signal, then="run", checkpoint={"interrupted": interrupted})
        if refused is not None:
            raise RuntimeError(f"the resume was refused ({refused}) and no interrupt waits")
        checkpoint_id = state.config["configurable"]["checkpoint_id"]
        try:
            output = storable(self.output(result), "the graph's output")
        except UnstorableValue as exc:
            # The state holds what JSON cannot (NaN, text with NUL); its checkpoints keep
            # it, serialized by the saver. The graph has finished: the run has succeeded.
            return run.succeed({"checkpoint_id": checkpoint_id, "output": None,
                                "output_not_shown": f"{exc}; the state is in checkpoint "
                                                    f"{checkpoint_id} of the thread"})
        return run.succeed({"checkpoint_id": checkpoint_id, "output": output})


def register_graph(
    registry: Registry, kind: str, graph: Any, *, kernel: Callable[[], Kernel],
    version: int = 1, queue: str = "default", max_restarts: int = 3,
    output: Callable[[Any], JSON] = to_json,
) -> GraphHost:
    """Register ``graph`` (compiled, with or without a checkpointer: the Session Store
    saver replaces it) as task kind ``kind``. A task's input: ``{"input": <the graph's
    input>}`` or :func:`fork_input`. ``kernel`` gives the process's kernel once the
    first run starts (the registry is built before it).

    A graph compiled with breakpoints (``interrupt_before`` / ``interrupt_after``) is
    refused (ValueError): ``invoke`` returns at one as it does at the graph's end, with
    no interrupt to wait on, so the run would succeed with the output of a graph that
    has not finished. ``interrupt()`` in the node is the durable wait."""
    breakpoints = [nodes if isinstance(nodes, str) else ", ".join(nodes)
                   for nodes in (graph.interrupt_before_nodes, graph.interrupt_after_nodes)]
    if any(breakpoints):
        raise ValueError(
            f"graph {kind!r} is compiled with breakpoints (interrupt_before: "
            f"{breakpoints[0] or 'none'}; interrupt_after: {breakpoints[1] or 'none'}): a "
            "run stopped at one would end as if the graph had finished; call interrupt() "
            "in the node instead, a durable wait for an operator's resume"
        )
    register_documents(registry)  # readers (the dashboard, the API) need the kinds too
    host = GraphHost(graph, kernel, output)
    registry.add(TaskDefinition(kind, version, {"run": host.run}, "run", queue=queue,
                                max_restarts=max_restarts, needs=host.needs,
                                no_restart=NO_RESTART, host=HOST))
    return host
