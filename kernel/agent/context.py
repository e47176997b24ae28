"""Rebuilding a model's context from a conversation's entries.

Entries are the record; the context is derived, every time, so a restarted
worker sends the model exactly what the transcript says - no in-memory history.
Rules (DESIGN §8, Pi Durable spec): a tool result follows its call, whatever
order the entries were committed in; a call without a result gets a synthetic error
result (the model must not wait forever for it); a cancelled or interrupted call
says so beside the partial output it had committed; partial or aborted responses
are not entries at all, so they never reach the model or drive a tool. A summary
entry (compaction, :mod:`kernel.agent.compaction`) opens the context, standing for the
entries it covers, which the model no longer sees.
"""

from __future__ import annotations

from typing import Any

from kernel.records import SUMMARY, Entry

JSON = Any

USER = "user"
RESPONSE = "model_response"
TOOL_RESULT = "tool_result"
INTERRUPTION = "interruption"
SUMMARY_INTRO = (
    "A summary of the earlier part of this conversation, which is no longer shown "
    "in full:\n\n"
)
LOST_RESULT = "no result was recorded for this call (interrupted or lost); do not assume it ran"
CANCELLED_NOTE = (
    "the call was cancelled before it finished; `partial` is what it had committed by then "
    "(what it reports as uncertain may or may not have taken effect)"
)
INTERRUPTED_NOTE = (
    "the call was interrupted and may or may not have taken effect; `partial` is what it "
    "had committed by then"
)


Call = tuple[str, int]
"""A tool call: the id of the response entry that made it, and its place among the
response's calls (a call id alone may name calls of several responses)."""


def answers(entries: list[Entry]) -> dict[Call, int]:
    """Each answered call of ``entries`` and the index in ``entries`` of its result.

    Some models number their calls per response, so one call id can name calls of many
    responses (and an id-less server gives every call the same id). A result answers
    the call of the response it names (``response``, which a native turn's tool task
    records); otherwise the earliest call of its id made before it and not answered
    yet, of its turn where both name one: each call is answered after it was made, and
    a round's calls are answered before its turn asks again. A result that came before
    any call of its id answers the earliest such call left unanswered after it."""
    open_: dict[str, list[tuple[Call, JSON]]] = {}  # by call id, oldest first: (call, turn)
    found: dict[Call, int] = {}
    early: list[tuple[int, JSON]] = []
    for index, entry in enumerate(entries):
        payload = entry.payload if isinstance(entry.payload, dict) else {}
        if entry.kind == RESPONSE:
            calls = payload.get("tool_calls")
            # A list stored apart is a stand-in until opened: nothing of it to pair here.
            for place, call in enumerate(calls if isinstance(calls, list) else []):
                if isinstance(call, dict):
                    open_.setdefault(str(call.get("id")), []).append(
                        ((entry.id, place), payload.get("turn")))
        elif entry.kind == TOOL_RESULT and not _answer(open_, payload, index, found):
            early.append((index, payload))
    for index, payload in early:
        _answer(open_, payload, index, found)
    return found


def _answer(open_: dict[str, list[tuple[Call, JSON]]], result: JSON, index: int,
            found: dict[Call, int]) -> bool:
    waiting = open_.get(str(result.get("call_id")), [])
    response, turn = result.get("response"), result.get("turn")
    for at, ((made_by, place), made_in) in enumerate(waiting):
        if response is not None and made_by != response:
            continue
        if response is None and turn is not None and made_in not in (turn, None):
            continue
        found[(made_by, place)] = index
        del waiting[at]
        return True
    return False


def messages(entries: list[Entry]) -> list[JSON]:
    answered = answers(entries)
    out: list[JSON] = []
    for entry in entries:
        if entry.kind == USER:
            out.append({"role": "user", "content": entry.payload["text"]})
        elif entry.kind == SUMMARY:
            out.append({"role": "user", "content": SUMMARY_INTRO + entry.payload["text"]})
        elif entry.kind == RESPONSE:
            calls = entry.payload.get("tool_calls", [])
            message: JSON = {"role": "assistant", "content": entry.payload.get("text", "")}
            if calls:
                message["tool_calls"] = calls
            out.append(message)
            for place, call in enumerate(calls):
                at = answered.get((entry.id, place))
                out.append(tool_message(call, None if at is None else entries[at].payload))
    return out


def tool_message(call: JSON, result: JSON | None) -> JSON:
    if result is None:
        content: JSON = {"error": LOST_RESULT}
    elif result.get("cancelled"):
        content = {
            "cancelled": True,
            "reason": f"cancelled by {result.get('by')}: {result.get('reason')}",
            "partial": result.get("partial"),
            "note": CANCELLED_NOTE,
        }
    elif result.get("interrupted"):
        content = {
            "interrupted": True,
            "partial": result.get("partial"),
            "note": INTERRUPTED_NOTE,
        }
        if result.get("error"):
            content["error"] = result["error"]
    elif "error" in result:
        content = {"error": result["error"]}
        for known in ("result", "partial"):  # what a failed call did report, if anything
            if result.get(known) is not None:
                content[known] = result[known]
    else:
        content = {"result": result.get("result")}
    if result is not None and result.get("partial_error"):  # its partial could not be read
        content["partial_error"] = result["partial_error"]
    approval = result.get("approval") if result is not None else None
    if isinstance(approval, dict) and approval.get("edited"):
        content["note"] = "an operator edited the arguments: the call ran with these"
        content["arguments"] = approval.get("arguments")
    return {"role": "tool", "tool_call_id": call["id"], "name": call["name"], "content": content}
