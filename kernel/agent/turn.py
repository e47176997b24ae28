"""The agent loop as durable tasks: a turn asks the model, runs the tools it calls,
and asks again, until the model answers.

``agent-turn``: ``prepare`` fixes model and options; ``request`` records that a
request is under way, then calls the model (a crash there is found on re-entry and
recorded as an unfinished attempt; the request is sent again); transient errors
sleep with a backoff kept in the checkpoint; a background response saves its
handle and ``poll`` asks for it (after a restart too: the same handle, no second
request); a response is committed together with its tool tasks and the wait for
them; ``finish`` answers the submissions and hands the conversation to the next
queued one.

A request is built from the conversation's context (the latest summary and what came
after it, :meth:`kernel.session.Kernel.context`); one that would pass its model's
threshold, or that the model answers is too long, first waits for an
``agent-compaction`` task (:mod:`kernel.agent.compaction`): the one of the conversation
under way (an operator's), or one of its own; then asks (again, once).

``agent-tool``: ``call`` validates the arguments and commits the intent (fixed
arguments, replay policy, operation id) before running; ``execute`` is reached
only by recovery and runs again only if both the saved and the current policy
say ``safe`` - otherwise the model gets an ``interrupted`` result. A call its tool's
gate holds sleeps in ``approval`` first (:mod:`kernel.agent.approval`); approved, it
goes on as any call does, with the approved arguments. A tool task that is cancelled,
or that the kernel ends, answers its call as it ends (``on_end``): the mark, and the
partial output committed so far (``Tool.partial``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any

from kernel import tracing
from kernel.environment import fingerprint
from kernel.errors import KernelError, UnstorableValue
from kernel.records import Outcome, SubmissionStatus
from kernel.registry import Registry
from kernel.run import Run
from kernel.tasks import Finish, Transition

from .approval import APPROVE, requested, wait, wait_on
from .approval import decision as decision_on
from .compaction import COMPACTION, Compaction, register_compaction, started, under_way
from .context import INTERRUPTION, RESPONSE, TOOL_RESULT, USER, answers, messages
from .models import (
    ContextOverflowError,
    ModelProvider,
    ModelRequest,
    ModelResponse,
    Pending,
    PermanentModelError,
    ToolCall,
    TransientModelError,
    check_options,
)
from .requests import MAX_ATTEMPTS, USAGE, backoff, record_usage
from .tools import Replay, Tool, Toolbox

JSON = Any
CONVERSATION = "agent-conversation"
PROGRESS = "agent-progress"
MAX_ROUNDS = 12
POLL_SECONDS = 1.0
PROGRESS_EVERY = 0.2  # previews cost no commit: push them often


def turn_kind(input: JSON) -> str:
    """The task kind that answers a submission: a native turn, or the turn of the agent
    it names (``"agent": "support"``: kind ``agent:support``, which a host registers)."""
    agent = input.get("agent") if isinstance(input, dict) else None
    return "agent-turn" if agent is None else f"agent:{agent}"


def register_agent(
    registry: Registry,
    models: Mapping[str, ModelProvider],
    toolbox: Toolbox,
    default_model: str,
    compaction: Compaction | None = None,
) -> None:
    """Add the agent's task kinds and documents to ``registry``. ``compaction``: when a
    conversation's older part is summarized (:mod:`.compaction`); by default only when
    a model answers that the context is too long."""
    compacting = compaction or Compaction()
    register_compaction(registry, models, compacting, default_model, toolbox.schemas)
    registry.document(CONVERSATION)
    registry.document(PROGRESS)
    registry.document(USAGE)
    registry.tool_replay.update({name: str(tool.replay) for name, tool in toolbox.tools.items()})

    def provider(run: Run) -> ModelProvider:
        return models[run.checkpoint["model"]]

    @registry.task("agent-turn", queue="brain")
    class Turn:
        initial = "prepare"
        # A request that kills its worker is counted by the turn's own attempts (it
        # records each interruption); the kernel's limit is the backstop past them.
        max_restarts = MAX_ATTEMPTS

        def needs(self, input: JSON, checkpoint: JSON) -> dict[str, JSON]:
            """Its model, configured here, and its options, accepted here (the tools it
            offers the model are read anew for each request: a tool added or changed
            meanwhile is what the model sees)."""
            model = checkpoint.get("model") or input.get("model") or default_model
            options = checkpoint.get("options") or input.get("options") or {}
            try:
                check_options(options)
                accepted: str | None = f"accepted ({fingerprint(options)})"
            except ValueError:
                accepted = None
            return {f"model {model}": "configured" if model in models else None,
                    "model options": accepted}

        def prepare(self, run: Run) -> Transition:
            model = run.input.get("model") or default_model
            if model not in models:
                return run.next("finish", {"failure": f"unknown model {model!r}"})
            try:  # submissions are checked; a turn made some other way is held to it too
                options = check_options(run.input.get("options") or {})
            except ValueError as exc:
                return run.next("finish", {"failure": str(exc)})
            first = "branch" if run.input.get("from_response") else "request"
            return run.next(first, {"model": model, "options": options, "round": 0})

        def branch(self, run: Run) -> Transition:
            """A turn branched from a committed model response (:mod:`kernel.agent.branches`):
            that response is taken as it was committed, never asked for again; its tool
            calls are made anew (new tool tasks, new operation ids), then the model is
            asked from there."""
            conversation = run.input["conversation_id"]
            entry_id = run.input["from_response"]
            entry = next((e for e in run.entries(conversation) if e.id == entry_id), None)
            if entry is None or entry.kind != RESPONSE:
                return run.next("finish", {"failure": f"no model response {entry_id} in "
                                                      f"conversation {conversation}"})
            answer = ModelResponse(
                entry.payload.get("text", ""),
                tuple(ToolCall.from_json(c) for c in entry.payload.get("tool_calls") or []),
            )
            if not answer.tool_calls:
                return run.next("finish", {"answer_entry": entry_id, "asked_with": []})
            return call_tools(run, answer, entry_id)

        def request(self, run: Run) -> Transition:
            conversation = run.input["conversation_id"]
            checkpoint = run.checkpoint
            if checkpoint.get("in_flight"):
                run.append(
                    conversation,
                    INTERRUPTION,
                    {
                        "turn": run.task_id,
                        "attempt": checkpoint["in_flight"],
                        "reason": "the worker stopped during the model request",
                    },
                )
                if checkpoint.get("attempt", 0) >= MAX_ATTEMPTS:
                    # Its own commit resets the phase's restart count, so the attempts
                    # are the limit: a request that kills its worker must not loop.
                    return run.next(
                        "finish",
                        {
                            "failure": f"the model request was interrupted "
                            f"{checkpoint['attempt']} times",
                            "in_flight": None,
                        },
                    )
            answer_unrecorded_calls(run, conversation)
            if checkpoint["round"] >= run.input.get("max_rounds", MAX_ROUNDS):
                return run.next("finish", {"failure": "too many rounds of tool calls"})
            attempt = checkpoint.get("attempt", 0) + 1
            # Under way; this commit also holds the results answered just above.
            run.commit(checkpoint={"in_flight": attempt, "attempt": attempt, "tools": None})
            # What this request is asked with: read before the entries, so an input steered
            # in between counts as unseen (and is asked about again), never the reverse.
            asked_with = seen_submissions(run, conversation)
            context, tools = messages(run.context(conversation)), toolbox.schemas()
            if checkpoint.get("compacted_round") != checkpoint["round"] and compacting.due(
                checkpoint["model"], context, tools
            ):
                return compact_first(run, "threshold", attempt - 1)
            request = ModelRequest(checkpoint["model"], context, tools, checkpoint["options"])
            stream = Stream(run)
            chosen = provider(run)
            try:
                with model_span(chosen, request) as span:
                    answer = chosen.generate(request, stream.text)
                    record_answer(span, answer)
            except ContextOverflowError as exc:
                if not checkpoint.get("overflow_compacted"):  # compact, then ask once more
                    return compact_first(run, "overflow", attempt - 1)
                return run.next("finish", {
                    "failure": f"the context is too long for the model even after "
                               f"compaction: {exc}",
                    "in_flight": None,
                })
            except TransientModelError as exc:
                if attempt >= MAX_ATTEMPTS:
                    return run.next(
                        "finish", {"failure": f"model kept failing: {exc}", "in_flight": None}
                    )
                return run.sleep(
                    backoff(attempt, exc),
                    then="request",
                    checkpoint={"in_flight": None, "last_error": str(exc)},
                )
            except PermanentModelError as exc:
                return run.next("finish", {"failure": f"model refused: {exc}", "in_flight": None})
            if isinstance(answer, Pending):
                return run.next(
                    "poll",
                    {"handle": answer.handle, "in_flight": None, "polls": 0,
                     "asked_with": asked_with},
                )
            return respond(run, answer, stream, asked_with)

        def poll(self, run: Run) -> Transition:
            """A background response: the saved handle is asked again, never a new request."""
            polls = run.checkpoint.get("polls", 0) + 1
            chosen = provider(run)
            try:
                with model_span(chosen, ModelRequest(run.checkpoint["model"], [], [],
                                                     run.checkpoint["options"]),
                                {"gen_ai.response.id": run.checkpoint["handle"]}) as span:
                    answer = chosen.poll(run.checkpoint["handle"])
                    record_answer(span, answer)
            except TransientModelError as exc:
                errors = run.checkpoint.get("poll_errors", 0) + 1
                if errors >= MAX_ATTEMPTS:
                    return run.next("finish", {"failure": f"polling kept failing: {exc}"})
                return run.sleep(
                    backoff(errors, exc),
                    then="poll",
                    checkpoint={"polls": polls, "poll_errors": errors, "last_error": str(exc)},
                )
            except PermanentModelError as exc:
                return run.next("finish", {"failure": f"model refused: {exc}"})
            if answer is None:
                return run.sleep(POLL_SECONDS, then="poll", checkpoint={"polls": polls})
            return respond(run, answer, None, run.checkpoint.get("asked_with"))

        def compact(self, run: Run) -> Transition:
            """Wait for the compaction of the conversation under way (an operator's: a
            second would summarize the same entries again), then ask again, and compact
            again only if the request is still due; or start one, a task of its own, in a
            commit that expects the record of compactions started as read: one started
            meanwhile refuses it, and this phase, run again, waits for that one."""
            conversation = run.input["conversation_id"]
            reason = run.checkpoint["compacting"]
            current, version = under_way(run, conversation)
            if current is not None:
                return run.wait_all([current], then="request", checkpoint={"compacting": None})
            child = run.spawn(COMPACTION, {
                "conversation_id": conversation,
                "model": run.checkpoint["model"],
                "reason": reason,
                "by": run.task_id,
            })
            started(run.draft, conversation, child, reason, run.task_id,
                    expected_version=version)
            once = ({"compacted_round": run.checkpoint["round"]} if reason == "threshold"
                    else {"overflow_compacted": True})
            return run.wait_all([child], then="request",
                                checkpoint={"compacting": None, **once})

        def finish(self, run: Run) -> Transition:
            """Bookkeeping only, so re-running it on a document conflict is harmless."""
            return finish_turn(run)

        def on_end(self, run: Run, finish: Finish) -> None:
            """Cancelled, past the restart limit, a phase that raised or faulted: the turn
            ends without answering, and releases its conversation in the same commit."""
            release_unanswered(run, finish, "turn")

    def compact_first(run: Run, reason: str, attempt: int) -> Transition:
        """Summarize the older part of the conversation first (phase ``compact``), then
        ask again. A phase of its own: the request's intent is committed, so a conflict
        in this commit would run ``request`` again as if its worker had stopped."""
        return run.next("compact", {"in_flight": None, "attempt": attempt,
                                    "compacting": reason})

    def respond(
        run: Run, answer: ModelResponse, stream: Stream | None, asked_with: list[str] | None
    ) -> Transition:
        conversation = run.input["conversation_id"]
        checkpoint = run.checkpoint
        entry = run.append(
            conversation,
            RESPONSE,
            {
                **answer.to_json(),
                "turn": run.task_id,
                "attempt": checkpoint.get("attempt", 1),
            },
        )
        record_usage(run, conversation, answer.usage, checkpoint["model"])
        if stream is not None:
            stream.fold(answer.text)
        if not answer.tool_calls:
            return run.next(
                "finish",
                {"answer_entry": entry, "in_flight": None, "handle": None,
                 "asked_with": asked_with},
            )
        return call_tools(run, answer, entry)

    def call_tools(run: Run, answer: ModelResponse, response: str) -> Transition:
        """A tool task for each call of ``answer`` (committed as entry ``response``), and
        the wait for them all. Each task's result names the response: a call id alone may
        name calls of several responses."""
        conversation = run.input["conversation_id"]
        checkpoint = run.checkpoint
        tools = {
            run.spawn("agent-tool", {"conversation_id": conversation, "call": call.to_json(),
                                     "response": response}):
            [call.id, call.name, response]
            for call in answer.tool_calls
        }
        return run.wait_all(
            list(tools),
            then="request",
            checkpoint={
                "round": checkpoint["round"] + 1,
                "overflow_compacted": False,
                "in_flight": None,
                "handle": None,
                "attempt": 0,
                "tools": tools,
            },
        )

    def answer_unrecorded_calls(run: Run, conversation: str) -> None:
        """A tool task that ended without recording its result (it hit the restart limit,
        or was cancelled) still answers its call, with the reason its task recorded:
        the model is told why, not just that the result is missing."""
        tools: dict[str, list[str]] = run.checkpoint.get("tools") or {}
        if not tools:
            return
        context = run.context(conversation)
        answered = answers(context)
        named = {made[2] for made in tools.values() if len(made) > 2}
        responses = [e for e in context if e.kind == RESPONSE and (not named or e.id in named)]
        # The round's calls not answered yet, by call id (tasks that name no response
        # answer the latest one). A response a summary covers has every call answered.
        unanswered: dict[str, list[int]] = {}
        for place, call in enumerate(responses[-1].payload.get("tool_calls") or []
                                     if responses else []):
            if (responses[-1].id, place) not in answered:
                unanswered.setdefault(str(call.get("id")), []).append(place)
        for task_id, outcome in run.outcomes(list(tools)).items():
            call_id, name = tools[task_id][:2]
            if unanswered.get(call_id) and outcome is not None:
                unanswered[call_id].pop(0)
                run.append(conversation, TOOL_RESULT, {
                    "call_id": call_id, "name": name, "response": responses[-1].id,
                    "error": f"the tool task {outcome.get('kind')}: {outcome.get('error')}",
                })

    @registry.task("agent-tool", queue="hands")
    class ToolTask:
        initial = "call"
        no_restart_ended = (
            "its call is answered in the conversation, and the model has that answer: "
            "started again, it would run (or ask) anew and answer the same call twice")

        def needs(self, input: JSON, checkpoint: JSON) -> dict[str, JSON]:
            """Its tool as the call was made for: its parameter schema and replay policy."""
            name = input["call"]["name"]
            tool = toolbox.get(name)
            return {f"tool {name}": None if tool is None else {
                "parameters": fingerprint(tool.parameters), "replay": str(tool.replay)}}

        def call(self, run: Run) -> Transition:
            call = run.input["call"]
            tool = toolbox.get(call["name"])
            if tool is None:
                return tool_result(run, error=f"unknown tool {call['name']!r}")
            problem = tool.check(call["arguments"])
            if problem is not None:
                return tool_result(run, error=f"invalid arguments: {problem}")
            why = tool.gate.needed(call["arguments"]) if tool.gate is not None else None
            if tool.gate is not None and why is not None:
                # Committed as awaiting approval: the task sleeps (no worker held) until
                # a decision wakes it or the time is up.
                return wait(run, requested(
                    call["name"], call["arguments"], why=why, timeout=tool.gate.timeout,
                    parameters=tool.parameters))  # what edited arguments must fit
            return start_tool(run, tool, call["arguments"], None)

        def approval(self, run: Run) -> Transition:
            """Woken by a decision, or by the timeout: nothing of the call has run yet."""
            asked = run.checkpoint["approval"]
            decision = decision_on(run)
            if decision is None:  # woken early without a decision: wait on
                return wait_on(run)
            record = {**decision, "proposed_digest": asked["digest"]}
            record.pop("arguments", None)
            if decision["decision"] != APPROVE:
                return tool_result(
                    run, error=f"the call was denied: {decision['reason']}", denied=True,
                    approval=record,
                )
            tool = toolbox.get(run.input["call"]["name"])
            if tool is None:
                return tool_result(run, error=f"unknown tool {run.input['call']['name']!r}",
                                   approval=record)
            arguments = decision.get("arguments", asked["arguments"])
            problem = tool.check(arguments)
            if problem is not None:
                return tool_result(run, error=f"invalid approved arguments: {problem}",
                                   approval=record)
            if "arguments" in decision:
                record["edited"] = True
                record["arguments"] = arguments
            return start_tool(run, tool, arguments, record)

        def execute(self, run: Run) -> Transition:
            """Reached only by recovery: the call may already have taken effect."""
            tool = toolbox.get(run.input["call"]["name"])
            saved = run.checkpoint["intent"]["replay"]
            if tool is not None and saved == Replay.SAFE and tool.replay is Replay.SAFE:
                if tool.run is None:  # a task of its own here: the safe call runs as one
                    return start_tool(run, tool, run.checkpoint["intent"]["arguments"],
                                      run.checkpoint.get("approved"))
                return execute_tool(run)
            return tool_result(run, interrupted=True, **partial_output(run))

        def collect(self, run: Run) -> Transition:
            outcome = run.outcomes([run.checkpoint["child"]])[run.checkpoint["child"]] or {}
            if outcome.get("kind") == "succeeded":
                return tool_result(run, result=kept(run, outcome.get("result")))
            if outcome.get("kind") == "cancelled":  # its task, cancelled on its own
                intent = outcome.get("result") or {}
                return tool_result(run, cancelled=True, by=intent.get("by"),
                                   reason=intent.get("reason"), **partial_output(run))
            reported = partial_output(run) if outcome.get("result") is None else {}
            return tool_result(
                run,
                error=f"{outcome.get('kind')}: {outcome.get('error')}",
                result=outcome.get("result"),
                **{k: v for k, v in reported.items() if v is not None},
            )

        def on_end(self, run: Run, finish: Finish) -> None:
            """Cancelled, or ended by the kernel (restart limit, a phase that raised): the
            call is answered in the commit that ends its task, with what it had committed
            so far beside why it stopped, so the model can tell what did and did not happen
            instead of being told only that a result is missing."""
            if finish.outcome == Outcome.CANCELLED:
                intent = run.task.cancel or {}
                mark: JSON = {"cancelled": True, "by": intent.get("by"),
                              "reason": intent.get("reason")}
            else:
                mark = {"interrupted": True, "error": f"the tool task {finish.outcome}: "
                                                      f"{finish.error}"}
            run.append(run.input["conversation_id"], TOOL_RESULT, {
                **answering(run), **mark, **partial_output(run),
            })

    def partial_output(run: Run) -> JSON:
        """The committed partial output of the tool task's call: the tool's own account
        (``Tool.partial``) for a task-kind tool, else what its progress document holds."""
        call = run.input["call"]
        tool = toolbox.get(call["name"])
        # An operator may have approved the call with edited arguments: those are what ran.
        arguments = (run.checkpoint.get("approved") or {}).get("arguments", call["arguments"])
        if tool is not None and tool.partial is not None:
            try:
                return {"partial": tool.partial(run, run.checkpoint.get("child"), arguments)}
            except KernelError:
                raise
            except Exception as exc:  # the call is answered all the same, saying so
                return {"partial": None,
                        "partial_error": f"{type(exc).__name__}: {exc}"}
        return {"partial": run.document(PROGRESS, run.task_id).get("output")}

    def start_tool(run: Run, tool: Tool, arguments: JSON, approved: JSON) -> Transition:
        """Run the call with ``arguments`` (the approved ones, for a gated call): a task of
        its own kind, or the tool's function after its intent is committed."""
        kept = {"approved": approved} if approved is not None else {}
        if tool.task_kind is not None:
            # The tool runs as a task of its own, created in the call's span: its phases
            # are that span's children in the trace.
            with tool_span(run, tool) as span:
                child = run.spawn(tool.task_kind, arguments)
                span.set({"kernel.tool.task.id": child})
            return run.wait_all([child], then="collect", checkpoint={"child": child, **kept})
        run.commit(
            phase="execute",
            checkpoint={
                "intent": {
                    "arguments": arguments,
                    "replay": str(tool.replay),
                    "operation_id": run.operation_id(),
                },
                **kept,
            },
        )
        return execute_tool(run)

    def execute_tool(run: Run) -> Transition:
        call = run.input["call"]
        tool = toolbox.get(call["name"])
        assert tool is not None and tool.run is not None
        with tool_span(run, tool) as span:
            try:
                result = tool.run(run, run.checkpoint["intent"]["arguments"])
            except Exception as exc:  # the model sees the failure and decides what to do
                span.error(type(exc).__name__, str(exc)[:500])
                return tool_result(run, error=f"{type(exc).__name__}: {exc}")
        try:
            return tool_result(run, result=kept(run, result))
        except UnstorableValue as exc:
            # The call took effect: say so. Left to end the task, it would be answered as
            # interrupted ("may or may not have taken effect"), and an unsafe call tried
            # again by the model.
            return tool_result(run, error=f"the call ran, but its result cannot be stored "
                                          f"(so it is not shown): {exc}")

    def kept(run: Run, result: JSON) -> JSON:
        """The result as the transcript keeps it: a large one stored as an artifact
        first, the entry holding its reference and an excerpt."""
        tool = toolbox.get(run.input["call"]["name"])
        if tool is None or tool.artifact_above is None:
            return result
        return run.store_large(result, tool.artifact_above,
                               f"task {run.task.id} tool {tool.name!r} result")


