"""The gated tool of the approval benchmark, loaded into its worker process through
``ASSISTANT_TOOL_MODULES=benchmarks._approval_tools``: every call waits for an
operator's approval; a run appends ``<n> <time.time()>`` to ``$BENCH_TOOL_LOG`` as its
first act, which is when the benchmark says the tool started."""

from __future__ import annotations

import os
import time
from typing import Any

from kernel.agent import Gate, Replay, Tool
from kernel.run import Run

NAME = "bench_gate"
PARAMETERS = {"type": "object", "properties": {"n": {"type": "integer"}},
              "required": ["n"], "additionalProperties": False}


def started(run: Run, arguments: dict[str, Any]) -> Any:
    at = time.time()
    with open(os.environ["BENCH_TOOL_LOG"], "a") as log:
        log.write(f"{arguments['n']} {at:.6f}\n")
    return {"n": arguments["n"]}


TOOLS = [Tool(NAME, "A call an operator approves (benchmark)", PARAMETERS, Replay.UNSAFE,
              run=started, gate=Gate(True, timeout=3600))]
