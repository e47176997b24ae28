"""What one agent run has committed, and how each durable unit is written.

The journal is the conversation's entries, the same kinds native turns write
(:mod:`kernel.agent.context`), so the transcript shows a hosted agent as it shows a
native one. Each entry carries what the framework needs to replay the unit (its
payload as the framework's JSON codec wrote it) beside what people read:

- a model response: ``model_response`` with the unit's key (``<segment>:model:<n>``, the
  n-th request of the run's segment; a run's model requests are sequential, so the
  count is the same on every replay), its text, tool calls and usage;
- a tool call: ``tool_result`` under the model's call id, with its replay policy and
  duration. An unsafe call commits its *intent* (in the checkpoint of the task that runs
  it: the turn, or the call's hands task) before it starts, so recovery knows it may
  have taken effect; a response whose calls are all unsafe is committed with the first
  one's intent.

A hands task reads and writes its turn's journal (entries marked with the turn's id),
with its own checkpoint for its call's intent; its call's result is committed with the
task's end, which leaves that checkpoint as it was (the result settles the intent).

Everything here runs on the phase's thread (see :mod:`.bridge`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from kernel.agent.context import RESPONSE, TOOL_RESULT
from kernel.agent.requests import count_in_conversation
from kernel.agent.tools import Replay
from kernel.agent.turn import PROGRESS
from kernel.run import Run

JSON = Any


def _text(payload: JSON) -> str:
    return "".join(
        str(part.get("content") or "")
        for part in payload.get("parts") or []
        if part.get("part_kind") == "text"
    )


def _arguments(args: JSON) -> JSON:
    if isinstance(args, str):
        try:
            return json.loads(args) if args else {}
        except ValueError:
            return args
    return args if args is not None else {}


def _calls(payload: JSON) -> list[JSON]:
    return [
        {"id": part.get("tool_call_id"), "name": part.get("tool_name"),
         "arguments": _arguments(part.get("args"))}
        for part in payload.get("parts") or []
        if part.get("part_kind") == "tool-call"
    ]


def _usage(payload: JSON) -> JSON:
    usage = payload.get("usage") or {}
    return {"input_tokens": int(usage.get("input_tokens") or 0),
            "output_tokens": int(usage.get("output_tokens") or 0)}


def unit_of(call_id: str, occurrence: int = 1) -> str:
    """The journal's key for a call: its call id, and for a call whose id an earlier
    response of the turn used too (some models number their calls per response), which
    of those calls it is."""
    return call_id if occurrence <= 1 else f"{call_id}#{occurrence}"


def shown_result(payload: JSON) -> JSON:
    """A tool call's recorded outcome as the transcript shows it: ``result`` or ``error``."""
    kind = payload.get("kind")
    if kind in ("tool_return", "tool_content_result"):
        return {"result": payload.get("result")}
    if kind in ("model_retry", "tool_failed", "run_cancelled"):
        return {"error": payload.get("message")}
    if kind == "validation_error":
        return {"error": f"{payload.get('title')}: invalid arguments",
                "result": payload.get("errors")}
    return {"error": f"deferred ({kind})"}


