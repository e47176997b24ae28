"""Approval benchmark (issue 22): from an operator's approval to the approved tool's start.

Against real processes on the benchmark's own database and Redis database: a Daphne
server (the API) and one Celery worker (solo pool) that loads a gated tool
(``benchmarks/_approval_tools.py``: every call waits for approval). For each call, this
process commits a tool task for it, waits until the worker has committed it as awaiting
approval (asleep, holding no worker), then approves it over HTTP (``POST
/api/sessions/<id>/calls/<call>/approve`` with an operator's token and the digest of the
arguments) and waits for the tool to write its start. The sample is the time from just
before the request is sent to the tool's first act, both on this machine's clock
(``time.time()`` in each process): the API's commit, its dispatch through Redis, the
worker's claim, the approval phase, the tool's intent commit and the call. One call at
a time, so each sample is one approval's path with nothing queued before it.

Target from the issue: p99 <= 200 ms. Run with ``python -m benchmarks.approval`` (``make
bench BENCH_ARGS=approval``); it writes the section "Approval to tool start (issue 22)"
of ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

from benchmarks._support import (
    Stats,
    fresh_database,
    machine_facts,
    machine_state,
    parse_arguments,
    progress,
    publish,
)
from controlplane.dev.ports import reserved_redis_url
from controlplane.dev.processes import Daphne, celery_worker, process_env, wait_for

HEADING = "## Approval to tool start (issue 22)"
DATABASE = "durable_bench_approval"
TARGET_MS = 200.0
TOOLS = "benchmarks._approval_tools"


@dataclass
class Result:
    at: datetime
    facts: dict[str, str]
    calls: int = 0
    to_start: Stats | None = None
    answered: Stats | None = None
    load_end: str = ""
    notes: list[str] = field(default_factory=list)


def operator_token() -> str:
    from django.contrib.auth.models import Group, User

    from controlplane.access import issue_token

    user = User.objects.create_user(f"bench-{uuid.uuid4().hex[:8]}")
    user.groups.add(Group.objects.get_or_create(name="operator")[0])
    return issue_token(user, "bench")


def gated_call(n: int) -> tuple[str, str, str]:
    """A session with a tool task for call ``n`` of the gated tool; (session, task, call)."""
    from benchmarks._approval_tools import NAME
    from controlplane.worker.runtime import runtime
    from kernel import Draft

    kernel = runtime().kernel
    handle = kernel.create_session(metadata={"benchmark": "approval"})
    draft = Draft(actor="bench")
    conversation = draft.create_conversation()
    call_id = f"call_{n}"
    task_id = draft.create_task("agent-tool", {
        "conversation_id": conversation,
        "call": {"id": call_id, "name": NAME, "arguments": {"n": n}}})
    handle.commit(draft)
    return handle.id, task_id, call_id


def awaiting(task_id: str) -> bool:
    from controlplane.worker.runtime import runtime
    from kernel import Status

    task = runtime().kernel.storage.task(task_id)
    return task is not None and task.status is Status.SLEEPING and task.phase == "approval"


def asked(task_id: str) -> str:
    """The identity of the request the call's task waits on (what a decision names)."""
    from controlplane.reads.approvals import request_identity
    from controlplane.worker.runtime import runtime

    task = runtime().kernel.storage.task(task_id)
    assert task is not None
    return request_identity(task.checkpoint["approval"])


def approve(server: Daphne, token: str, session_id: str, call_id: str, digest: str,
            asked_for: str) -> None:
    body = json.dumps({"action_id": uuid.uuid4().hex, "reason": "benchmark",
                       "digest": digest, "expected_request": asked_for}).encode()
    request = urllib.request.Request(
        f"{server.http}/api/sessions/{session_id}/calls/{call_id}/approve", data=body,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        method="POST")
    with urllib.request.urlopen(request, timeout=30) as answer:
        assert answer.status == 200, answer.read()


def started_at(log: Path, n: int) -> float | None:
    """When call ``n``'s tool started, if it has."""
    return starts(log).get(n)


def starts(log: Path) -> dict[int, float]:
    if not log.exists():
        return {}
    found = {}
    for line in log.read_text().splitlines():
        n, at = line.split()
        found[int(n)] = float(at)
    return found


