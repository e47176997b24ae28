"""A registered Pydantic AI agent as a task definition: one task per turn of a
conversation, like a native ``agent-turn``, of kind ``agent:<name>``.

Its one phase, ``run``, runs ``agent.run(...)`` from the beginning every time it is
entered. What was committed before is answered from the journal (a response is not
requested again, a result not computed again), so a run that a crash cut short goes on
from its last commit: the framework replays its own loop (output validation and its
retries, usage limits) over the recorded units. An unsafe call whose intent is
committed but whose result is not is an uncertain step: the turn waits, holding no
worker, for an operator's decision (:data:`DECISIONS`), and applies it when it runs again.

Deferred tools (``requires_approval=True``, ``ApprovalRequired``, ``CallDeferred``) end
a run with ``DeferredToolRequests``, as in Pydantic AI: the turn commits the run's messages and
asks the kernel's approval gate about each call (a task of kind
:data:`kernel.agent.approval.TASK_KIND` each, which the API and the dashboard list
and decide like a native gated call), and waits for them holding no worker. The
decisions start the run's next *segment*: ``agent.run`` again over the committed
messages with ``DeferredToolResults`` (``ToolApproved``, with the operator's edited
arguments if any, or ``ToolDenied`` with their reason, which the framework hands the
model as the call's return). A call deferred to the outside (``CallDeferred``) waits,
holding no worker, for its result as a resolution of the turn (:func:`external`).

A call to a tool marked :func:`~.capability.hands` is not run by the turn: the turn
commits a task of kind ``agent-tool:<name>`` on the ``hands`` queue for it (with the wait
for it, holding no worker) and stops before its next model request. That task replays
the same run from the turn's journal, nothing asked of the model, and runs that one
call through the framework's tool machinery, its intent (an unsafe call's) in its own
checkpoint: an unsafe call cut mid-way is an uncertain step of the hands task, which an
operator resolves there. The turn then runs again and reads the call's result back.
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pydantic_ai import Agent, ModelRetry
from pydantic_ai.exceptions import ToolFailed
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.tools import (
    DeferredToolRequests,
    DeferredToolResults,
    Tool,
    ToolApproved,
    ToolDenied,
)
from pydantic_ai.toolsets import (
    AbstractToolset,
    CombinedToolset,
    FunctionToolset,
    PrefixedToolset,
    RenamedToolset,
    WrapperToolset,
)
from pydantic_ai.usage import RunUsage, UsageLimits
from pydantic_core import to_jsonable_python

from kernel.agent import approval as approvals
from kernel.agent.context import CANCELLED_NOTE, TOOL_RESULT
from kernel.agent.requests import USAGE
from kernel.agent.tools import DAY, Replay
from kernel.agent.turn import CONVERSATION, PROGRESS, release, release_unanswered, turn_kind
from kernel.environment import fingerprint
from kernel.records import Outcome, SubmissionStatus
from kernel.registry import Decision, Receipt, Registry
from kernel.run import Run
from kernel.tasks import Finish, Transition

from .bridge import Bridge
from .capability import (
    CONFIG_KEY,
    KernelDurability,
    Preview,
    Units,
    enter,
    queue_of,
    replay_of,
    suspended,
)
from .journal import Journal, shown_result, unit_of

JSON = Any
HISTORY = "agent-history"
"""Per conversation: the framework's messages after the last turn that answered, which
the next turn's run continues from (``message_history``)."""
log = logging.getLogger(__name__)
NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")

HAPPENED = Decision(
    "happened", "It took effect", "happened",
    description="Record the call as done; the model is told so, with the result you give.",
    receipt=Receipt(optional=("result",)),
)
RUN_AGAIN = Decision(
    "run_again", "It did not: run it again", "run_again",
    may_repeat="the tool is called again",
    description="Call the tool again with the same arguments.",
)
NOT_DONE = Decision(
    "not_done", "It did not: tell the model", "not_done",
    description="Record the call as failed; the model is told it did not take effect.",
)
DECISIONS = (HAPPENED, RUN_AGAIN, NOT_DONE)


@dataclass(frozen=True)
class HostedAgent:
    """A registered agent and what each of its runs is started with."""

    name: str
    agent: Agent[Any, Any]
    deps: Any = None
    usage_limits: UsageLimits | None = None
    approval_timeout: float = DAY
    """Seconds a deferred call waits for an operator's decision; then it is denied."""
    unsafe_tools: frozenset[str] = frozenset()
    """The function tools whose calls commit before they start: unsafe ones (their
    intent) and those run on the hands queue (their task)."""
    answer_ends: bool = False
    """Whether an answer (a response that calls no tool) may wait for the run's end to be
    committed: when no output validator of the user's runs between them."""


def answer_ends(agent: Agent[Any, Any]) -> bool:
    """Whether nothing but the framework's own output handling follows an answer: the
    agent has no output validators (an attribute of the framework's own, read as "some"
    should it be gone, which only costs the answer a commit of its own)."""
    return getattr(agent, "_output_validators", None) == []