def model_span(
    chosen: ModelProvider, request: ModelRequest, more: JSON = None
) -> AbstractContextManager[tracing.Recorder]:
    """A model request's span, with the GenAI semantic conventions' attributes: the model
    the server is asked for (the provider's, when it names one) and the options."""
    served = getattr(chosen, "model", None) or request.model
    options = request.options or {}
    return tracing.span(f"chat {served}", {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": getattr(chosen, "system", None),
        "gen_ai.request.model": served,
        "gen_ai.request.temperature": options.get("temperature"),
        "gen_ai.request.top_p": options.get("top_p"),
        "gen_ai.request.max_tokens": options.get("max_tokens"),
        "gen_ai.request.seed": options.get("seed"),
        "kernel.model.name": request.model,
        **(more or {}),
    }, client=True)


def record_answer(span: tracing.Recorder, answer: ModelResponse | Pending | None) -> None:
    if isinstance(answer, Pending):
        span.set({"gen_ai.response.id": answer.handle})
    elif isinstance(answer, ModelResponse):
        usage = answer.usage or {}
        span.set({
            "gen_ai.response.model": answer.model,
            "gen_ai.usage.input_tokens": usage.get("input_tokens"),
            "gen_ai.usage.output_tokens": usage.get("output_tokens"),
            "gen_ai.response.finish_reasons": ["tool_calls" if answer.tool_calls else "stop"],
        })