def run(args: argparse.Namespace, url: str, redis_url: str) -> Result:
    from kernel.agent import digest

    result = Result(datetime.now(UTC), machine_facts(url))
    token = operator_token()
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "starts"
        env = process_env(url, redis_url, DJANGO_DEBUG=os.environ.get("DJANGO_DEBUG", "0"),
                          ASSISTANT_TOOL_MODULES=TOOLS, BENCH_TOOL_LOG=str(log))
        server = Daphne(Path(tmp) / "daphne.log", env)
        worker = celery_worker(Path(tmp), "bench-worker", env)
        progress("starting daphne and a worker")
        server.spawn()
        worker.spawn()
        server.wait_ready()
        worker.wait_ready()
        to_start: list[float] = []
        answered: list[float] = []
        try:
            for n in range(args.warmup + args.calls):
                session_id, task_id, call_id = gated_call(n)
                wait_for(partial(awaiting, task_id),
                         f"call {n} to await approval", timeout=60, every=0.01)
                asked_for = asked(task_id)
                sent = time.time()
                approve(server, token, session_id, call_id, digest({"n": n}), asked_for)
                replied = time.time()
                started = wait_for(partial(started_at, log, n), f"call {n} to start",
                                   timeout=60, every=0.002)
                assert started is not None  # wait_for returns what it waited for
                if n >= args.warmup:
                    to_start.append(started - sent)
                    answered.append(replied - sent)
                if (n + 1) % 20 == 0:
                    progress(f"  {n + 1} calls")
        finally:
            worker.stop()
            server.stop()
    result.calls = len(to_start)
    result.to_start = Stats.of(to_start)
    result.answered = Stats.of(answered)
    result.load_end = f"{os.getloadavg()[0]:.2f}"
    return result


def render(result: Result) -> str:
    facts = result.facts
    start, answer = result.to_start, result.answered
    assert start is not None and answer is not None
    met = "met" if start.p99 <= TARGET_MS else "NOT met"
    lines = [
        HEADING, "",
        f"Run {result.at:%Y-%m-%d %H:%M} UTC on {facts.get('cpu', '?')} "
        f"({facts.get('nproc', '?')} cores), Postgres {facts.get('version', '?')} "
        f"(synchronous_commit {facts.get('synchronous_commit', '?')}); "
        f"load average {facts.get('load_start', '?')} at the start, {result.load_end} at "
        f"the end. {machine_state(facts.get('load_start', '?'))}.", "",
        f"{result.calls} approvals, one at a time, each of a tool call the worker had "
        "committed as awaiting approval (asleep, no worker held). From just before the "
        "approve request is sent to the tool's first act in the worker:", "",
        "| | p50 | p90 | p99 | max |", "|---|---|---|---|---|",
        f"| approval click to tool start | {start.p50:.1f} ms | {start.p90:.1f} ms | "
        f"{start.p99:.1f} ms | {start.max:.1f} ms |",
        f"| the approve request's answer, beside it | {answer.p50:.1f} ms | "
        f"{answer.p90:.1f} ms | {answer.p99:.1f} ms | {answer.max:.1f} ms |", "",
        "The worker is sent the task right after the approval's commit, so the tool often "
        "starts before the API's answer reaches the client: most of the path is the API "
        "request's own time.", "",
        f"Target p99 <= {TARGET_MS:.0f} ms: {met}.", "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.approval", description=__doc__)
    parser.add_argument("--calls", type=int, default=200, help="measured approvals")
    parser.add_argument("--warmup", type=int, default=10)
    args, url = parse_arguments(parser, argv, DATABASE)
    os.environ["ASSISTANT_TOOL_MODULES"] = TOOLS  # this process's registry knows the tool
    with reserved_redis_url() as redis_url:
        os.environ["REDIS_URL"] = redis_url  # this process's dispatches reach the worker
        fresh_database(args, url, redis_url)
        result = run(args, url, redis_url)
    return publish(HEADING, render(result), write=not args.no_write)


if __name__ == "__main__":
    raise SystemExit(main())