NO_RESTART = (
    "a hosted agent's run replays what it committed (its journal), and starts from its "
    "conversation's history, which its own end has moved on: run from a phase again, it "
    "would neither make its calls anew nor find the history it started from. Submit the "
    "request again instead"
)
"""Why a hosted turn (and its hands tasks) is not started again from a phase."""


def hands_kind(name: str) -> str:
    """The task kind that runs an agent's calls on the hands queue."""
    return f"agent-tool:{name}"


def resolution(call_id: str, attempt: int) -> str:
    """The signal an uncertain call waits on (one per attempt: a decision answers one)."""
    return f"resolution:{call_id}:{attempt}"


def function_tools(agent: Agent[Any, Any]) -> Iterator[tuple[str, Tool[Any], JSON]]:
    """The agent's function tools: name, tool, and its metadata (``{}`` for none), whose
    :data:`CONFIG_KEY` is the kernel's config for its calls (False: the kernel leaves
    them alone)."""
    for toolset in agent.toolsets:
        if isinstance(toolset, FunctionToolset):
            for name, tool in toolset.tools.items():
                yield name, tool, tool.metadata or {}


def check_tools(agent: Agent[Any, Any]) -> None:
    """Every function tool's replay policy is one the kernel knows (fails at registration,
    not in the middle of a run)."""
    for _, _, metadata in function_tools(agent):
        if CONFIG_KEY in metadata and metadata[CONFIG_KEY] is not False:
            replay_of(metadata[CONFIG_KEY])
            queue_of(metadata[CONFIG_KEY])


def unsafe_tools(agent: Agent[Any, Any]) -> frozenset[str]:
    """The agent's function tools whose calls commit before they start: unsafe ones (an
    intent) and those run on the hands queue (a task)."""
    return frozenset(
        name for name, _, metadata in function_tools(agent)
        if (config := metadata.get(CONFIG_KEY)) is not False
        and (replay_of(config or {}) is Replay.UNSAFE or queue_of(config or {}) is not None))


def tool_needs(agent: Agent[Any, Any]) -> dict[str, JSON]:
    """What a run of ``agent`` needs of each function tool, as the environment a task
    records (:mod:`kernel.environment`): its parameters' schema (a fingerprint), its
    replay policy, where its calls run and whether they ask for approval first. A run's
    journal holds calls made for the tools as they were; resumed where one is gone,
    takes other arguments or asks for approval otherwise, the framework would answer the
    replayed calls otherwise than it did (defer a call that ran, for an operator to be
    asked about, or run one the run would have asked about)."""
    found: dict[str, JSON] = {}
    for name, tool, metadata in function_tools(agent):
        config = metadata.get(CONFIG_KEY)
        journaled = config is not False
        found[f"tool {name}"] = {
            "prior approval": "asked" if tool.requires_approval else "none",
            "parameters": fingerprint(tool.tool_def.parameters_json_schema),
            "replay": str(replay_of(config or {})) if journaled else "not journaled",
            "runs": (queue_of(config or {}) or "in the turn") if journaled else "in the turn",
        }
    return found


def toolset_needs(agent: Agent[Any, Any]) -> dict[str, JSON]:
    """What a run of ``agent`` needs of each of its toolsets other than a function
    toolset (whose tools :func:`tool_needs` records one by one): a toolset of the user's
    own, an MCP server's, one wrapped in a prefix, a filter or a preparation. Its journal
    may hold calls made for their tools as they were; resumed where one is gone or takes
    other arguments, the replay would call a tool that is not there or pass it arguments
    of another schema. Each is keyed by its id (else its class) and recorded as its kind
    and a fingerprint of :func:`toolset_contents`: what can be read of it without a
    connection or a call of the user's code."""
    found: dict[str, JSON] = {}
    for toolset in agent.toolsets:
        if isinstance(toolset, FunctionToolset):
            continue
        name = f"toolset {toolset_id(toolset) or type(toolset).__name__}"
        key, seen = name, 1
        while key in found:  # two toolsets with neither an id: told apart by their order
            seen += 1
            key = f"{name} {seen}"
        found[key] = {"kind": type(toolset).__name__,
                      "contents": fingerprint(toolset_contents(toolset))}
    return found


def toolset_id(toolset: AbstractToolset[Any]) -> str | None:
    """A toolset's id, or the one of the toolset it wraps (a prefix or a filter keeps the
    id of what it wraps)."""
    while toolset.id is None and isinstance(toolset, WrapperToolset):
        toolset = toolset.wrapped
    return toolset.id


