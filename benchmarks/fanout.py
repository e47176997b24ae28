"""No-op fan-out beside the peers (issue 12): the engine's own cost, with nothing to do.

The peers' workloads (``../shared/anchors/``), on a task kind whose phases do nothing but
commit (``bench-noop``, registered in the workers through ``KERNEL_TASK_MODULES``), each
in the shape it is compared with, named in every row of the report:

- **per item**: one client call per task, from 1 and from 4 client threads started
  together. Ours: a commit that creates one task, each client thread in a session of its
  own (one session's commits take turns), delivering its message as the API's commits do
  (a broker producer per sending thread). The peers: Celery ``apply_async``,
  Procrastinate ``defer``, DBOS ``enqueue``;
- **batch**: one call for the whole burst. Ours: one commit creating every task. The
  peers: Procrastinate ``batch_defer``, Celery ``group(...).apply_async()``.

Workloads: 5,000 one-phase tasks (per item and batch) and 1,000 tasks of 2 phases (2
commits each, the second inline while the worker holds the lease; beside DBOS's workflows
of 2 steps), run by 2 worker processes (``celery worker -P solo``, as deployed) and beat;
tasks/s from the first submit until every task is terminal (polled every 10 ms), as the
peers count from the first submit to the last completion. Each shape starts on emptied
tables with workers started for it, as each peer's run starts on a database of its own.
Also **sequential**: one task of 2,000 phases, timed inside the task, beside DBOS's one
workflow of 2,000 steps; and
**idle dispatch**: tasks created one per commit, 200 at 5 ms gaps and 50 at 50 ms gaps,
from before the commit to the phase's start (read by the handler, same host clock),
beside Celery's and Procrastinate's send-to-start. During the one-phase per-item rows,
``pg_stat_activity`` is sampled (``benchmarks._support.WaitSampler``): where the
database's backends wait.

With ``--peers`` the same run then runs the peers with the virtualenv the anchors use
(``--peer-python``, default ``$ANCHORS_PYTHON`` or ``$TMPDIR/anchors-venv``, made by
``bash ../shared/anchors/run.sh``): the anchors' own scripts for one client thread, and
``benchmarks/_fanout_peers.py`` (which imports the anchors' modules) for the other shapes;
on this run's Postgres server (user ``postgres``, databases named after ``--database``)
and Redis db, and prints same-run ratios. Differences in kind: our workers log at INFO
(the launcher's readiness and activity counts read the log), the peers at WARNING; each
of our tasks is durable with a fenced lease, and Celery's are not durable.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks._support import (
    BENCH_DATABASE,
    ROOT,
    TASK_MODULE,
    Driver,
    Stats,
    Submitted,
    cluster,
    code_revision,
    database_url,
    fresh_database,
    load_average,
    parse_arguments,
    progress,
    publish,
    recreate_database,
)
from controlplane.dev.ports import reserved_redis_url

HEADING = "## No-op fan-out beside the peers (issue 12)"
DEFAULT_DATABASE = f"{BENCH_DATABASE}_fanout"
DEFAULT_REDIS_DB = 13
ANCHORS = ROOT.parent / "shared" / "anchors"
SHAPES = ROOT / "benchmarks" / "_fanout_peers.py"
CLIENT_THREADS = (1, 4)


# -- our side ---------------------------------------------------------------------------


@dataclass
class Ours:
    fanout: float = 0.0  # tasks/s, the burst made by one commit
    fanout_n: int = 0
    two: float = 0.0  # tasks/s (2 phases each)
    two_n: int = 0
    sequential: float = 0.0  # phases/s
    sequential_n: int = 0
    latency: dict[str, Stats] = field(default_factory=dict)
    """From before the commit that makes the task to the phase's first line."""
    latency_durable: dict[str, Stats] = field(default_factory=dict)
    """From the moment that commit is durable (its first after-commit listener, before
    its dispatch is sent) to the phase's first line: the counterpart of the peers'
    send-to-start, which starts where a client hands the task over."""
    per_item: dict[int, Submitted] = field(default_factory=dict)
    """One-phase tasks, one commit per client call, by client threads."""
    two_per_item: dict[int, Submitted] = field(default_factory=dict)
    """Two-phase tasks, one commit per client call, by client threads."""


