"""A registered Pydantic AI agent as a task definition: one task per turn of a
conversation, like a native ``agent-turn``, of kind ``agent:<name>``.

Its one phase, ``run``, runs ``agent.run(...)`` from the beginning every time it is
entered. What was committed before is answered from the journal (a response is not
requested again, a result not computed again), so a run that a crash cut short goes on
from its last commit: the framework replays its own loop (output validation and its
retries, usage limits) over the recorded units. An unsafe call whose intent is
committed but whose result is not is an uncertain step: the turn waits, holding no
worker, for an operator's decision (:data:`DECISIONS`), and applies it when it runs again.
"""

from __future__ import annotations

import contextvars
import json
import re
from dataclasses import dataclass
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessagesTypeAdapter
from pydantic_ai.toolsets import FunctionToolset
from pydantic_ai.usage import UsageLimits
from pydantic_core import to_jsonable_python

from kernel.agent.context import TOOL_RESULT
from kernel.agent.tools import Replay
from kernel.agent.turn import CONVERSATION, release, release_unanswered, turn_kind
from kernel.records import SubmissionStatus
from kernel.registry import Decision, Receipt, Registry
from kernel.run import Run
from kernel.tasks import Finish, Transition

from .bridge import Bridge
from .capability import CONFIG_KEY, KernelDurability, Units, enter, replay_of
from .journal import Journal

JSON = Any
HISTORY = "agent-history"
"""Per conversation: the framework's messages after the last turn that answered, which
the next turn's run continues from (``message_history``)."""
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


def resolution(call_id: str, attempt: int) -> str:
    """The signal an uncertain call waits on (one per attempt: a decision answers one)."""
    return f"resolution:{call_id}:{attempt}"


def check_tools(agent: Agent[Any, Any]) -> None:
    """Every function tool's replay policy is one the kernel knows (fails at registration,
    not in the middle of a run)."""
    for toolset in agent.toolsets:
        if isinstance(toolset, FunctionToolset):
            for tool in toolset.tools.values():
                metadata = tool.metadata or {}
                if CONFIG_KEY in metadata and metadata[CONFIG_KEY] is not False:
                    replay_of(metadata[CONFIG_KEY])


def register_agent(
    registry: Registry,
    name: str,
    agent: Agent[Any, Any],
    *,
    deps: Any = None,
    usage_limits: UsageLimits | None = None,
    queue: str = "brain",
) -> HostedAgent:
    """Register ``agent`` as the task kind a submission naming ``name`` starts."""
    if not NAME.fullmatch(name):
        raise ValueError(f"agent name {name!r}: 1-64 of a-z, 0-9, '_' and '-'")
    if KernelDurability.from_agent(agent) is None:
        raise ValueError(f"agent {name!r}: add capabilities=[KernelDurability()] to it")
    check_tools(agent)
    hosted = HostedAgent(name, agent, deps, usage_limits)
    registry.document(CONVERSATION)
    registry.document(HISTORY)

    @registry.task(turn_kind({"agent": name}), queue=queue)
    class HostedTurn:
        initial = "run"
        decisions = DECISIONS

        def run(self, run: Run) -> Transition:
            return run_turn(run, hosted)

        def on_end(self, run: Run, finish: Finish) -> None:
            release_unanswered(run, finish, "run")

    return hosted


def settle_uncertain(run: Run, journal: Journal) -> Transition | None:
    """Apply the operator's decision on each call cut mid-way; the wait for one that has
    none yet, or None when every call is settled."""
    for call_id, intent in journal.intents.items():
        signal = resolution(call_id, intent["attempt"])
        decided = run.signal(signal)
        if decided is None:
            return run.wait_for(signal, then="run", checkpoint={"uncertain": call_id})
        by = {"decision": decided.get("decision"), "by": decided.get("by"),
              "reason": decided.get("reason")}
        if decided.get("decision") == RUN_AGAIN.value:
            journal.forget_intent(call_id)
            continue
        if decided.get("decision") == HAPPENED.value:
            said = (decided.get("receipt") or {}).get("result")
            payload: JSON = {"kind": "tool_return", "result": said or
                             "An operator recorded that this call took effect."}
        else:
            payload = {"kind": "tool_failed", "message": "The call was interrupted; an "
                       "operator recorded that it did not take effect."}
        journal.record_result(call_id, intent["name"], payload, Replay.UNSAFE, None,
                              resolved=by)
    return None


def prompt(run: Run) -> str:
    texts = [run.submission(s).input.get("text", "") for s in run.input.get("submissions", [])]
    return "\n\n".join(t for t in texts if t)


def run_turn(run: Run, hosted: HostedAgent) -> Transition:
    journal = Journal.read(run)
    waiting = settle_uncertain(run, journal)
    if waiting is not None:
        return waiting
    conversation = run.input["conversation_id"]
    history_json = run.document(HISTORY, conversation).get("messages")
    history = ModelMessagesTypeAdapter.validate_python(history_json) if history_json else None
    units = Units(Bridge(), journal, segment=0, run_id=run.task_id, started_at=None)
    text = prompt(run)

    async def main() -> Any:
        return await hosted.agent.run(text, message_history=history, deps=hosted.deps,
                                      usage_limits=hosted.usage_limits)

    context = contextvars.copy_context()
    context.run(enter, units)
    try:
        result = units.bridge.serve(main, context)
    except Exception as exc:
        if units.bridge.failure is not None:
            raise  # the kernel's own (a lost lease, a lost connection): the worker's to handle
        reason = f"{type(exc).__name__}: {exc}"
        release(run, SubmissionStatus.UNANSWERED, reason)
        return run.fail(reason)
    messages = json.loads(result.all_messages_json())
    record_framework_returns(run, journal, json.loads(result.new_messages_json()))
    run.set(HISTORY, conversation, ["messages"], messages)
    release(run, SubmissionStatus.ANSWERED, None, answer_entry=journal.last_response_entry)
    usage = result.usage
    return run.succeed({
        "output": to_jsonable_python(result.output),
        "answer_entry": journal.last_response_entry,
        "usage": {"requests": usage.requests, "input_tokens": usage.input_tokens,
                  "output_tokens": usage.output_tokens},
    })


def record_framework_returns(run: Run, journal: Journal, new_messages: list[JSON]) -> None:
    """What the framework answered a call with itself (an output tool's "final result",
    a validation retry): a result entry, so the transcript's card is not left open."""
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
            run.append(conversation, TOOL_RESULT, {
                "call_id": call_id, "name": part.get("tool_name"), **shown,
                "turn": run.task_id, "by": "framework",
            })