def toolset_contents(toolset: AbstractToolset[Any]) -> JSON:
    """What can be read of a toolset where it is registered, without connecting to a
    server or calling the user's code: a function toolset's tools (name, parameters'
    schema, whether they ask for approval first), a wrapper's prefix or renames and what
    it wraps, a combination's parts, an MCP server's address (its tools are listed by the
    server, at a connection), another toolset's class. A filter's or a preparation's
    function is code, not seen, as a tool's is."""
    kind = f"{type(toolset).__module__}.{type(toolset).__qualname__}"
    if isinstance(toolset, FunctionToolset):
        return {"kind": kind, "tools": {
            name: {"parameters": tool.tool_def.parameters_json_schema,
                   "prior approval": tool.requires_approval}
            for name, tool in toolset.tools.items()}}
    if isinstance(toolset, WrapperToolset):
        described: dict[str, JSON] = {"kind": kind,
                                      "wraps": toolset_contents(toolset.wrapped)}
        if isinstance(toolset, PrefixedToolset):
            described["prefix"] = toolset.prefix
        if isinstance(toolset, RenamedToolset):
            described["renames"] = dict(toolset.name_map)
        return described
    if isinstance(toolset, CombinedToolset):
        return {"kind": kind, "toolsets": [toolset_contents(t) for t in toolset.toolsets]}
    tool_defs = getattr(toolset, "tool_defs", None)  # an external toolset's, declared
    if isinstance(tool_defs, list):
        return {"kind": kind, "tools": {
            t.name: {"parameters": t.parameters_json_schema, "kind": t.kind}
            for t in tool_defs}}
    transport = getattr(getattr(toolset, "client", None), "transport", None)
    if transport is not None:  # an MCP server: where it is, not what it lists
        url = getattr(transport, "url", None)
        command = getattr(transport, "command", None)
        server = url if isinstance(url, str) else " ".join(
            [str(command), *map(str, getattr(transport, "args", None) or [])]
        ) if command is not None else type(transport).__name__
        return {"kind": kind, "server": server}
    return {"kind": kind}


def model_needs(agent: Agent[Any, Any]) -> dict[str, JSON]:
    """What a run of ``agent`` needs of its model: the same provider and model name. Its
    journal holds the answers that model gave; resumed on another, the rest of the run
    would be another model's continuation of them."""
    model = agent.model
    if model is None:
        named = "not set"
    elif isinstance(model, str):
        named = model
    else:
        named = f"{model.system}:{model.model_name}"
    return {"model": named}


def output_needs(agent: Agent[Any, Any]) -> dict[str, JSON]:
    """What a run of ``agent`` needs of its output: how a final answer is read (the
    output mode, the output tools' and the output object's schemas, whether text or no
    output may answer) and what becomes of the calls it comes with (the end strategy),
    as a fingerprint with the mode shown. Its journal holds answers given for the output
    as it was, which the framework takes again on a replay: resumed under another, an
    answer it refused would be taken, or one it took refused and asked for again, and
    calls it skipped run (or calls it ran skipped). The output validators and output
    functions are code, not seen, like a tool's (a deploy is for changing them). Whether
    the run may end with deferred calls is needed only where it could (a run that could
    not never suspended on them)."""
    schema = getattr(agent, "_output_schema", None)  # the framework's own, built once
    if schema is None:  # the framework's public account of the output, should it be gone
        return {"output": {"schema": fingerprint(agent.output_json_schema()),
                           "mode": "unknown"}}
    toolset = schema.toolset
    tools = getattr(toolset, "_tool_defs", None) or []
    made = schema.object_def
    described = {
        "mode": schema.mode,
        "text": schema.allows_text,
        "none": schema.allows_none,
        "image": schema.allows_image,
        "tools": {t.name: {"parameters": t.parameters_json_schema, "strict": t.strict,
                           "key": t.outer_typed_dict_key} for t in tools},
        "object": None if made is None else {
            "schema": made.json_schema, "name": made.name, "strict": made.strict},
        "end": agent.end_strategy,
    }
    return {"output": {"schema": fingerprint(described), "mode": schema.mode},
            "output ends with deferred calls": "allowed" if schema.allows_deferred_tools
            else None}


