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


def messages(entries: list[Entry]) -> list[JSON]:
    results = {e.payload["call_id"]: e.payload for e in entries if e.kind == TOOL_RESULT}
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
            for call in calls:
                out.append(tool_message(call, results.get(call["id"])))
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
