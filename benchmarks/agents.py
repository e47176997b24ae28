"""Agents benchmark (issue 28): what durability adds to each step of a Pydantic AI agent.

One agent, the same in every variant: a ``FunctionModel`` that calls one no-op tool 19
times, then answers (20 steps: a model request and, but for the last, its tool call).
It runs

- bare: ``agent.run_sync`` with no durability;
- on this kernel: the agent with ``KernelDurability()``, registered, started by a
  submission and run by an in-process worker (``kernel.Scheduler``, the kernel's own
  loop, on ``PostgresStorage``: no broker hop, no Celery). Each step then includes,
  for the tool (unsafe, the default), the commit of the response with the call's
  intent and the commit of its result; the first step includes claiming the turn and
  reading its journal, the last the commit that answers the submission. Run also with
  the tool declared safe (one commit a step: the response, with the previous call's
  result);
- on DBOS: the agent with Pydantic AI's ``DBOSDurability()`` inside a ``@DBOS.workflow``,
  DBOS's system database on the same Postgres server.

A step's time is from one model request to the next (the last: to the run's end: for
the kernel, when the commit that ends the task returns; the kernel is built as the
workers build it, with the Postgres artifact store), so
per step p50 and p99 come from every step of every run. Runs are interleaved in blocks
(bare, kernel, kernel-safe, DBOS, ...) so that background load hits all alike; the
overhead is each durable variant's percentile minus the bare one's.

``make bench BENCH_ARGS=agents`` (or ``python -m benchmarks.agents``) writes the section
below to ``docs/benchmarks.md``. The target: the kernel adds at most 5 ms per step,
and less than DBOS in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import psycopg

from benchmarks._support import (
    BENCH_DATABASE,
    Stats,
    database_url,
    fresh_database,
    machine_state,
    parse_arguments,
    progress,
    publish,
    recreate_database,
    server_facts,
)

HEADING = "## Agents: a Pydantic AI agent's steps, bare, on the kernel and on DBOS (issue 28)"
STEPS = 20
TARGET_MS = 5.0
DEFAULT_DATABASE = f"{BENCH_DATABASE}_agents"
DBOS_DATABASE = f"{BENCH_DATABASE}_agents_dbos"
VARIANTS = ("bare", "kernel", "kernel-safe", "dbos")


class Steps:
    """The model of every variant: marks the time of each request."""

    def __init__(self) -> None:
        self.marks: list[float] = []

    def model(self) -> Any:
        from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
        from pydantic_ai.models.function import FunctionModel

        def respond(messages: list[Any], info: Any) -> Any:
            self.marks.append(time.perf_counter())
            step = sum(1 for m in messages if m.kind == "response")
            if step < STEPS - 1:
                return ModelResponse(parts=[ToolCallPart("noop", {}, tool_call_id=f"c{step}")])
            return ModelResponse(parts=[TextPart("done")])

        return FunctionModel(respond)

    def durations(self, ended: float) -> list[float]:
        """The run's steps: request to request, the last to the run's end."""
        marks = [*self.marks, ended]
        assert len(self.marks) == STEPS, f"{len(self.marks)} requests, not {STEPS}"
        return [b - a for a, b in zip(marks, marks[1:], strict=False)]


def agent_with(steps: Steps, name: str, capabilities: list[Any], safe: bool = False) -> Any:
    from pydantic_ai import Agent

    from kernel.hosts.pydantic_ai import SAFE

    agent = Agent(steps.model(), name=name, capabilities=capabilities)

    @agent.tool_plain(metadata=SAFE if safe else None)
    def noop() -> str:
        return "ok"

    return agent


def bare_runner() -> Callable[[], list[float]]:
    steps = Steps()
    agent = agent_with(steps, "bare", [])

    def run() -> list[float]:
        steps.marks.clear()
        assert agent.run_sync("go").output == "done"
        return steps.durations(time.perf_counter())

    return run


def kernel_runner(safe: bool) -> Callable[[], list[float]]:
    from controlplane.process.kernel import artifact_store
    from controlplane.storage import PostgresStorage
    from controlplane.storage.clock import DatabaseClock
    from kernel import Draft, Kernel, Registry, Scheduler, SubmissionStatus
    from kernel.agent import submit
    from kernel.hosts.pydantic_ai import KernelDurability, register_agent

    steps = Steps()
    name = "bench-safe" if safe else "bench"
    registry = Registry()
    register_agent(registry, name, agent_with(steps, name, [KernelDurability()], safe))
    # As the workers build it (controlplane.process.kernel), with its artifact store: the
    # turn's history is stored as an artifact when it ends.
    kernel = Kernel(PostgresStorage(), registry, DatabaseClock(), artifacts=artifact_store())
    scheduler = Scheduler(kernel, f"bench-{name}")
    committed: list[float] = []
    # The run ends when its last commit returns; the scheduler's look for more work
    # after it is the benchmark's loop, which a worker does not do after a task.
    kernel.after_commit(lambda _: committed.append(time.perf_counter()))

    def run() -> list[float]:
        handle = kernel.create_session()
        draft = Draft()
        conversation = draft.create_conversation()
        handle.commit(draft)
        submitted = submit(handle, conversation, {"text": "go", "agent": name}, "req")
        assert submitted.submission is not None
        steps.marks.clear()
        committed.clear()
        scheduler.run_until_idle()
        ended = committed[-1]
        stored = kernel.storage.submission(submitted.submission.id)
        assert stored is not None and stored.status is SubmissionStatus.ANSWERED
        return steps.durations(ended)

    return run


def dbos_runner(url: str) -> tuple[Callable[[], list[float]], Callable[[], None]]:
    from dbos import DBOS
    from pydantic_ai.durable_exec.dbos import DBOSDurability

    steps = Steps()
    agent = agent_with(steps, "bench_dbos", [DBOSDurability()])
    DBOS(config={"name": "agents_bench", "system_database_url": url})

    @DBOS.workflow()
    async def workflow(prompt: str) -> str:
        return str((await agent.run(prompt)).output)

    DBOS.launch()
    loop = asyncio.new_event_loop()

    def run() -> list[float]:
        steps.marks.clear()
        assert loop.run_until_complete(workflow("go")) == "done"
        return steps.durations(time.perf_counter())

    def close() -> None:
        loop.close()
        DBOS.destroy()

    return run, close


def measure(url: str, dbos_url: str, runs: int, block: int) -> dict[str, list[list[float]]]:
    runners: dict[str, Callable[[], list[float]]] = {
        "bare": bare_runner(),
        "kernel": kernel_runner(safe=False),
        "kernel-safe": kernel_runner(safe=True),
    }
    dbos_run, dbos_close = dbos_runner(dbos_url)
    runners["dbos"] = dbos_run
    samples: dict[str, list[list[float]]] = {v: [] for v in VARIANTS}  # each run's steps
    try:
        for variant in VARIANTS:  # warm up: imports, connections, prepared plans
            for _ in range(3):
                runners[variant]()
        done = 0
        while done < runs:
            for variant in VARIANTS:
                for _ in range(min(block, runs - done)):
                    samples[variant].append(runners[variant]())
            done += min(block, runs - done)
            progress(f"{done}/{runs} runs of each variant")
    finally:
        dbos_close()
    return samples


POSITIONS = (("first", slice(0, 1)), ("middle", slice(1, -1)), ("last", slice(-1, None)))
"""A run's steps by where they are: the first claims the turn and reads its journal, the
last ends it."""


def by_position(samples: dict[str, list[list[float]]]) -> str:
    """Each variant's steps by position: p50 / p99 (ms) of each."""
    rows = []
    for variant in VARIANTS:
        cells = []
        for _, where in POSITIONS:
            found = Stats.of([step for run in samples[variant] for step in run[where]])
            cells.append(f"{found.p50:.2f} / {found.p99:.2f}")
        rows.append(f"| {variant} | {' | '.join(cells)} |")
    heads = " | ".join(f"{name} step p50 / p99" for name, _ in POSITIONS)
    return f"| variant | {heads} |\n|---|---|---|---|\n" + "\n".join(rows)