def register_agent(
    registry: Registry,
    name: str,
    agent: Agent[Any, Any],
    *,
    deps: Any = None,
    usage_limits: UsageLimits | None = None,
    queue: str = "brain",
    approval_timeout: float = DAY,
) -> HostedAgent:
    """Register ``agent`` as the task kind a submission naming ``name`` starts (and the
    approval gate's task kind, which its deferred calls wait in)."""
    if not NAME.fullmatch(name):
        raise ValueError(f"agent name {name!r}: 1-64 of a-z, 0-9, '_' and '-'")
    if KernelDurability.from_agent(agent) is None:
        raise ValueError(f"agent {name!r}: add capabilities=[KernelDurability()] to it")
    check_tools(agent)
    if not approval_timeout > 0:
        raise ValueError("approval_timeout: a positive number of seconds")
    hosted = HostedAgent(name, agent, deps, usage_limits, approval_timeout,
                         unsafe_tools(agent), answer_ends(agent))
    for kind in (CONVERSATION, HISTORY, PROGRESS, USAGE):
        registry.document(kind)
    approvals.register_approvals(registry)

    needed = tool_needs(agent)
    turn_needs = {**model_needs(agent), **output_needs(agent), **toolset_needs(agent),
                  **needed}

    @registry.task(turn_kind({"agent": name}), queue=queue)
    class HostedTurn:
        initial = "run"
        decisions = DECISIONS
        no_restart = NO_RESTART

        def needs(self, input: JSON, checkpoint: JSON) -> dict[str, JSON]:
            """Its agent's model, output, toolsets and function tools as they are
            here (:func:`model_needs`, :func:`output_needs`, :func:`toolset_needs`,
            :func:`tool_needs`)."""
            return turn_needs

        def run(self, run: Run) -> Transition:
            return run_turn(run, hosted)

        def on_end(self, run: Run, finish: Finish) -> None:
            if finish.outcome == Outcome.CANCELLED:
                try:
                    leave_cancelled(run)
                except Exception:  # its submissions are released all the same
                    log.warning("cancelled %s leaves no account of its calls", run.task_id,
                                exc_info=True)
            release_unanswered(run, finish, "run")

    @registry.task(hands_kind(name), queue="hands")
    class HandsCall:
        initial = "run"
        decisions = DECISIONS
        no_restart = NO_RESTART

        def needs(self, input: JSON, checkpoint: JSON) -> dict[str, JSON]:
            """The tool its call was made for, as it is here."""
            tool = f"tool {input['call']['name']}"
            return {tool: needed.get(tool)}

        def run(self, run: Run) -> Transition:
            return run_hands(run, hosted)

    return hosted


def settle_uncertain(run: Run, journal: Journal) -> Transition | None:
    """Apply the operator's decision on each call cut mid-way; the wait for one that has
    none yet, or None when every call is settled."""
    for key, intent in journal.intents.items():  # by the call's unit_of
        signal = resolution(key, intent["attempt"])
        decided = run.signal(signal)
        if decided is None:
            return run.wait_for(signal, then="run", checkpoint={"uncertain": key})
        by = {"decision": decided.get("decision"), "by": decided.get("by"),
              "reason": decided.get("reason")}
        if decided.get("decision") == RUN_AGAIN.value:
            journal.forget_intent(key)
            continue
        if decided.get("decision") == HAPPENED.value:
            said = (decided.get("receipt") or {}).get("result")
            payload: JSON = {"kind": "tool_return", "result": said or
                             "An operator recorded that this call took effect."}
        else:
            payload = {"kind": "tool_failed", "message": "The call was interrupted; an "
                       "operator recorded that it did not take effect."}
        journal.record_result(intent.get("call_id", key), intent["name"], payload,
                              Replay.UNSAFE, None, occurrence=intent.get("occurrence", 1),
                              resolved=by)
    return None


def prompt(run: Run, submissions: list[str] | None = None) -> str:
    """The turn's prompt: its submissions' texts (``submissions``: its ids, for a task
    other than the turn)."""
    ids = run.input.get("submissions", []) if submissions is None else submissions
    texts = [run.submission(s).input.get("text", "") for s in ids]
    return "\n\n".join(t for t in texts if t)


REPLAYED = ("segment", "decisions", "resume", "usage")
"""What of a turn's checkpoint its run is started with (a hands task gets a copy)."""


@dataclass
class Start:
    """What one segment's ``agent.run`` is started with: the same in the turn and in each
    of its hands tasks, so they replay the same run."""

    segment: int
    decisions: dict[str, JSON]
    text: str | None
    history: list[ModelMessage] | None
    deferred: DeferredToolResults | None
    used: RunUsage | None
    stored: list[JSON] | None = None
    """The conversation's history document as the turn found it (its first segment's)."""

    @classmethod
    def of(cls, run: Run, state: JSON) -> Start:
        """``state``: the turn's checkpoint (a hands task's copy of it, with the turn's
        submissions: not in its input, where they would name it as the turn)."""
        segment = state.get("segment", 0)
        decisions: dict[str, JSON] = state.get("decisions") or {}
        if segment == 0:
            history_json = run.document(HISTORY, run.input["conversation_id"]).get("messages")
            text: str | None = prompt(run, state.get("submissions"))
            deferred = None
        else:  # the run goes on from where its last segment stopped, with the decisions
            history_json, text, deferred = state["resume"], None, deferred_results(decisions)
        history = ModelMessagesTypeAdapter.validate_python(history_json) if history_json \
            else None
        used = RunUsage(**state["usage"]) if state.get("usage") else None
        stored = history_json if segment == 0 else None
        return cls(segment, decisions, text, history, deferred, used, stored)

    def serve(self, hosted: HostedAgent, units: Units) -> Any:
        """Run the agent in ``units`` on this thread's bridge: its result, or what it raised."""

        async def main() -> Any:
            return await hosted.agent.run(self.text, message_history=self.history,
                                          deps=hosted.deps, usage_limits=hosted.usage_limits,
                                          usage=self.used, deferred_tool_results=self.deferred)

        context = contextvars.copy_context()
        context.run(enter, units)
        return units.bridge.serve(main, context)


