"""The soak's own agent tools and task kind, loaded into its worker and web processes
through ``ASSISTANT_TOOL_MODULES=tests.soak.tools`` and
``KERNEL_TASK_MODULES=tests.soak.tools.register``.

They give the soak work that runs long enough to be cancelled while it runs, failures
that keep arriving (for bulk retries), and - with ``SOAK_FAULTS`` naming ``values`` -
results Postgres refuses: text with NUL (``\\u0000``, tool output read from a binary
file or a web page) and a value JSON cannot encode (a ``datetime`` a handler returned).

Every tool takes ``{"mode": ..., "seconds": ...}``; the soak's scripted remote model
(:mod:`tests.soak.model`) asks for one tool per turn, as the submission's text says.

- ``soak_work`` (safe): holds for ``seconds``, then returns what ``mode`` says
  (``ok``; ``nul``: a page with a NUL in it).
- ``soak_stamp`` (unsafe: it must never run twice for one call): holds for ``seconds``,
  then returns ``ok``, or with mode ``datetime`` a ``datetime`` object.
- ``soak_job``: the ``soak-job`` task kind, which the tool task spawns and waits for:
  holds for ``seconds`` in its phase, then succeeds (``ok``), fails (``fail``), or
  succeeds with a NUL (``nul``) or a ``datetime`` (``datetime``) in its result.

Each run of a tool's function appends ``<tool> <task id> <pid> <started|returned> <time>``
(the machine's clock, unstepped) to
``$AGENT_TOOL_DIR/soak-runs``, so the soak counts runs per call from outside the workers
(an unsafe tool that ran twice for one call is a violation).
"""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kernel import Registry
from kernel.agent import Replay, Tool
from kernel.run import Run
from kernel.tasks import Transition

JOB_KIND = "soak-job"
MODES = ("ok", "fail", "nul", "datetime")
VALUE_MODES = ("nul", "datetime")  # what Postgres refuses: only with SOAK_FAULTS=values
NUL_TEXT = "<html>page\u0000binary tail</html>"
HOLD_LIMIT = 30.0
PARAMETERS = {
    "type": "object",
    "properties": {
        "mode": {"enum": list(MODES)},
        "seconds": {"type": "number", "minimum": 0, "maximum": HOLD_LIMIT},
    },
    "required": ["mode"],
    "additionalProperties": False,
}


def record(tool: str, task_id: str, what: str) -> None:
    folder = os.environ.get("AGENT_TOOL_DIR")
    if folder:
        with (Path(folder) / "soak-runs").open("a") as runs:
            # The machine's clock, as the harness times its faults: the clock-step hook
            # moves this process's ``time.time()``, and a run timed by it could miss the
            # fault that cut it short.
            at = time.clock_gettime(time.CLOCK_REALTIME)
            runs.write(f"{tool} {task_id} {os.getpid()} {what} {at:.3f}\n")


def hold(seconds: float) -> None:
    """Work that takes a while: the worker's heartbeat thread keeps the lease meanwhile."""
    time.sleep(min(max(seconds, 0.0), HOLD_LIMIT))


def value_for(mode: str) -> Any:
    if mode == "nul":
        return {"page": NUL_TEXT}
    if mode == "datetime":
        return {"at": datetime.now(UTC)}  # not JSON: what a careless handler returns
    return {"done": True}


def work(run: Run, arguments: dict[str, Any]) -> Any:
    record("soak_work", run.task_id, "started")
    hold(float(arguments.get("seconds", 0)))
    record("soak_work", run.task_id, "returned")
    return value_for(arguments["mode"])


def stamp(run: Run, arguments: dict[str, Any]) -> Any:
    record("soak_stamp", run.task_id, "started")
    hold(float(arguments.get("seconds", 0)))
    record("soak_stamp", run.task_id, "returned")
    return value_for(arguments["mode"])


TOOLS = [
    Tool("soak_work", "Work for a while, then answer (safe to repeat)", PARAMETERS,
         Replay.SAFE, run=work),
    Tool("soak_stamp", "Stamp a record (must not repeat)", PARAMETERS, Replay.UNSAFE,
         run=stamp),
    Tool("soak_job", "Run a soak job task and wait for it", PARAMETERS, task_kind=JOB_KIND),
]
UNSAFE_TOOLS = frozenset(t.name for t in TOOLS if t.run is not None and t.replay is Replay.UNSAFE)


class SoakJob:
    initial = "run"

    def run(self, run: Run) -> Transition:
        mode = run.input["mode"]
        hold(float(run.input.get("seconds", 0)))
        if mode == "fail":
            return run.fail("soak job failed on purpose")
        return run.succeed(value_for(mode))


def register(registry: Registry) -> None:
    registry.task(JOB_KIND)(SoakJob)