@dataclass
class Journal:
    """The committed units of one run (a task), read once when its phase starts."""

    run: Run
    turn: str
    """The turn whose units these are: ``run`` itself, or the turn a hands task serves."""
    responses: dict[str, JSON] = field(default_factory=dict)
    results: dict[str, JSON] = field(default_factory=dict)
    """By :func:`unit_of` the call."""
    last_response_entry: str | None = None
    first_request: JSON = None
    """The request that opened a conversation's first turn (its system prompt with the
    user's), as the framework's JSON, once the response to it is recorded."""

    @classmethod
    def read(cls, run: Run, turn: str | None = None, since: int | None = None) -> Journal:
        """The units of ``turn`` (default: ``run``'s task), read from the commit that
        created it (``since``; ``run``'s own task's when the turn is ``run``, else the
        whole conversation): a turn's entries all come after it, so a long conversation's
        earlier turns are not read each time one enters a phase."""
        journal = cls(run, turn or run.task_id)
        if since is None and turn is None:
            since = run.task.created_seq
        after = (since, -1) if since is not None else (-1, -1)
        for entry in run.entries_after(run.input["conversation_id"], after):
            payload = entry.payload if isinstance(entry.payload, dict) else {}
            if payload.get("turn") != journal.turn or "pydantic" not in payload:
                continue
            if entry.kind == RESPONSE:
                journal.responses[payload["unit"]] = payload["pydantic"]
                journal.last_response_entry = entry.id
                if payload.get("request") is not None:
                    journal.first_request = payload["request"]
            elif entry.kind == TOOL_RESULT:
                key = unit_of(payload["call_id"], payload.get("occurrence") or 1)
                journal.results[key] = payload["pydantic"]
        return journal

    @property
    def conversation(self) -> str:
        return str(self.run.input["conversation_id"])

    @property
    def intents(self) -> dict[str, JSON]:
        return dict(self.run.checkpoint.get("intents") or {})

    # -- writes: each joins the run's draft; ``commit`` (or the phase's end) commits it,
    # keeping the lease --------------------------------------------------------------

    def commit(self) -> None:
        self.run.commit()

    def record_response(self, key: str, payload: JSON, request: JSON = None) -> None:
        """The response's entry, and its tokens in the conversation's running totals, in
        the draft: committed by the caller (with the intent of its first unsafe call, when
        that is what follows it). ``request``: the request it answers, when that opened
        the conversation (see :attr:`first_request`)."""
        usage = _usage(payload)
        extra = {} if request is None else {"request": request}
        entry = self.run.append(self.conversation, RESPONSE, {
            "text": _text(payload), "tool_calls": _calls(payload), "usage": usage,
            "turn": self.turn, "unit": key, "pydantic": payload, **extra,
        })
        if request is not None:
            self.first_request = request
        count_in_conversation(self.run, self.conversation, usage, None)
        self.responses[key] = payload
        self.last_response_entry = entry

    def record_intent(self, call_id: str, name: str, arguments: JSON,
                      occurrence: int = 1) -> None:
        """Before an unsafe call starts: from this commit on, it may have taken effect."""
        key = unit_of(call_id, occurrence)
        attempts = dict(self.run.checkpoint.get("call_attempts") or {})
        attempts[key] = attempts.get(key, 0) + 1
        intents = self.intents
        intents[key] = {"name": name, "arguments": arguments, "replay": str(Replay.UNSAFE),
                        # what operation_id(ctx) gives the tool
                        "operation_id": f"op_{self.turn}_{key}",
                        "attempt": attempts[key], "call_id": call_id,
                        "occurrence": occurrence}
        self.run.commit(checkpoint={"intents": intents, "call_attempts": attempts})

    def record_result(self, call_id: str, name: str, payload: JSON, replay: Replay,
                      seconds: float | None, *, commit: bool = True, occurrence: int = 1,
                      **extra: JSON) -> None:
        """The call's result entry; committed now (dropping its intent) unless ``commit``
        is False: a safe call's result may wait for the run's next commit, since losing
        it only makes the call run again."""
        key = unit_of(call_id, occurrence)
        if occurrence > 1:
            extra["occurrence"] = occurrence
        self.run.append(self.conversation, TOOL_RESULT, {
            "call_id": call_id, "name": name, **shown_result(payload), "replay": str(replay),
            "seconds": seconds, "turn": self.turn, "pydantic": payload, **extra,
        })
        self.results[key] = payload
        if commit:
            intents = self.intents
            intents.pop(key, None)
            self.run.commit(checkpoint={"intents": intents})

    def save_partial(self, call_id: str, value: JSON) -> None:
        """What a call under way has done so far, committed (the turn's progress document,
        under ``partials``): a cancelled turn tells the next one about it."""
        self.run.set(PROGRESS, self.turn, ["partials", call_id], value)
        self.run.commit()

    def forget_intent(self, key: str) -> None:
        """The call (by :func:`unit_of` it) is to run again (a safe one, or an operator
        said so)."""
        intents = self.intents
        intents.pop(key, None)
        self.run.commit(checkpoint={"intents": intents})