def run_turn(run: Run, hosted: HostedAgent) -> Transition:
    journal = Journal.read(run)
    waiting = settle_uncertain(run, journal)
    if waiting is not None:
        return waiting
    if run.checkpoint.get("suspended"):
        waiting = take_decisions(run)
        if waiting is not None:
            return waiting
    checkpoint = run.checkpoint
    start = Start.of(run, checkpoint)
    segment, decisions = start.segment, start.decisions
    conversation = run.input["conversation_id"]
    units = Units(Bridge(), journal, segment=segment, task_id=run.task_id, started_at=None,
                  decisions=decisions, stream=Preview(run), unsafe_tools=hosted.unsafe_tools,
                  answer_ends=hosted.answer_ends,
                  handed=answer_from_hands(run, journal, segment))
    try:
        result = start.serve(hosted, units)
    except Exception as exc:
        if units.bridge.failure is not None:
            raise  # the kernel's own (a lost lease, a lost connection): the worker's to handle
        if units.parked:  # it may follow from a stand-in result: the real one decides
            return to_hands(run, hosted, units)
        for stage in units.take_staged():  # what the run did before it failed
            stage()
        reason = f"{type(exc).__name__}: {exc}"
        release(run, SubmissionStatus.UNANSWERED, reason)
        return run.fail(reason)
    except BaseException as exc:
        if units.bridge.failure is None and units.parked and suspended(exc):
            return to_hands(run, hosted, units)
        raise
    if units.parked:  # the run ended on stand-in results: it is decided on the real ones
        return to_hands(run, hosted, units)
    for stage in units.take_staged():  # they join the commit that ends the segment
        stage()
    # As the framework's JSON would parse back, built once: the new messages are the tail.
    messages = ModelMessagesTypeAdapter.dump_python(result.all_messages(), mode="json")
    new = len(result.new_messages())
    record_framework_returns(run, journal, messages[len(messages) - new:], decisions)
    usage = result.usage
    if isinstance(result.output, DeferredToolRequests):
        return ask(run, hosted, result.output, messages, segment, usage)
    record_history(run, conversation, start.stored, messages)
    release(run, SubmissionStatus.ANSWERED, None, answer_entry=journal.last_response_entry)
    return run.succeed({
        "output": to_jsonable_python(result.output),
        "answer_entry": journal.last_response_entry,
        "usage": {"requests": usage.requests, "input_tokens": usage.input_tokens,
                  "output_tokens": usage.output_tokens},
    })


def to_hands(run: Run, hosted: HostedAgent, units: Units) -> Transition:
    """The calls the run reached for hands tools: a task each on the hands queue and the
    wait for them, in one commit with what the run staged (the response that made the
    calls, when it was held, and the results of its other calls). The turn holds no
    worker until they end; then it runs again and reads their results back."""
    for stage in units.take_staged():
        stage()
    checkpoint = run.checkpoint
    replay = {key: checkpoint[key] for key in REPLAYED if key in checkpoint}
    base = {"conversation_id": run.input["conversation_id"], "turn": run.task_id,
            "turn_created_seq": run.task.created_seq,
            "replay": {**replay, "submissions": run.input.get("submissions", [])}}
    handed: dict[str, JSON] = dict(checkpoint.get("hands") or {})
    spawned = []
    for key, call in units.parked.items():  # by the call's unit_of
        task = run.spawn(hands_kind(hosted.name), {**base, "call": {"id": key, **call}})
        handed[key] = {"task": task, "name": call["name"], "replay": call["replay"],
                       "segment": units.segment, "call_id": call["call_id"],
                       "occurrence": call["occurrence"]}
        spawned.append(task)
    return run.wait_all(spawned, then="run", checkpoint={"hands": handed})


def answer_from_hands(run: Run, journal: Journal, segment: int) -> dict[str, JSON]:
    """The calls of this segment whose hands task ended without their result: what the
    framework is given for each instead of running it again. A call the tool deferred
    (it asked for approval, or is to be answered from outside) is deferred here too; any
    other (the task was cancelled, failed, passed its restart limit) is answered as a
    failure saying why, with what the call had saved with ``save_partial``: a result
    entry that joins the turn's next commit."""
    handed: dict[str, JSON] = run.checkpoint.get("hands") or {}
    open_ = {call["task"]: call_id for call_id, call in handed.items()
             if call_id not in journal.results and call.get("segment", 0) == segment}
    answers: dict[str, JSON] = {}
    for task_id, outcome in run.outcomes(list(open_)).items() if open_ else ():
        if outcome is None:
            continue
        key = open_[task_id]
        call = handed[key]
        call_id = call.get("call_id", key)
        deferred = (outcome.get("result") or {}).get("deferred") \
            if isinstance(outcome.get("result"), dict) else None
        if outcome.get("kind") == "succeeded" and deferred is not None:
            answers[key] = deferred
            continue
        error = outcome.get("error")
        said = f"The call's task on the hands queue {outcome.get('kind')}" + \
            (f": {error}" if error else "")
        partial = (run.document(PROGRESS, run.task_id).get("partials") or {}).get(call_id)
        if partial is not None:
            said += f". What it had done: {json.dumps(partial)} (it may have done more)."
        payload: JSON = {"kind": "tool_failed", "message": said}
        journal.record_result(call_id, call["name"], payload,
                              Replay(call.get("replay", Replay.UNSAFE)), None, commit=False,
                              occurrence=call.get("occurrence", 1), hands=task_id,
                              partial=partial)
        answers[key] = payload
    return answers


