"""One Redis (issue 14): what the broker and the channel layer ask of Redis per task, and
how much of it one Redis serves on this machine.

On a ``redis-server`` of the run's own (``controlplane/dev/redis_server.py``: a free
port, no persistence, nothing else talking to it), so that its command counters hold
only this run's traffic:

- **per task**: a burst of no-op tasks (the fan-out benchmark's kind,
  ``benchmarks._support.noop``, one commit per phase) run by real workers and beat; the
  server's ``INFO commandstats`` before and after, divided by the tasks: the broker's
  messages (the committer's ``LPUSH``, the worker's fetch, kombu's bookkeeping of
  unacknowledged messages under ``acks_late``), the channel layer's hints
  (channels_redis's ``group_send`` to the session's group and the global one: each reads
  the group's members, then pushes to each member's channel; with no page open there are
  none), beat's sweeps and Celery's remote-control listeners;
- **capacity**: ``redis-benchmark`` (Debian's redis-tools) against the same server with
  8 clients, for the commands that per-task traffic is made of.

Postgres: the benchmark's database ``durable_bench_broker`` on the server ``DATABASE_URL``
names, recreated for the run.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import shutil
import subprocess
from datetime import UTC, datetime

import redis

from benchmarks._support import (
    BENCH_DATABASE,
    TASK_MODULE,
    Driver,
    cluster,
    fresh_database,
    load_average,
    parse_arguments,
    progress,
    publish,
)

HEADING = "## One Redis (issue 14)"
DEFAULT_DATABASE = f"{BENCH_DATABASE}_broker"
CAPACITY_TESTS = "lpush,rpop,hset,zadd"  # with ZRANGE: what a task asks of Redis


def commandstats(url: str) -> dict[str, int]:
    """Calls per command since the server started."""
    stats = redis.Redis.from_url(url).info("commandstats")
    return {name.removeprefix("cmdstat_"): int(values["calls"]) for name, values in stats.items()}


def per_task(url: str, redis_url: str, args: argparse.Namespace) -> dict[str, float]:
    """Redis commands per task of a burst, by command (the burst's own traffic only)."""
    with cluster(url, redis_url, args.workers, None):
        driver = Driver(redis_url)
        try:
            driver.burst(20, 1, args.timeout)  # warm-up: connections, declared queues
            before = commandstats(redis_url)
            progress(f"{args.tasks} one-phase tasks on {args.workers} worker(s)")
            rate = driver.burst(args.tasks, 1, args.timeout)
            # A task an idle worker started from its commit's hint is done before its
            # message is fetched: the message is still the broker's work, so count it.
            drained(redis_url, args.timeout)
            after = commandstats(redis_url)
        finally:
            driver.close()
    progress(f"{rate:.1f} tasks/s")
    calls = {name: (after[name] - before.get(name, 0)) / args.tasks for name in after}
    return {name: value for name, value in calls.items() if value > 0}


def drained(redis_url: str, timeout: float) -> None:
    """Wait until the workers' queues hold no message."""
    from controlplane.dev.processes import QUEUES, wait_for

    client = redis.Redis.from_url(redis_url)
    queues = QUEUES.split(",")
    wait_for(lambda: sum(client.llen(q) for q in queues) == 0, "the queues to drain",
             timeout=timeout, every=0.01)


def capacity(port: int, requests: int) -> dict[str, float]:
    """``redis-benchmark`` requests/s by command, 8 clients, no pipelining."""
    binary = shutil.which("redis-benchmark")
    if binary is None:
        return {}
    common = [binary, "-h", "127.0.0.1", "-p", str(port), "-n", str(requests), "-c", "8",
              "--csv"]
    found: dict[str, float] = {}
    for extra in (["-t", CAPACITY_TESTS], ["ZRANGE", "group", "0", "-1"]):
        done = subprocess.run([*common, *extra], capture_output=True, text=True, check=True,
                              timeout=300)
        for row in csv.DictReader(io.StringIO(done.stdout)):
            found[row["test"].split()[0]] = float(row["rps"])
    return found


def render(when: datetime, facts: dict[str, str], calls: dict[str, float],
           rps: dict[str, float], args: argparse.Namespace) -> str:
    total = sum(calls.values())
    lines = [
        HEADING,
        "",
        f"Run {when:%Y-%m-%d %H:%M} UTC by `make bench BENCH_ARGS=broker`. Machine: "
        f"{facts['machine']}; load average {facts['load_before']} before the run and "
        f"{facts['load_after']} after it (other engineers' tests share the cores). Redis "
        f"{facts['redis']}, a server of the run's own on this host.",
        "",
        f"Per task: {args.tasks:,} one-phase no-op tasks, one commit each, on "
        f"{args.workers} worker(s) and beat: **{total:.1f} Redis commands per task**.",
        "",
        "| command | calls per task |",
        "|---|---:|",
    ]
    for name, value in sorted(calls.items(), key=lambda item: -item[1]):
        lines.append(f"| `{name}` | {value:.2f} |")
    lines += ["", "| capacity (redis-benchmark, 8 clients) | requests/s |", "|---|---:|"]
    for name, value in rps.items():
        lines.append(f"| `{name}` | {value:,.0f} |")
    if rps:
        floor = min(rps.values())
        lines += [
            "",
            f"At the slowest of these ({floor:,.0f} requests/s) and {total:.1f} commands per "
            f"task, one Redis carries about **{floor / total:,.0f} tasks/s** on this machine "
            "before its one thread is busy, against the hundreds of commits/s one Postgres "
            "takes here (\"Phase commit\", \"Scaling\").",
        ]
    else:
        lines += ["", "redis-benchmark not found (Debian's redis-tools): no capacity figures."]
    lines += [
        "",
        "Method: see `benchmarks/broker.py`. Commands are counted by the server (`INFO "
        "commandstats`) over the burst alone, after a warm-up; they include beat's sweeps "
        "and Celery's remote-control listeners during the burst, and the channel-layer "
        "hints of the workers' commits (at most one send per worker every 20 ms, "
        "`notify.GAP_SECONDS`; the benchmark's own creating commit sends none); no page or "
        "feed is open, so no hint is pushed to a web process's channel: each open web "
        "process would add one push per hint of a session it follows.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.broker",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--tasks", type=int, default=500)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--requests", type=int, default=100_000, help="per redis-benchmark test")
    parser.add_argument("--timeout", type=float, default=600.0)
    args, url = parse_arguments(parser, argv, DEFAULT_DATABASE)
    from controlplane.dev.postgres import private_folder
    from controlplane.dev.redis_server import PrivateRedis, redis_server

    os.environ["KERNEL_TASK_MODULES"] = TASK_MODULE  # this process commits the kind too
    binary = redis_server()
    if binary is None:
        raise SystemExit("no redis-server binary found")
    facts = {"machine": f"{os.cpu_count()} CPUs",
             "load_before": load_average()}
    when = datetime.now(UTC)
    with private_folder("bench-broker-", None) as folder:
        server = PrivateRedis(folder, binary)
        server.start()
        try:
            fresh_database(args, url, server.url)
            info = redis.Redis.from_url(server.url).info("server")
            facts["redis"] = str(info["redis_version"])
            calls = per_task(url, server.url, args)
            progress("redis-benchmark")
            rps = capacity(server.port, args.requests)
        finally:
            server.stop()
    facts["load_after"] = load_average()
    return publish(HEADING, render(when, facts, calls, rps, args), write=not args.no_write)


if __name__ == "__main__":
    raise SystemExit(main())
