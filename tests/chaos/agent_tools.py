"""Tools for agent chaos tests, loaded into real worker processes through
``ASSISTANT_TOOL_MODULES=tests.chaos.agent_tools``.

Each run of a tool appends ``<name> <pid>`` to ``$AGENT_TOOL_DIR/runs``, so the test
counts runs from outside the worker. With ``"hold": true`` a tool blocks until the
file ``$AGENT_TOOL_DIR/release`` exists: the test kills the worker while it blocks.
``crash`` kills its own worker with SIGKILL, every time.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from kernel.agent import Replay, Tool
from kernel.run import Run

HOLD_LIMIT = 120.0
PARAMETERS = {
    "type": "object",
    "properties": {"value": {"type": "string"}, "hold": {"type": "boolean"}},
    "additionalProperties": False,
}


def directory() -> Path:
    return Path(os.environ["AGENT_TOOL_DIR"])


def started(name: str) -> None:
    with (directory() / "runs").open("a") as runs:
        runs.write(f"{name} {os.getpid()}\n")


def hold() -> None:
    deadline = time.monotonic() + HOLD_LIMIT
    while not (directory() / "release").exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def probe(run: Run, arguments: dict[str, Any]) -> Any:
    started("probe")
    if arguments.get("hold"):
        hold()
    return {"probed": arguments.get("value")}


def charge(run: Run, arguments: dict[str, Any]) -> Any:
    started("charge")
    if arguments.get("hold"):
        hold()
    return {"charged": arguments.get("value")}


def crash(run: Run, arguments: dict[str, Any]) -> Any:
    started("crash")
    os.kill(os.getpid(), signal.SIGKILL)


TOOLS = [
    Tool("probe", "Read something (safe to repeat)", PARAMETERS, Replay.SAFE, run=probe),
    Tool("charge", "Charge a customer (must not repeat)", PARAMETERS, Replay.UNSAFE, run=charge),
    Tool("crash", "Kills the process running it", PARAMETERS, Replay.SAFE, run=crash),
]