def run_hands(run: Run, hosted: HostedAgent) -> Transition:
    """One call of a turn, on the hands queue: the turn's run replayed from its journal
    (nothing asked of the model, no other call run) up to that call, which runs through
    the framework's tool machinery and records its result under the turn."""
    call_id = run.input["call"]["id"]
    journal = Journal.read(run, run.input["turn"], run.input.get("turn_created_seq"))
    if call_id in journal.results:  # its intent, if any, was settled by this result
        return run.succeed({"call_id": call_id})
    waiting = settle_uncertain(run, journal)
    if waiting is not None:
        return waiting
    start = Start.of(run, run.input.get("replay") or {})
    units = Units(Bridge(), journal, segment=start.segment, task_id=run.input["turn"],
                  started_at=None, decisions=start.decisions,
                  unsafe_tools=hosted.unsafe_tools, only_call=call_id)
    error: Exception | None = None
    try:
        start.serve(hosted, units)
    except Exception as exc:
        if units.bridge.failure is not None:
            raise
        # The run failed after the call (or before it, or the tool raised: answered
        # below); the turn's own replay meets the same failure and answers for it.
        error = exc
    except BaseException as exc:
        if units.bridge.failure is not None or not suspended(exc):
            raise
    for stage in units.take_staged():  # the call's result joins the task's end
        stage()
    if call_id in journal.results:
        return run.succeed({"call_id": call_id})
    if units.deferred is not None:
        return run.succeed({"call_id": call_id, "deferred": units.deferred})
    if error is not None:  # what the model and the operator are told: the tool's error
        return run.fail(f"{type(error).__name__}: {error}")
    return run.fail(f"the replay of turn {run.input['turn']} did not reach call {call_id}")


def parameters_of(agent: Agent[Any, Any], name: str) -> JSON:
    """The JSON schema of a function tool's parameters (what edited arguments must fit)."""
    for toolset in agent.toolsets:
        if isinstance(toolset, FunctionToolset) and name in toolset.tools:
            return toolset.tools[name].function_schema.json_schema
    return {}


def external(call_id: str) -> str:
    """The signal a call deferred to the outside (``CallDeferred``) waits on: a
    resolution of the turn (``happened`` with the result, ``not_done``, ``run_again``)."""
    return f"resolution:{call_id}:external"


def ask(run: Run, hosted: HostedAgent, requests: DeferredToolRequests, messages: list[JSON],
        segment: int, usage: RunUsage) -> Transition:
    """The run ended with deferred calls: one approval task per call that needs approval,
    and the wait for them; then (:func:`take_decisions`) a wait for each call deferred to
    the outside. One commit, with the messages the next segment goes on from."""
    conversation = run.input["conversation_id"]
    asked: dict[str, str] = {}
    for call in requests.approvals:
        arguments = call.args_as_dict()
        said = (requests.metadata.get(call.tool_call_id) or {}).get("reason")
        record = approvals.requested(
            call.tool_name, arguments, timeout=hosted.approval_timeout,
            why=str(said) if said else "the tool asks for approval before it runs",
            parameters=parameters_of(hosted.agent, call.tool_name))
        task = run.spawn(approvals.TASK_KIND, {
            "conversation_id": conversation, "approval": record,
            "call": {"id": call.tool_call_id, "name": call.tool_name, "arguments": arguments},
        })
        asked[task] = call.tool_call_id
    # The decisions of the segment that ends here were its own: the next segment is given
    # only those on the calls this one deferred (the framework refuses results for calls
    # its last response did not make).
    kept = {"suspended": True, "asked": asked, "resume": messages, "segment": segment,
            "usage": to_jsonable_python(usage), "decisions": None,
            "external": [c.tool_call_id for c in requests.calls]}
    if asked:
        return run.wait_all(list(asked), then="run", checkpoint=kept)
    return run.next("run", kept)