def render(when: datetime, info: dict[str, str], samples: dict[str, list[list[float]]],
           runs: int, command: str) -> str:
    stats = {variant: Stats.of([step for run in found for step in run])
             for variant, found in samples.items()}
    bare = stats["bare"]
    rows = []
    for variant in VARIANTS:
        s = stats[variant]
        added = "" if variant == "bare" else (
            f"{s.p50 - bare.p50:+.2f} | {s.p99 - bare.p99:+.2f}")
        rows.append(f"| {variant} | {s.count} | {s.p50:.2f} | {s.p90:.2f} | {s.p99:.2f} | "
                    f"{s.mean:.2f} | {added or '- | -'} |")
    kernel, safe, dbos = stats["kernel"], stats["kernel-safe"], stats["dbos"]
    kernel_added = kernel.p50 - bare.p50
    safe_added = safe.p50 - bare.p50
    dbos_added = dbos.p50 - bare.p50

    kernel_tail, safe_tail = kernel.p99 - bare.p99, safe.p99 - bare.p99
    dbos_tail = dbos.p99 - bare.p99

    def met(added: float, dbos: float) -> str:
        return "met" if added <= TARGET_MS and added < dbos else "not met"

    verdict = (
        f"The kernel (unsafe tool, the default) adds {kernel_added:.2f} ms per step at p50 "
        f"({kernel_tail:.2f} ms at p99); with the tool declared safe "
        f"{safe_added:.2f} ms ({safe_tail:.2f} ms at p99); DBOS adds "
        f"{dbos_added:.2f} ms at p50 ({dbos_tail:.2f} ms at p99). Target (at most "
        f"{TARGET_MS:g} ms added per step, and below DBOS in the same run): at p50 "
        f"{met(kernel_added, dbos_added)} with the unsafe tool, {met(safe_added, dbos_added)} "
        f"with the safe one; at p99 {met(kernel_tail, dbos_tail)} with the unsafe tool, "
        f"{met(safe_tail, dbos_tail)} with the safe one."
    )
    return f"""{HEADING}

Run {when:%Y-%m-%d %H:%M} UTC with `{command}`: {runs} runs of each variant, {STEPS} steps
each (one model request; a no-op tool call in all but the last), interleaved in blocks.
{machine_state(info['load_before'])} (load average
{info['load_before']} before, {info['load_after']} after; {info['cpus']} CPUs): compare
the variants with each other, not with figures from another run.

- bare: `agent.run_sync`, no durability.
- kernel: `KernelDurability()`, the run started by a submission and advanced by an
  in-process worker (`kernel.Scheduler` on `PostgresStorage`: the phase runs as in a
  Celery worker, without the broker hop that starts it). A step is two commits, each one
  statement in one round trip (the commit kind *next writing*): the model response with
  the tool's intent, then the tool's result (the tool is unsafe, the default); the first
  step also claims the turn and reads its journal; the last commits the answer with the
  turn's end (the run's messages stored as an artifact, the submission answered), and
  ends when that commit returns. The agent's loop runs on the phase's own thread.
- kernel-safe: the same with the tool declared safe: one commit a step (the response,
  with the previous call's result, which a safe call may leave to the next commit).
- dbos: `DBOSDurability()` in a `@DBOS.workflow`, DBOS's system database on the same
  Postgres server (function tools run in the workflow, model requests are steps).

Postgres {info['version']} (fsync {info['fsync']}, synchronous_commit
{info['synchronous_commit']}); Python {info['python']}; pydantic-ai-slim
{info['pydantic_ai']}, dbos {info['dbos']}.

Milliseconds per step:

| variant | steps | p50 | p90 | p99 | mean | added p50 | added p99 |
|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}

{verdict}

By a step's position in its run (ms):

{by_position(samples)}

Where the difference comes from: each commit waits for its WAL flush (fsync on). The
kernel writes two commits per step for an unsafe tool (the response with the call's intent,
which must be durable before the call starts; then its result, which must be durable
before the next model request, or a crash during that request would leave the call
uncertain) and one for a safe tool (its result rides with the next response: losing it
only makes the call run again). DBOS writes one step per model request and does not
record function tools at all (a tool that crashed mid-way is run again whatever it
does), so an unsafe tool's two flushes against its one are the floor of the difference:
when the disk is contended (other work on the machine), they weigh most.
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.agents", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=100, help="runs of each variant")
    parser.add_argument("--block", type=int, default=5, help="runs in a row per variant")
    args, url = parse_arguments(parser, argv, DEFAULT_DATABASE)
    from importlib.metadata import version

    info = {"load_before": " ".join(f"{x:.2f}" for x in os.getloadavg()),
            "cpus": str(os.cpu_count()), "python": platform.python_version(),
            "pydantic_ai": version("pydantic-ai-slim"), "dbos": version("dbos")}
    when = datetime.now(UTC)
    fresh_database(args, url)
    dbos_url = database_url(DBOS_DATABASE, url)
    recreate_database(dbos_url)
    with psycopg.connect(url) as conn:
        info.update(server_facts(conn))
    samples = measure(url, dbos_url, args.runs, args.block)
    info["load_after"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    command = "make bench BENCH_ARGS=agents"
    return publish(HEADING, render(when, info, samples, args.runs, command),
                   write=not args.no_write)


if __name__ == "__main__":
    raise SystemExit(main())
