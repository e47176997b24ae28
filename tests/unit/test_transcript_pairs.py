"""The transcript pairs each tool result with the call it answers as the model's context
does, where a model reused the call's id."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from controlplane.reads.transcript import _results
from kernel.records import Entry


def entry(kind: str, seq: int, **payload: Any) -> Entry:
    return Entry(f"e{seq}", "s", "c", seq, 0, kind, payload, "system",
                 datetime(2026, 1, 1, tzinfo=UTC))


def test_a_result_naming_its_response_is_shown_on_that_calls_card() -> None:
    call = [{"id": "call_0", "name": "lookup", "arguments": {}}]
    shown = [
        entry("model_response", 1, text="", tool_calls=call, turn="t1"),  # its result: lost
        entry("model_response", 2, text="", tool_calls=call, turn="t2"),
        entry("tool_result", 3, call_id="call_0", name="lookup", response="e2", result=7),
    ]
    assert _results(shown, []) == {("e2", "call_0"): shown[2].payload}