def take_decisions(run: Run) -> Transition | None:
    """The decisions on a suspended segment's calls: the approval tasks' (ended by now),
    then the result of each call deferred to the outside, waiting (holding no worker) for
    the first that has none. With all in, they are committed with the start of the next
    segment (a crash from there on replays that segment), and None is returned."""
    checkpoint = run.checkpoint
    asked: dict[str, str] = checkpoint.get("asked") or {}
    decisions = dict(checkpoint.get("decisions") or {})
    for task_id, outcome in run.outcomes(list(asked)).items() if asked else ():
        outcome = outcome or {}
        decided = outcome.get("result") if outcome.get("kind") == "succeeded" else None
        decisions[asked[task_id]] = decided or {
            "decision": approvals.DENY, "by": "kernel",
            "reason": f"its approval task {outcome.get('kind')}: {outcome.get('error')}"}
    for call_id in checkpoint.get("external") or []:
        if call_id in decisions:
            continue
        said = run.signal(external(call_id))
        if said is None:
            return run.wait_for(external(call_id), then="run",
                                checkpoint={"asked": None, "decisions": decisions})
        decisions[call_id] = {**said, "external": True}
    run.commit(checkpoint={"suspended": None, "asked": None, "external": None,
                           "decisions": decisions,
                           "segment": checkpoint.get("segment", 0) + 1})
    return None


def deferred_results(decisions: dict[str, JSON]) -> DeferredToolResults:
    """The operators' decisions as the framework takes them: a denial's reason is what
    the model is told in place of the call's return; an outside call's result is its
    return (``happened``), a failure (``not_done``) or a request to call again."""
    results = DeferredToolResults()
    for call_id, decided in decisions.items():
        reason = decided.get("reason")
        if decided.get("external"):
            if decided.get("decision") == HAPPENED.value:
                results.calls[call_id] = (decided.get("receipt") or {}).get("result") or \
                    "An operator recorded that this call took effect."
            elif decided.get("decision") == RUN_AGAIN.value:
                results.calls[call_id] = ModelRetry(
                    f"The call did not take effect; make it again ({reason}).")
            else:
                results.calls[call_id] = ToolFailed(
                    f"The call did not take effect: {reason}")
        elif decided.get("decision") == approvals.APPROVE:
            results.approvals[call_id] = ToolApproved(override_args=decided.get("arguments"))
        else:
            results.approvals[call_id] = ToolDenied(f"The tool call was denied: {reason}")
    return results


def record_framework_returns(run: Run, journal: Journal, new_messages: list[JSON],
                             decisions: dict[str, JSON]) -> None:
    """What the framework answered a call with itself (an output tool's "final result",
    a validation retry, a denial): a result entry, so the transcript's card is not left
    open."""
    conversation = run.input["conversation_id"]
    for message in new_messages:
        for part in message.get("parts") or []:
            call_id = part.get("tool_call_id")
            if not call_id or call_id in journal.results:
                continue
            if part.get("part_kind") == "tool-return":
                failed = part.get("outcome") not in (None, "success")
                shown = {"error" if failed else "result": to_jsonable_python(part.get("content"))}
            elif part.get("part_kind") == "retry-prompt":
                shown = {"error": to_jsonable_python(part.get("content"))}
            else:
                continue
            decided = decisions.get(call_id)
            if decided is not None and decided.get("external"):
                shown["resolved"] = {k: decided.get(k) for k in ("decision", "by", "reason")}
            elif decided is not None:
                shown["approval"] = decided
                shown["denied"] = decided.get("decision") != approvals.APPROVE
            run.append(conversation, TOOL_RESULT, {
                "call_id": call_id, "name": part.get("tool_name"), **shown,
                "turn": run.task_id, "by": "framework",
            })


def record_history(run: Run, conversation: str, before: list[JSON] | None,
                   messages: list[JSON]) -> None:
    """The conversation's history document after a turn: ``messages`` (the run's, as
    JSON). When they begin with what the document held (``before``, or read now for a
    turn past its first segment), only the new ones are appended, so a conversation's
    history costs what it adds, not itself again at every turn (a baseline of the whole
    is written once the appends outweigh the last one: ``kernel.documents``); otherwise
    (the framework rewrote an earlier message) the whole is set."""
    if before is None:
        before = run.document(HISTORY, conversation).get("messages")
    if before and len(messages) >= len(before) and messages[:len(before)] == before:
        added = messages[len(before):]
        if added:
            run.update(HISTORY, conversation, *(
                {"op": "append", "path": ["messages"], "value": message} for message in added))
    else:
        run.set(HISTORY, conversation, ["messages"], messages)


def _call_ids(payload: JSON) -> set[str]:
    """The call ids of a recorded response (the framework's JSON of it)."""
    return {part["tool_call_id"] for part in payload.get("parts") or []
            if part.get("part_kind") == "tool-call" and part.get("tool_call_id")}