def tool_span(run: Run, tool: Tool) -> AbstractContextManager[tracing.Recorder]:
    """A tool call's span (GenAI semantic conventions: ``execute_tool``)."""
    call = run.input["call"]
    return tracing.span(f"execute_tool {tool.name}", {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": tool.name,
        "gen_ai.tool.call.id": call["id"],
        "gen_ai.tool.type": "function",
        "kernel.tool.replay": str(tool.replay),
    })


class Stream:
    """Streamed text goes to the progress document as previews (deferred commits): shown
    live, written only with the turn's next commit, never used to recover. The final text
    is set with the response's commit."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.buffer: list[str] = []
        self.flushed = time.monotonic()

    def text(self, chunk: str) -> None:
        self.buffer.append(chunk)
        if time.monotonic() - self.flushed >= PROGRESS_EVERY:
            self.run.preview(PROGRESS, self.run.task_id, ["text"], "".join(self.buffer))
            self.flushed = time.monotonic()

    def fold(self, final: str) -> None:
        self.run.set(PROGRESS, self.run.task_id, ["text"], final)


def tool_result(run: Run, **outcome: JSON) -> Transition:
    approved = (run.checkpoint or {}).get("approved")
    if approved is not None and "approval" not in outcome:
        outcome["approval"] = approved  # who let it run, on what (its card shows it)
    payload = {**answering(run), **outcome}
    run.append(run.input["conversation_id"], TOOL_RESULT, payload)
    return run.succeed(payload)  # a failed call is a result too: the model decides what next


def answering(run: Run) -> JSON:
    """What a tool task's result names: its call, and the response that made it (a task
    made before tasks named it names the call only)."""
    call = run.input["call"]
    named = {"call_id": call["id"], "name": call["name"]}
    if run.input.get("response"):
        named["response"] = run.input["response"]
    return named


def seen_submissions(run: Run, conversation: str) -> list[str]:
    """The submissions a model request made now includes: the turn's own and those
    steered into it so far."""
    steering = run.document(CONVERSATION, conversation).get("steering", [])
    return [*run.input.get("submissions", []), *steering]


def finish_turn(run: Run) -> Transition:
    answer = run.checkpoint.get("answer_entry")
    failure = run.checkpoint.get("failure")
    if answer:
        conversation = run.input["conversation_id"]
        asked_with = run.checkpoint.get("asked_with")
        steering = run.document(CONVERSATION, conversation).get("steering", [])
        unseen = [s for s in steering if asked_with is not None and s not in asked_with]
        if unseen:
            # Steered in while the last request was in flight: that answer did not see it,
            # so it answers nothing of it. Ask again, with it (the release below would
            # otherwise conflict with the steer's document version and be written here anyway).
            return run.next(
                "request", {"answer_entry": None, "asked_with": None, "attempt": 0}
            )
    if answer:
        release(run, SubmissionStatus.ANSWERED, None, answer_entry=answer)
    else:
        release(run, SubmissionStatus.UNANSWERED, failure)
    if failure:
        return run.fail(failure)
    return run.succeed({"answer_entry": answer})


def release(
    run: Run,
    status: SubmissionStatus,
    reason: str | None,
    *,
    answer_entry: str | None = None,
) -> None:
    """Settle every submission the turn holds (its own and those steered into it) and
    hand the conversation to the next queued submission, or leave it idle. Written with
    the version it was read at: a submission racing in makes the commit conflict, and it
    is read again. A conversation that another turn holds now is left to that turn."""
    conversation = run.input["conversation_id"]
    state, version = run.versioned_document(CONVERSATION, conversation)
    holds = state.get("active") == run.task_id
    held = [*run.input.get("submissions", []), *(state.get("steering", []) if holds else [])]
    for submission in dict.fromkeys(held):  # one settled meanwhile stays as it is
        if status is SubmissionStatus.ANSWERED:
            run.draft.update_submission(submission, status, answer_entry_id=answer_entry,
                                        unless_settled=True)
        else:
            run.draft.update_submission(submission, status, reason=reason, unless_settled=True)
    if not holds:
        return
    queue = list(state.get("queue", []))
    following = None
    if queue:
        following = start_turn(run, conversation, queue.pop(0))
    run.update(
        CONVERSATION,
        conversation,
        {"op": "set", "path": [], "value": {"active": following, "queue": queue, "steering": []}},
        expected_version=version,
    )


def release_unanswered(run: Run, finish: Finish, what: str) -> None:
    """:func:`release` for a ``what`` (a turn, a hosted agent's run) that the kernel
    ended: its submissions are cancelled or failed, with who and why."""
    if finish.outcome == Outcome.CANCELLED:
        intent = run.task.cancel or {}
        status = SubmissionStatus.CANCELLED
        reason = f"the {what} was cancelled by {intent.get('by')}: {intent.get('reason')}"
    else:
        status = SubmissionStatus.FAILED
        reason = f"the {what} {finish.outcome}: {finish.error}"
    release(run, status, reason)


def start_turn(run: Run, conversation: str, submission_id: str) -> str:
    """Place a queued submission: its user entry and a turn of its own (not owned by this
    one, which is ending)."""
    submission = run.submission(submission_id)
    run.append(conversation, USER, {"text": submission.input["text"], "submission": submission_id})
    run.draft.update_submission(submission_id, SubmissionStatus.PLACED)
    return run.draft.create_task(
        turn_kind(submission.input),
        {
            "conversation_id": conversation,
            "submissions": [submission_id],
            "model": submission.input.get("model"),
            "options": submission.input.get("options", {}),
        },
    )
