"""A gated tool for chaos tests, loaded into real worker processes through
``ASSISTANT_TOOL_MODULES=tests.chaos.agent_tools,tests.chaos.gated_tools``: ``pay``
(replay unsafe) waits for an operator's approval before every call (for
``$GATE_TIMEOUT`` seconds, default 600), and records its runs as the tools of
:mod:`tests.chaos.agent_tools` do (``"hold": true`` blocks it until released).
``refund`` is gated the same way. With ``PAY_SCHEMA=2`` in a worker's environment,
``pay`` takes one more (optional) parameter: its schema changed."""

from __future__ import annotations

import os
from typing import Any

from kernel.agent import Gate, Replay, Tool
from kernel.run import Run

from .agent_tools import PARAMETERS, hold, started


def pay(run: Run, arguments: dict[str, Any]) -> Any:
    started("pay")
    if arguments.get("hold"):
        hold()
    return {"paid": arguments.get("value")}


def refund(run: Run, arguments: dict[str, Any]) -> Any:
    started("refund")
    return {"refunded": arguments.get("value")}


PAY_PARAMETERS = PARAMETERS if os.environ.get("PAY_SCHEMA", "1") == "1" else {
    **PARAMETERS, "properties": {**PARAMETERS["properties"], "currency": {"type": "string"}}}
GATE = Gate(True, timeout=float(os.environ.get("GATE_TIMEOUT", "600")))

TOOLS = [
    Tool("pay", "Pay a supplier (an operator approves each payment)", PAY_PARAMETERS,
         Replay.UNSAFE, run=pay, gate=GATE),
    Tool("refund", "Refund a customer (an operator approves each refund)", PARAMETERS,
         Replay.UNSAFE, run=refund, gate=GATE),
]