def leave_cancelled(run: Run) -> None:
    """A cancelled turn leaves the conversation what it did, as native turns do: each call
    of its committed responses that has no committed result is answered as cancelled
    (who, why, and the partial result the call had committed with :func:`save_partial`),
    in the transcript and in the messages the next turn continues from, so its model
    knows what did and did not happen rather than that the turn vanished."""
    journal = Journal.read(run)
    conversation = run.input["conversation_id"]
    cancel = run.task.cancel or {}
    partials = run.document(PROGRESS, run.task_id).get("partials") or {}
    checkpoint = run.checkpoint
    segment = checkpoint.get("segment", 0)
    if checkpoint.get("suspended"):
        # The segment ended (its calls wait for decisions): what it said, its own
        # responses with it, is its resume, up to its deferred calls.
        messages: list[ModelMessage] = ModelMessagesTypeAdapter.validate_python(
            checkpoint["resume"])
    else:
        if segment == 0:
            before = run.document(HISTORY, conversation).get("messages")
            messages = ModelMessagesTypeAdapter.validate_python(before) if before else []
            if not before and journal.first_request is not None:  # with the system prompt
                messages.extend(ModelMessagesTypeAdapter.validate_python(
                    [journal.first_request]))
            else:
                messages.append(ModelRequest(parts=[UserPromptPart(prompt(run))]))
        else:  # what the segments before this one said, up to their deferred calls
            messages = ModelMessagesTypeAdapter.validate_python(checkpoint["resume"])
        ours = sorted((int(key.rsplit(":", 1)[1]), payload)
                      for key, payload in journal.responses.items()
                      if key.startswith(f"{segment}:model:"))
        if segment == 0 and not before and not ours:
            # Cancelled before the model answered a conversation's first request: nothing
            # took effect, and a history of the prompt alone would lack the system prompt,
            # which the framework sends only to a conversation with no history.
            return
        messages.extend(ModelMessagesTypeAdapter.validate_python([p for _, p in ours]))

    cards: list[JSON] = []  # written once everything is built
    # The decisions the segment under way was started with: the framework answered a
    # denied call (and one deferred outside) with them, not by running it.
    decisions: dict[str, JSON] = {} if checkpoint.get("suspended") else \
        checkpoint.get("decisions") or {}
    given = deferred_results(decisions)

    def decided(call: ToolCallPart) -> JSON:
        """What the framework was given for ``call`` instead of running it, or None."""
        denied = given.approvals.get(call.tool_call_id)
        if isinstance(denied, ToolDenied):
            return {"error": denied.message}
        if call.tool_call_id in given.calls:
            value = given.calls[call.tool_call_id]
            return {"error": str(value)} if isinstance(value, Exception) else {"result": value}
        return None

    def answer(call: ToolCallPart, occurrence: int) -> ToolReturnPart:
        recorded = journal.results.get(unit_of(call.tool_call_id, occurrence))
        framework = decided(call) if recorded is None else None
        if recorded is not None:
            content = shown_result(recorded)
        elif framework is not None:
            content = framework
            decision = decisions[call.tool_call_id]
            shown = {"resolved": {k: decision.get(k) for k in ("decision", "by", "reason")}} \
                if decision.get("external") else {"approval": decision, "denied": True}
            cards.append({"call_id": call.tool_call_id, "name": call.tool_name, **framework,
                          **shown, "turn": run.task_id, "by": "framework"})
        else:
            content = {"cancelled": True,
                       "reason": f"cancelled by {cancel.get('by')}: {cancel.get('reason')}",
                       "partial": partials.get(call.tool_call_id), "note": CANCELLED_NOTE}
            cards.append({
                "call_id": call.tool_call_id, "name": call.tool_name, "cancelled": True,
                "by": cancel.get("by"), "reason": cancel.get("reason"),
                "partial": partials.get(call.tool_call_id), "turn": run.task_id,
            })
        return ToolReturnPart(call.tool_name, content, tool_call_id=call.tool_call_id)

    # A call id some responses share (models that number their calls per response): the
    # last responses to use it are this turn's, the n-th of them its n-th call of that id.
    ours_using = Counter(call_id for payload in journal.responses.values()
                         for call_id in _call_ids(payload))
    all_using = Counter(call_id for m in messages if isinstance(m, ModelResponse)
                        for call_id in {p.tool_call_id for p in m.parts
                                        if isinstance(p, ToolCallPart)})
    using: Counter[str] = Counter()
    left: list[ModelMessage] = []
    for index, message in enumerate(messages):
        left.append(message)
        if not isinstance(message, ModelResponse):
            continue
        using.update({p.tool_call_id for p in message.parts if isinstance(p, ToolCallPart)})
        after = messages[index + 1] if index + 1 < len(messages) else None
        answered = {getattr(p, "tool_call_id", None) for p in after.parts} \
            if isinstance(after, ModelRequest) else set()
        missing = [answer(p, using[p.tool_call_id] - all_using[p.tool_call_id]
                          + ours_using[p.tool_call_id])
                   for p in message.parts
                   if isinstance(p, ToolCallPart) and p.tool_call_id not in answered]
        if not missing:
            continue
        if isinstance(after, ModelRequest):
            messages[index + 1] = ModelRequest(parts=[*missing, *after.parts])
        else:
            left.append(ModelRequest(parts=missing))
    dumped = ModelMessagesTypeAdapter.dump_python(left, mode="json")
    for card in cards:
        run.append(conversation, TOOL_RESULT, card)
    run.set(HISTORY, conversation, ["messages"], dumped)