def measure_ours(url: str, redis_url: str, args: argparse.Namespace) -> Ours:
    ours = Ours(fanout_n=args.tasks, two_n=args.two_phase, sequential_n=args.sequential)
    for threads in CLIENT_THREADS:
        with _fresh(url, redis_url, args) as driver:
            progress(f"ours: {args.tasks} one-phase tasks, per item, {threads} thread(s)")
            ours.per_item[threads] = shown = driver.per_item(args.tasks, 1, threads, args.timeout)
            progress(f"ours: {_submitted(shown)}")
    with _fresh(url, redis_url, args) as driver:
        progress(f"ours: {args.tasks} one-phase tasks, one commit")
        ours.fanout = driver.burst(args.tasks, 1, args.timeout)
        progress(f"ours: {ours.fanout:.0f} tasks/s")
    for threads in CLIENT_THREADS:
        with _fresh(url, redis_url, args) as driver:
            ours.two_per_item[threads] = shown = driver.per_item(
                args.two_phase, 2, threads, args.timeout)
            progress(f"ours: two-phase per item, {threads} thread(s): {_submitted(shown)}")
    with _fresh(url, redis_url, args) as driver:
        ours.two = driver.burst(args.two_phase, 2, args.timeout)
        progress(f"ours: {args.two_phase} two-phase tasks, one commit: {ours.two:.0f} tasks/s")
    with _fresh(url, redis_url, args) as driver:
        ours.sequential = driver.sequential(args.sequential, args.timeout)
        progress(f"ours: one task of {args.sequential} phases: {ours.sequential:.0f} phases/s")
    with _fresh(url, redis_url, args) as driver:
        for count, gap in ((args.latency, 5.0), (max(args.latency // 4, 1), 50.0)):
            label = f"{count} @ {gap:g} ms"
            ours.latency[label], ours.latency_durable[label] = driver.latency(
                count, gap, args.timeout)
    return ours


@contextlib.contextmanager
def _fresh(url: str, redis_url: str, args: argparse.Namespace) -> Iterator[Driver]:
    """Each shape on emptied tables, with workers started for it, as each peer's run
    starts on a database of its own: no shape runs on the tasks an earlier one left (a
    burst after 10,000 per-item tasks is not the burst the peers are set beside)."""
    from django.core.management import call_command

    call_command("flush", verbosity=0, interactive=False)
    with cluster(url, redis_url, args.workers, args.logs):
        driver = Driver(redis_url, url)
        try:
            driver.burst(20, 2, args.timeout)  # warm-up
            yield driver
        finally:
            driver.close()


# -- the peers ------------------------------------------------------------------------


PEERS = {
    # key: (script argv, run from the anchors' folder; database to recreate or None).
    # The anchors' own scripts submit one call per task from one client thread; the
    # other shapes are our driver of the same peer modules (benchmarks/_fanout_peers.py).
    "celery": (["bench_celery.py", "--pool", "prefork", "--concurrency", "2"], None),
    "celery_item4": ([str(SHAPES), "celery", "--threads", "4"], None),
    "celery_group": ([str(SHAPES), "celery", "--shape", "batch"], None),
    "procrastinate": (["bench_procrastinate.py", "--concurrency", "2"], "proc"),
    "procrastinate_item4": ([str(SHAPES), "procrastinate", "--threads", "4"], "proc"),
    "procrastinate_batch": ([str(SHAPES), "procrastinate", "--shape", "batch"], "proc"),
    "dbos_fanout": (["bench_dbos.py", "fanout"], "dbos"),
    "dbos_item4": ([str(SHAPES), "dbos", "--threads", "4"], "dbos"),
    "dbos_seq": (["bench_dbos.py", "seq"], "dbos"),
}


def peer_python(given: str | None) -> Path:
    if given:
        return Path(given)
    if os.environ.get("ANCHORS_PYTHON"):
        return Path(os.environ["ANCHORS_PYTHON"])
    return Path(os.environ.get("TMPDIR", "/tmp")) / "anchors-venv" / "bin" / "python"


def run_peer(
    key: str, python: Path, url: str, redis_url: str, args: argparse.Namespace
) -> dict[str, Any]:
    """One anchor script on this run's servers: its RESULT line, or why there is none."""
    from psycopg.conninfo import conninfo_to_dict

    argv, db = PEERS[key]
    n = {"dbos_fanout": args.two_phase, "dbos_item4": args.two_phase,
         "dbos_seq": args.sequential}.get(key, args.tasks)
    if argv[0] == str(SHAPES):
        argv = [*argv, "--anchors", str(args.anchors), "--timeout", f"{args.timeout:g}"]
    # Named after this run's database, so that runs on other databases do not meet.
    names = {"proc": f"{args.database}_anchors_proc", "dbos": f"{args.database}_anchors_dbos"}
    if db is not None:
        recreate_database(database_url(names[db], url))
    info = conninfo_to_dict(url)
    env = {
        **os.environ,
        "ANCHORS_PG_HOST": str(info.get("host") or "127.0.0.1"),
        "ANCHORS_PG_PORT": str(info.get("port") or "5432"),
        "ANCHORS_PG_USER": str(info.get("user") or "postgres"),
        "ANCHORS_PG_PASS": str(info.get("password") or "unused"),
        "ANCHORS_REDIS_URL": redis_url,
        "ANCHORS_PROC_DB": names["proc"],
        "ANCHORS_DBOS_DB": names["dbos"],
    }
    progress(f"peer {key}: {' '.join(argv)} --n {n}")
    try:
        done = subprocess.run(
            [str(python), *argv, "--n", str(n)],
            cwd=args.anchors,
            env=env,
            capture_output=True,
            text=True,
            timeout=args.timeout * 3,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {args.timeout * 3:g} s"}
    except OSError as exc:  # no such interpreter or folder: this peer did not run
        return {"error": f"could not start: {exc}"}
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout)[-400:].strip().replace("\n", " | ")
        return {"error": f"exit {done.returncode}: {tail}"}
    result: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
    return result


def measure_peers(url: str, redis_url: str, args: argparse.Namespace) -> dict[str, Any]:
    python = peer_python(args.peer_python)
    probe = (
        subprocess.run(
            [str(python), "-c", "import dbos, procrastinate, celery, redis, psycopg"],
            capture_output=True,
            text=True,
        )
        if python.exists()
        else None
    )
    if probe is None or probe.returncode != 0:
        why = (
            f"{python} does not exist"
            if probe is None
            else f"{python} lacks a peer: {probe.stderr.strip()[-200:]}"
        )
        why += "; make it with `bash ../shared/anchors/run.sh` or point --peer-python at one"
        return {key: {"error": why} for key in PEERS}
    import redis

    peers = {}
    for key in PEERS:
        redis.Redis.from_url(redis_url).flushdb()
        peers[key] = run_peer(key, python, url, redis_url, args)
        progress(f"peer {key}: {_brief(peers[key])}")
    return peers


def _brief(result: dict[str, Any]) -> str:
    if "error" in result:
        return f"FAILED: {result['error'][-200:]}"
    for name in ("wf_per_s", "per_s", "steps_per_s"):
        if name in result:
            return f"{name} {result[name]:.1f}"
    return "?"


# -- the report -----------------------------------------------------------------------


def _f(value: float | None, digits: int = 1) -> str:
    if value is None:
        return "n/a"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.{digits}f}"


def _ratio(ours: float | None, theirs: float | None) -> str:
    return f"{ours / theirs:.2f}x" if ours and theirs else "n/a"


def _wait_table(ours: Ours, top: int = 6) -> list[str]:
    """Where the database's backends (our client threads' and the workers') were during
    the one-phase per-item runs, sampled every 5 ms: a lock that serializes commits
    shows here."""
    runs = [(n, s) for n, s in sorted(ours.per_item.items()) if s.waits]
    if not runs:
        return []
    keys: list[str] = []
    for _, shown in runs:
        keys += [k for k in list(shown.waits)[:top] if k not in keys]
    lines = [
        "Where the database's backends (client threads' and workers') were during the "
        "one-phase per-item rows, sampled from `pg_stat_activity` every 5 ms (average "
        "number of backends; `Lock: object` is the lock every notifying transaction "
        "takes at commit):",
        "",
        "| state, wait event | " + " | ".join(f"per item, {n} thread(s)" for n, _ in runs) + " |",
        "|---|" + "---:|" * len(runs),
    ]
    lines += [f"| {key} | " + " | ".join(f"{s.waits.get(key, 0.0):.2f}" for _, s in runs) + " |"
              for key in keys]
    return [*lines, ""]


def _per_s(shown: Submitted | None) -> float | None:
    return None if shown is None else shown.per_s


def _submitted(shown: Submitted | None) -> str:
    if shown is None:
        return "n/a"
    text = f"{_f(shown.per_s)} tasks/s (submit {_f(shown.submit_per_s)}/s)"
    if shown.delivery_errors:
        text += f", **{shown.delivery_errors} delivery errors**"
    return text


def _verdict(ok: bool | None) -> str:
    return "n/a (peer did not run)" if ok is None else ("met" if ok else "**not met**")


def render(
    when: datetime,
    facts: dict[str, str],
    ours: Ours,
    peers: dict[str, Any] | None,
    command: str,
) -> str:
    peers = peers or {}

    def peer(key: str, name: str) -> float | None:
        result = peers.get(key) or {}
        value = result.get(name)
        return float(value) if value is not None else None

    def rate(key: str, unit: str, name: str = "per_s") -> str:
        """A peer's throughput and, where it says, its submission rate."""
        value = peer(key, name)
        if value is None:
            return "n/a"
        sent = peer(key, "submit_per_s") or peer(key, "enqueue_per_s")
        return f"{_f(value)} {unit}" + (f" (submit {_f(sent)}/s)" if sent else "")

    celery_tp, proc_tp = peer("celery", "per_s"), peer("procrastinate", "per_s")
    proc4, proc_batch = peer("procrastinate_item4", "per_s"), peer("procrastinate_batch", "per_s")
    celery4, celery_group = peer("celery_item4", "per_s"), peer("celery_group", "per_s")
    dbos_wf, dbos_steps = peer("dbos_fanout", "wf_per_s"), peer("dbos_seq", "steps_per_s")
    dbos4 = peer("dbos_item4", "wf_per_s")
    celery_p50, celery_p99 = peer("celery", "lat_p50_ms"), peer("celery", "lat_p99_ms")
    fast = next(iter(ours.latency.values()))
    fast_durable = next(iter(ours.latency_durable.values()))
    seq_ok = None if dbos_steps is None else ours.sequential >= 3 * dbos_steps
    one, four = ours.per_item.get(1), ours.per_item.get(4)
    two_one, two_four = ours.two_per_item.get(1), ours.two_per_item.get(4)
    two_ok = bool(two_one and dbos_wf and two_one.per_s >= 3 * dbos_wf)
    four_ok = None if one is None or four is None else (
        four.delivery_errors == 0 and four.per_s >= one.per_s)
    lines = [
        HEADING,
        "",
        f"Run {when:%Y-%m-%d %H:%M} UTC by `{command}` on revision {facts['revision']}. "
        f"Machine: {facts['machine']}; load average {facts['load_before']} before the run "
        f"and {facts['load_after']} after it (other engineers' tests share the 2 cores, "
        "Postgres and Redis: compare the ratios, which come from one run). "
        f"Ours: {facts['workers']} worker processes (`celery worker -P solo`) and beat, "
        "`DJANGO_DEBUG=0`, default lease/redelivery settings.",
        "",
        "Every row names its shape: **per item** is one client call per task (ours: a "
        "commit creating one task, in a session per client thread; Celery `apply_async`, "
        "Procrastinate `defer`, DBOS `enqueue`), and the figure includes those calls; "
        "**batch** is one call for the whole burst (ours: one commit; Procrastinate "
        "`batch_defer`; Celery `group(...).apply_async()`).",
        "",
        "| workload | shape | ours | Celery + Redis (prefork -c 2, not durable) "
        "| Procrastinate (-c 2) | DBOS | ratio (ours / peer) | target | verdict |",
        "|---|---|---:|---:|---:|---:|---|---|---|",
        f"| {ours.fanout_n:,} one-phase no-op tasks | per item, 1 client thread "
        f"| {_submitted(one)} | {rate('celery', 'tasks/s')} | {rate('procrastinate', 'jobs/s')} "
        f"| - | {_ratio(_per_s(one), proc_tp)} of Procrastinate, "
        f"{_ratio(_per_s(one), celery_tp)} of Celery "
        "| >= 1.0x Procrastinate (stretch: Celery) "
        f"| {_verdict(None if proc_tp is None or one is None else one.per_s >= proc_tp)} |",
        f"| the same | per item, 4 client threads | {_submitted(four)} "
        f"| {rate('celery_item4', 'tasks/s')} | {rate('procrastinate_item4', 'jobs/s')} | - "
        f"| {_ratio(_per_s(four), proc4)} of Procrastinate, "
        f"{_ratio(_per_s(four), celery4)} of Celery "
        f"| no delivery error, >= ours from 1 thread | {_verdict(four_ok)} |",
        f"| the same | batch: one call | {_f(ours.fanout)} tasks/s (one commit) "
        f"| {rate('celery_group', 'tasks/s')} (`group`) "
        f"| {rate('procrastinate_batch', 'jobs/s')} (`batch_defer`) | - "
        f"| {_ratio(ours.fanout, proc_batch)} of Procrastinate, "
        f"{_ratio(ours.fanout, celery_group)} of Celery | >= 2x Procrastinate "
        f"| {_verdict(None if proc_batch is None else ours.fanout >= 2 * proc_batch)} |",
        f"| {ours.two_n:,} tasks x 2 phases | per item, 1 client thread | {_submitted(two_one)} "
        f"| - | - | {rate('dbos_fanout', 'workflows/s', 'wf_per_s')} "
        f"| {_ratio(_per_s(two_one), dbos_wf)} | >= 3x DBOS "
        f"| {_verdict(None if dbos_wf is None or two_one is None else two_ok)} |",
        f"| the same | per item, 4 client threads | {_submitted(two_four)} | - | - "
        f"| {rate('dbos_item4', 'workflows/s', 'wf_per_s')} "
        f"| {_ratio(_per_s(two_four), dbos4)} | - | - |",
        f"| the same | batch: one call | {_f(ours.two)} tasks/s (one commit) | - | - | - "
        "| - | - | - |",
        f"| one task, {ours.sequential_n:,} sequential phases | one task "
        f"| {_f(ours.sequential)} phases/s "
        f"| - | - | {_f(dbos_steps)} steps/s | {_ratio(ours.sequential, dbos_steps)} "
        f"| >= 3x DBOS | {_verdict(seq_ok)} |",
        f"| idle dispatch, commit to phase start, p50 (200 @ 5 ms) | per item, paced "
        f"| {_f(fast.p50, 2)} ms "
        f"| {_f(celery_p50, 2)} ms | {_f(peer('procrastinate', 'lat_p50_ms'), 2)} ms | - "
        f"| {_ratio(fast.p50, celery_p50)} of Celery | <= 2x Celery "
        f"| {_verdict(None if celery_p50 is None else fast.p50 <= 2 * celery_p50)} |",
        f"| the same, p99 | per item, paced | {_f(fast.p99, 2)} ms | {_f(celery_p99, 2)} ms "
        f"| {_f(peer('procrastinate', 'lat_p99_ms'), 2)} ms | - "
        f"| {_ratio(fast.p99, celery_p99)} of Celery | <= 3x Celery "
        f"| {_verdict(None if celery_p99 is None else fast.p99 <= 3 * celery_p99)} |",
        f"| idle dispatch from the durable commit (the counterpart of send-to-start), p50 "
        f"| per item, paced | {_f(fast_durable.p50, 2)} ms | {_f(celery_p50, 2)} ms "
        f"| {_f(peer('procrastinate', 'lat_p50_ms'), 2)} ms | - "
        f"| {_ratio(fast_durable.p50, celery_p50)} of Celery | <= 2x Celery "
        f"| {_verdict(None if celery_p50 is None else fast_durable.p50 <= 2 * celery_p50)} |",
        f"| the same, p99 | per item, paced | {_f(fast_durable.p99, 2)} ms "
        f"| {_f(celery_p99, 2)} ms "
        f"| {_f(peer('procrastinate', 'lat_p99_ms'), 2)} ms | - "
        f"| {_ratio(fast_durable.p99, celery_p99)} of Celery | <= 3x Celery "
        f"| {_verdict(None if celery_p99 is None else fast_durable.p99 <= 3 * celery_p99)} |",
        "",
        *_wait_table(ours),
        "| idle dispatch latency, ours (ms) | measured from | n | p50 | p90 | p99 | max |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for label, stats in ours.latency.items():
        for origin, shown in (("before the commit", stats),
                              ("the durable commit", ours.latency_durable[label])):
            lines.append(
                f"| {label} | {origin} | {shown.count} | {_f(shown.p50, 2)} "
                f"| {_f(shown.p90, 2)} | {_f(shown.p99, 2)} | {_f(shown.max, 2)} |"
            )
    failed = {k: v["error"] for k, v in peers.items() if "error" in v}
    if not peers:
        lines += ["", "Peers not run (`--peers` not given): no ratios."]
    elif failed:
        lines += ["", "Peers that did not run here:"]
        lines += [f"- {key}: {why}" for key, why in failed.items()]
    lines += [
        "",
        "Method: see `benchmarks/fanout.py`. Throughput runs from the first submit (ours: "
        "before the first commit) until every task is terminal (polled every 10 ms); per "
        "item, ours commits one task per commit and each commit delivers its own message "
        "(a producer per client thread), as an API request's does; the submit rate in "
        "brackets is the calls alone. Sequential phases are timed inside the task. Idle "
        "dispatch: one task per "
        "commit, from before the commit to the phase's first line (the strict reading of "
        "\"commit to phase start\"), and from the moment the commit is durable (before its "
        "dispatch is sent: where the peers' send-to-start begins). An idle worker hears of "
        "the task from the commit itself (LISTEN/NOTIFY, "
        "`controlplane/worker/announcements.py`), so it can start before the committing "
        "process has run its first after-commit listener: "
        "such a sample is negative. Peers: the anchors' own "
        "scripts (`../shared/anchors/`) for one client thread, and our driver of the same "
        "peer modules (`benchmarks/_fanout_peers.py`) for 4 threads and the batch calls, "
        "on this run's Postgres and Redis db, with their "
        "defaults (Celery: prefetch 4, acks early; Procrastinate: LISTEN/NOTIFY; DBOS: "
        "queue polling 1 s, unbounded concurrency). Raw peer results: "
        + (json.dumps({k: _brief(v) for k, v in peers.items()}) if peers else "none")
        + ".",
    ]
    return "\n".join(lines) + "\n"


def facts(workers: int) -> dict[str, str]:
    return {
        "revision": code_revision()[0],
        "machine": f"{os.cpu_count()} CPUs",
        "load_before": load_average(),
        "workers": str(workers),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.fanout",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--tasks", type=int, default=5000, help="one-phase burst")
    parser.add_argument("--two-phase", type=int, default=1000, help="two-phase burst")
    parser.add_argument("--sequential", type=int, default=2000, help="phases of one task")
    parser.add_argument("--latency", type=int, default=200, help="tasks at 5 ms gaps")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--peers", action="store_true", help="run the anchors too")
    parser.add_argument("--peer-python", help="python of a venv with the peers")
    parser.add_argument("--anchors", default=str(ANCHORS), help="the anchors' folder")
    parser.add_argument("--logs", help="keep the worker and beat logs in this directory")
    parser.add_argument("--redis-db", type=int, default=DEFAULT_REDIS_DB)
    args, url = parse_arguments(parser, argv, DEFAULT_DATABASE)
    os.environ["KERNEL_TASK_MODULES"] = TASK_MODULE  # this process commits the kind too
    command = "make bench BENCH_ARGS='fanout" + (" -- --peers'" if args.peers else "'")
    info = facts(args.workers)
    when = datetime.now(UTC)
    with reserved_redis_url(db=args.redis_db) as redis_url:
        fresh_database(args, url, redis_url)
        ours = measure_ours(url, redis_url, args)
        peers = measure_peers(url, redis_url, args) if args.peers else None
    info["load_after"] = load_average()
    return publish(HEADING, render(when, info, ours, peers, command), write=not args.no_write)


if __name__ == "__main__":
    raise SystemExit(main())
