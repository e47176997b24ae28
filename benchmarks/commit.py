"""Phase-commit benchmark (issue 2): what one durable step costs on Postgres.

A worker ends every phase with one commit: an entry (the tool result), a document
op (the task's working state) and the fenced transition of its task. That commit is
the unit the whole system pays for, so this module measures

- its latency (p50/p90/p99) through ``SessionHandle.commit`` on ``PostgresStorage``,
  with the lease claim that precedes it timed separately;
- beside it, in the same run and interleaved in blocks so that background noise hits
  both alike, a raw psycopg transaction of four comparable statements: the floor
  that any design writing these records in one transaction has to pay;
- commits/s on one session and on eight concurrent sessions (processes, and threads
  for comparison), with the raw transaction's throughput for reference;
- a profile of the phase commit by round trip, to say where its time goes.

Run it with ``python -m benchmarks.commit`` (or ``make bench``); it writes the
section "Phase commit (issue 2)" of ``docs/benchmarks.md``. The target from the
issue: a phase commit within 3x the raw transaction's latency.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import queue
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import psycopg
from psycopg.types.json import Jsonb

from benchmarks._support import (
    BENCH_DATABASE,
    Stats,
    WaitSampler,
    machine_facts,
    parse_arguments,
    progress,
    publish,
    recreate_database,
    setup_django,
)
from kernel import (
    Draft,
    Finish,
    Kernel,
    Next,
    Outcome,
    Registry,
    Run,
    SessionHandle,
    Storage,
    Task,
    TaskDefinition,
    Transition,
)
from kernel.records import new_id
from kernel.run import Lease

HEADING = "## Phase commit (issue 2)"
TARGET_RATIO = 3.0
TASK_KIND = "bench.step"
DOC_KIND = "bench.progress"
DOC_KEY = "main"
LEASE = timedelta(minutes=30)

Workload = Literal["phase", "raw"]
Mode = Literal["sequential", "threads", "processes"]


# -- the records a phase writes ---------------------------------------------------------


def entry_payload(step: int) -> dict[str, Any]:
    """A tool result of a realistic size (~300 bytes of JSON), the same for both sides."""
    return {
        "tool": "lookup_customer",
        "call_id": f"call-{step}",
        "result": {"customer": f"c-{step % 997:04d}", "status": "ok", "note": "x" * 200},
        "step": step,
    }


def checkpoint(step: int) -> dict[str, Any]:
    return {"step": step, "cursor": f"c-{step}"}


def _never_run(run: Run) -> Transition:
    raise AssertionError("benchmark tasks are committed directly, never run by a worker")


def make_registry() -> Registry:
    """A task kind with two phases and a document kind: all a phase commit validates."""
    registry = Registry()
    registry.document(DOC_KIND)
    registry.add(
        TaskDefinition(
            kind=TASK_KIND, version=1, phases={"a": _never_run, "b": _never_run}, initial="a"
        )
    )
    return registry


@dataclass
class BenchSession:
    """One session with a conversation, a document and a stock of pending tasks."""

    kernel: Kernel
    handle: SessionHandle
    conversation_id: str
    pending: list[str]
    owner: str = field(default_factory=lambda: new_id("bench-worker"))
    step: int = 0
    lease: Lease | None = None
    """The lease on the task being committed, as the worker holds it."""


def new_session(kernel: Kernel, tasks: int, batch: int = 500) -> BenchSession:
    """Create the session and its tasks through ordinary commits (not timed)."""
    handle = kernel.create_session(metadata={"benchmark": "commit"})
    draft = Draft(actor="bench")
    conversation_id = draft.create_conversation()
    draft.set(DOC_KIND, DOC_KEY, ["step"], 0)
    handle.commit(draft)
    pending: list[str] = []
    for start in range(0, tasks, batch):
        draft = Draft(actor="bench")
        pending += [
            draft.create_task(TASK_KIND, {"n": n}) for n in range(start, min(tasks, start + batch))
        ]
        handle.commit(draft)
    pending.reverse()  # claim in creation order
    return BenchSession(kernel, handle, conversation_id, pending)


def claim_next(session: BenchSession) -> tuple[Task, float]:
    """Claim the next pending task as a worker would; returns it and the seconds taken."""
    task_id = session.pending.pop()
    now = datetime.now(UTC)
    started = time.perf_counter()
    task = session.kernel.storage.claim(task_id, session.owner, now, now + LEASE)
    elapsed = time.perf_counter() - started
    if task is None:
        raise RuntimeError(f"benchmark task {task_id} was not claimable")
    return task, elapsed


def phase_writes(session: BenchSession, task: Task, draft: Draft, *,
                 finish: bool = False) -> Transition:
    """The typical phase commit's writes into ``draft``: one entry, one document ``set``;
    and its transition. ``Next(..., keep_lease=True)`` is what ``run.commit()`` and inline
    continuation write; ``finish`` ends the task instead, which also looks for waiters and
    children."""
    session.step += 1
    step = session.step
    draft.append(session.conversation_id, "tool_result", entry_payload(step))
    draft.set(DOC_KIND, DOC_KEY, ["step"], step)
    if finish:
        return Finish(Outcome.SUCCEEDED, {"step": step})
    return Next("b" if task.phase == "a" else "a", checkpoint(step), keep_lease=True)


def commit_phase(session: BenchSession, task: Task, *, finish: bool = False) -> tuple[Task, float]:
    """Commit one phase of ``task`` as a worker does, through its lease (``Lease.commit``):
    a ``Next`` with writes is built from the lease's copies of its task and of the heads of
    the documents it writes (``CommitKind.NEXT_WRITING``, one statement; a fresh lease
    reads the head once before its first write), a ``Finish`` with writes the general way.
    Returns the task as committed and the seconds taken."""
    lease = session.lease
    if lease is None or lease.task.id != task.id:
        definition = session.kernel.registry.latest(task.kind)
        lease = session.lease = Lease(
            kernel=session.kernel, handles=lambda _: session.handle, owner=session.owner,
            duration=LEASE, task=task, definition=definition, input=task.input,
            checkpoint=task.checkpoint, migrated=False)
    transition = phase_writes(session, task, lease.draft, finish=finish)
    started = time.perf_counter()
    written = lease.commit(transition)
    elapsed = time.perf_counter() - started
    return next(t for t in written.updated_tasks if t.id == task.id), elapsed


def commit_general(session: BenchSession, task: Task) -> tuple[Task, float]:
    """The same ``Next`` phase commit sent the general way (``SessionHandle.commit`` with
    no copies: its reads under the session's lock, then its writes), for reference: what a
    lease's commit costs when its copy is stale."""
    draft = Draft(actor=f"task:{task.id}")
    draft.transition(task.id, task.epoch, phase_writes(session, task, draft))
    started = time.perf_counter()
    written = session.handle.commit(draft)
    elapsed = time.perf_counter() - started
    return next(t for t in written.updated_tasks if t.id == task.id), elapsed


# -- the raw comparable transaction ----------------------------------------------------

RAW_TABLES = ("bench_raw_head", "bench_raw_entry", "bench_raw_op", "bench_raw_task")
RAW_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS bench_raw_head (id text PRIMARY KEY, seq bigint NOT NULL)",
    "CREATE TABLE IF NOT EXISTS bench_raw_entry (id text PRIMARY KEY, head_id text NOT NULL, "
    "seq bigint NOT NULL, payload jsonb NOT NULL, created_at timestamptz NOT NULL)",
    "CREATE TABLE IF NOT EXISTS bench_raw_op (id bigserial PRIMARY KEY, head_id text NOT NULL, "
    "seq bigint NOT NULL, ops jsonb NOT NULL)",
    "CREATE TABLE IF NOT EXISTS bench_raw_task (id text PRIMARY KEY, seq bigint NOT NULL, "
    "phase text NOT NULL, checkpoint jsonb NOT NULL)",
)
RAW_STEPS = ("BEGIN + UPDATE head", "INSERT entry", "INSERT op", "UPDATE task", "COMMIT")


def create_raw_tables(url: str) -> None:
    """Create the raw transaction's tables once, before any worker connects."""
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in RAW_SCHEMA:
            conn.execute(statement)


class RawSession:
    """Plain psycopg, one connection, autocommit off: the floor for a 4-statement commit.

    BEGIN; UPDATE a counter row (the session head); INSERT a row with a jsonb payload
    (an entry); INSERT a small jsonb row (a document op); UPDATE a row (the task); COMMIT.
    """

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(url, autocommit=False)
        self.key = new_id("raw")
        self.seq = 0
        self.conn.execute("INSERT INTO bench_raw_head (id, seq) VALUES (%s, 0)", [self.key])
        self.conn.execute(
            "INSERT INTO bench_raw_task (id, seq, phase, checkpoint) VALUES (%s, 0, 'a', %s)",
            [self.key, Jsonb({})],
        )
        self.conn.commit()

    def commit(self) -> list[float]:
        """One transaction; returns the seconds of each of :data:`RAW_STEPS`."""
        self.seq += 1
        seq, key = self.seq, self.key
        marks = [time.perf_counter()]
        with self.conn.cursor() as cur:
            cur.execute("UPDATE bench_raw_head SET seq = %s WHERE id = %s", [seq, key])
            marks.append(time.perf_counter())
            cur.execute(
                "INSERT INTO bench_raw_entry (id, head_id, seq, payload, created_at) "
                "VALUES (%s, %s, %s, %s, now())",
                [new_id("entry"), key, seq, Jsonb(entry_payload(seq))],
            )
            marks.append(time.perf_counter())
            cur.execute(
                "INSERT INTO bench_raw_op (head_id, seq, ops) VALUES (%s, %s, %s)",
                [key, seq, Jsonb([{"op": "set", "path": ["step"], "value": seq}])],
            )
            marks.append(time.perf_counter())
            cur.execute(
                "UPDATE bench_raw_task SET seq = %s, phase = %s, checkpoint = %s WHERE id = %s",
                [seq, "b" if seq % 2 else "a", Jsonb(checkpoint(seq)), key],
            )
            marks.append(time.perf_counter())
        self.conn.commit()
        marks.append(time.perf_counter())
        return [b - a for a, b in zip(marks, marks[1:], strict=False)]

    def close(self) -> None:
        self.conn.close()


# -- latency -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Latency:
    """Latencies of the same run: phase commits, claims and the raw transaction."""

    phase: Stats
    finish: Stats
    general: Stats
    claim: Stats
    raw: Stats
    raw_steps: dict[str, float]

    @property
    def ratio_p50(self) -> float:
        return self.phase.p50 / self.raw.p50

    @property
    def ratio_p99(self) -> float:
        return self.phase.p99 / self.raw.p99

    @property
    def target_met(self) -> bool:
        return self.ratio_p50 <= TARGET_RATIO


def measure_latency(
    storage: Storage, url: str, *, warmup: int, count: int, block: int = 100
) -> Latency:
    """Time ``count`` phase commits of each kind and ``count`` raw transactions.

    The three are interleaved in blocks of ``block`` so that whatever else the
    server is doing meanwhile affects them alike; ``warmup`` rounds of each come
    first (connections, caches, prepared plans) and are not counted. Each phase
    commit is preceded by a claim of a fresh task, timed on its own.
    """
    kernel = Kernel(storage, make_registry())
    progress(f"latency: creating 3 sessions with {warmup + count} tasks each")
    next_session = new_session(kernel, warmup + count)
    finish_session = new_session(kernel, warmup + count)
    general_session = new_session(kernel, warmup + count)
    create_raw_tables(url)
    raw = RawSession(url)
    samples: dict[str, list[float]] = defaultdict(list)
    raw_steps = [0.0] * len(RAW_STEPS)

    def rounds(n: int, keep: bool) -> None:
        for name, session, finish in (
            ("phase", next_session, False),
            ("finish", finish_session, True),
        ):
            for _ in range(n):
                task, claimed = claim_next(session)
                _, committed = commit_phase(session, task, finish=finish)
                if keep:
                    samples["claim"].append(claimed)
                    samples[name].append(committed)
        for _ in range(n):
            _, committed = commit_general(general_session, claim_next(general_session)[0])
            if keep:
                samples["general"].append(committed)
        for _ in range(n):
            steps = raw.commit()
            if keep:
                samples["raw"].append(sum(steps))
                for i, seconds in enumerate(steps):
                    raw_steps[i] += seconds

    try:
        progress(f"latency: warm-up, {warmup} of each")
        rounds(warmup, keep=False)
        progress(f"latency: {count} phase commits, {count} finishing ones, {count} general "
                 f"ones, {count} raw")
        done = 0
        while done < count:
            n = min(block, count - done)
            rounds(n, keep=True)
            done += n
    finally:
        raw.close()
    return Latency(
        phase=Stats.of(samples["phase"]),
        finish=Stats.of(samples["finish"]),
        general=Stats.of(samples["general"]),
        claim=Stats.of(samples["claim"]),
        raw=Stats.of(samples["raw"]),
        raw_steps={
            name: total * 1000.0 / count for name, total in zip(RAW_STEPS, raw_steps, strict=True)
        },
    )


# -- profile ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cost:
    """One kind of step of a commit: how often per commit, and its mean time."""

    label: str
    per_commit: float
    mean_ms: float

    @property
    def ms_per_commit(self) -> float:
        return self.per_commit * self.mean_ms


@dataclass(frozen=True)
class Profile:
    commits: int
    total_ms: float
    statements_per_commit: float
    costs: list[Cost]


READS = "the general commit's first round trip: BEGIN + session head + reads (pipelined)"
WRITES = "the write: one statement (the general commit's: writes + COMMIT, pipelined)"
PYTHON = "Python (builder, adapter), and a fresh lease's read of the document's head"


def profile_phase_commit(storage: Storage, *, count: int) -> Profile:
    """Time the parts of ``count`` phase commits (not the timed run).

    A lease's phase commit is one statement (:func:`commit_phase`); the general commit,
    which a stale copy sends it to, is two pipelined round trips: BEGIN and the reads
    (with the session's head, which orders commits), and the writes with COMMIT.
    Statements inside a pipeline return as soon as they are queued, so timing them one by
    one would say nothing; each round trip is timed whole, statements are only counted,
    and what is left of a commit's time is Python (with the read of the document's head
    that a fresh lease makes before its first write).
    """
    from django.db import connections

    from controlplane import storage as postgres

    if not isinstance(storage, postgres.PostgresStorage):
        raise TypeError("the commit profile times PostgresStorage's round trips")
    connection = connections[storage.using]
    kernel = Kernel(storage, make_registry())
    session = new_session(kernel, count + 20)
    for _ in range(20):  # warm this session's rows and prepared statements
        commit_phase(session, claim_next(session)[0])
    calls: dict[str, list[float]] = defaultdict(list)
    labels = {postgres.READS: READS, postgres.WRITES: WRITES}
    statements = 0

    def observe(stage: str, seconds: float) -> None:
        calls[labels[stage]].append(seconds)

    def counter(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        nonlocal statements
        statements += 1
        return execute(sql, params, many, context)

    total = 0.0
    with storage.observing(observe):
        for _ in range(count):
            task, _ = claim_next(session)
            with connection.execute_wrapper(counter):
                _, elapsed = commit_phase(session, task)
            total += elapsed
    costs = [
        Cost(label, len(seconds) / count, sum(seconds) * 1000.0 / len(seconds))
        for label, seconds in calls.items()
    ]
    total_ms = total * 1000.0 / count
    python_ms = total_ms - sum(c.ms_per_commit for c in costs)
    costs.append(Cost(PYTHON, 1.0, python_ms))
    return Profile(count, total_ms, statements / count, costs)


@dataclass(frozen=True)
class Cpu:
    """CPU milliseconds per commit: in this process, and in the server backend serving it.

    Latency alone cannot tell waiting from working; on a small machine the CPU a commit
    burns on both sides is what caps throughput across sessions.
    """

    commits: int
    client_ms: float
    server_ms: float | None


LOCAL_HOSTS = ("", "localhost", "127.0.0.1", "::1")


def backend_cpu_seconds(pid: int, host: str) -> float | None:
    """CPU seconds a server backend has used, from ``/proc``: only for a local server."""
    if host not in LOCAL_HOSTS and not host.startswith("/"):
        return None
    try:
        with open(f"/proc/{pid}/comm") as comm:
            if not comm.read().startswith("postgres"):
                return None
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpu(count: int, pid: int, host: str, step: Callable[[], Any]) -> Cpu:
    server_before = backend_cpu_seconds(pid, host)
    client_before = time.process_time()
    for _ in range(count):
        step()
    client = time.process_time() - client_before
    server_after = backend_cpu_seconds(pid, host)
    server = (
        None
        if server_before is None or server_after is None
        else (server_after - server_before) * 1000.0 / count
    )
    return Cpu(count, client * 1000.0 / count, server)


def measure_cpu(storage: Storage, url: str, *, count: int) -> dict[Workload, Cpu]:
    """CPU per commit of back-to-back phase commits and raw transactions (not timed)."""
    from django.db import connections

    connection = connections[getattr(storage, "using", "default")]
    session = new_session(Kernel(storage, make_registry()), 1)
    task = claim_next(session)[0]

    def commit_next() -> None:
        nonlocal task
        task = commit_phase(session, task)[0]

    for _ in range(20):
        commit_next()
    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        pid = cur.fetchone()[0]
    result: dict[Workload, Cpu] = {
        "phase": _cpu(count, pid, connection.connection.info.host, commit_next)
    }
    raw = RawSession(url)
    try:
        pid = raw.conn.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
        raw.conn.commit()
        for _ in range(20):
            raw.commit()
        result["raw"] = _cpu(count, pid, raw.conn.info.host, raw.commit)
    finally:
        raw.close()
    return result


# -- throughput -----------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerResult:
    commits: int
    started: float
    ended: float
    samples: list[float]
    client_cpu: float | None = None
    """CPU seconds of this worker's process in the timed window (``None`` for a thread:
    its process's counter is shared)."""
    server_cpu: float | None = None
    """CPU seconds of its server backend in the timed window (``None`` for a remote server)."""


@dataclass(frozen=True)
class Throughput:
    workload: Workload
    sessions: int
    mode: Mode
    commits: int
    seconds: float
    latency: Stats
    client_ms: float | None = None
    """Client CPU per commit in the timed window (processes and sequential only)."""
    server_ms: float | None = None
    """Server backend CPU per commit in the timed window (a local server only)."""
    waits: dict[str, float] = field(default_factory=dict)
    """Where the sessions' backends were, sampled: state and wait event -> average number
    of backends in it; the server's own processes' waits (WAL writer, checkpointer) too."""

    @property
    def per_second(self) -> float:
        return self.commits / self.seconds


def _worker(
    workload: Workload,
    url: str,
    seconds: float,
    ready: Callable[[], None],
    go: Callable[[], float],
    own_process: bool = True,
) -> WorkerResult:
    """One session committing back to back from the common start for ``seconds``.

    A phase worker claims one task and then commits ``Next(keep_lease=True)`` phases
    of it, as a worker continuing a task inline does; a raw worker runs the raw
    transaction on its own rows. Each uses its own connection and closes it.
    """
    step: Callable[[], Any]
    raw: RawSession | None = None
    host = str(psycopg.conninfo.conninfo_to_dict(url).get("host") or "")
    try:
        if workload == "phase":
            from django.db import connection

            from controlplane.storage import PostgresStorage

            session = new_session(Kernel(PostgresStorage(), make_registry()), 1)
            task = claim_next(session)[0]
            with connection.cursor() as cur:
                cur.execute("SELECT pg_backend_pid()")
                backend = int(cur.fetchone()[0])

            def commit_next() -> None:
                nonlocal task
                task = commit_phase(session, task)[0]

            step = commit_next
        else:
            raw = RawSession(url)
            backend = raw.conn.info.backend_pid
            step = raw.commit
        ready()
        started = go()
        while time.monotonic() < started:
            time.sleep(0.001)
        deadline = started + seconds
        samples: list[float] = []
        client_before = time.process_time()
        server_before = backend_cpu_seconds(backend, host)
        while True:
            before = time.perf_counter()
            step()
            samples.append(time.perf_counter() - before)
            if time.monotonic() >= deadline:
                break
        client = time.process_time() - client_before if own_process else None
        server_after = backend_cpu_seconds(backend, host)
        server = (None if server_before is None or server_after is None
                  else server_after - server_before)
        return WorkerResult(len(samples), started, time.monotonic(), samples, client, server)
    finally:
        if raw is not None:
            raw.close()
        if workload == "phase":
            from django.db import connection

            connection.close()


def _process_main(
    workload: Workload,
    url: str,
    seconds: float,
    ready: Any,
    go: Any,
    start: Any,
    results: Any,
) -> None:
    """Entry point of a spawned worker process: its own interpreter, Django and connection."""
    try:
        if workload == "phase":
            setup_django(url, migrate=False)

        def wait_go() -> float:
            go.wait()
            return float(start.value)

        results.put(_worker(workload, url, seconds, lambda: ready.put(os.getpid()), wait_go))
    except BaseException as exc:
        message = f"worker {os.getpid()}: {type(exc).__name__}: {exc}"
        ready.put(message)
        results.put(message)
        raise


def _thread_main(
    workload: Workload,
    url: str,
    seconds: float,
    ready: queue.Queue[Any],
    go: threading.Event,
    start: list[float],
    results: queue.Queue[Any],
) -> None:
    """A worker thread: Django gives each thread its own connection, closed at its end."""
    try:

        def wait_go() -> float:
            go.wait()
            return start[0]

        results.put(_worker(workload, url, seconds, lambda: ready.put("ready"), wait_go,
                            own_process=False))
    except BaseException as exc:
        message = f"worker thread: {type(exc).__name__}: {exc}"
        ready.put(message)
        results.put(message)


def measure_throughput(
    url: str, *, workload: Workload, sessions: int, seconds: float, mode: Mode
) -> Throughput:
    """Commits/s of ``sessions`` sessions committing concurrently for ``seconds``.

    ``processes`` is the honest figure for a deployment (Celery's prefork workers are
    processes: no shared GIL); ``threads`` shows what one process gets;
    ``sequential`` is one session in the calling thread. Set-up (imports, Django,
    fixtures) happens before the common start and is not counted.
    """
    if workload == "raw":
        create_raw_tables(url)
    sampler = WaitSampler(url)
    with sampler:
        if mode == "sequential":
            if sessions != 1:
                raise ValueError("sequential mode runs exactly one session")
            results = [_worker(workload, url, seconds, lambda: None, time.monotonic)]
        else:
            results = _run_concurrently(url, workload, sessions, seconds, mode)
    started = min(r.started for r in results)
    ended = max(r.ended for r in results)
    commits = sum(r.commits for r in results)

    def per_commit(values: list[float | None]) -> float | None:
        return None if None in values else sum(v for v in values if v) * 1000.0 / commits

    return Throughput(
        workload=workload,
        sessions=sessions,
        mode=mode,
        commits=commits,
        seconds=ended - started,
        latency=Stats.of([s for r in results for s in r.samples]),
        client_ms=per_commit([r.client_cpu for r in results]),
        server_ms=per_commit([r.server_cpu for r in results]),
        waits=sampler.averages(started, ended),  # the timed window, not the set-up
    )


def _run_concurrently(
    url: str, workload: Workload, sessions: int, seconds: float, mode: Mode
) -> list[WorkerResult]:
    ready: Any
    results: Any
    go: Any
    if mode == "processes":
        ctx = multiprocessing.get_context("spawn")
        ready, results, go, start = ctx.Queue(), ctx.Queue(), ctx.Event(), ctx.Value("d", 0.0)
        workers: list[Any] = [
            ctx.Process(
                target=_process_main,
                args=(workload, url, seconds, ready, go, start, results),
                daemon=True,
            )
            for _ in range(sessions)
        ]
    else:
        ready, results, go, box = queue.Queue(), queue.Queue(), threading.Event(), [0.0]
        workers = [
            threading.Thread(
                target=_thread_main,
                args=(workload, url, seconds, ready, go, box, results),
                daemon=True,
            )
            for _ in range(sessions)
        ]
    for worker in workers:
        worker.start()
    try:
        for _ in workers:
            signal = ready.get(timeout=180)
            if isinstance(signal, str) and signal != "ready":
                raise RuntimeError(signal)
        begin = time.monotonic() + 0.05
        if mode == "processes":
            start.value = begin
        else:
            box[0] = begin
        go.set()
        collected = [results.get(timeout=seconds + 120) for _ in workers]
    finally:
        go.set()  # never leave a worker waiting for a start that will not come
        for worker in workers:
            worker.join(timeout=30)
    failures = [r for r in collected if not isinstance(r, WorkerResult)]
    if failures:
        raise RuntimeError("; ".join(map(str, failures)))
    return collected


# -- the whole run and its report ----------------------------------------------------------


@dataclass(frozen=True)
class Result:
    when: datetime
    facts: dict[str, str]
    latency: Latency
    profile: Profile
    cpu: dict[Workload, Cpu]
    throughput: list[Throughput]


def _row(name: str, s: Stats) -> str:
    return (
        f"| {name} | {s.count} | {s.p50:.2f} | {s.p90:.2f} | {s.p99:.2f} | {s.mean:.2f} "
        f"| {s.max:.1f} |"
    )


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _wait_tables(runs: list[Throughput], names: dict[str, str], top: int = 8) -> list[str]:
    """The sampled waits of the concurrent process rows, side by side."""
    shown = [t for t in runs if t.mode == "processes" and t.waits]
    if not shown:
        return []
    keys: list[str] = []
    for t in shown:
        keys += [k for k in list(t.waits)[:top] if k not in keys]
    lines = [
        "",
        "Where the concurrent sessions' backends were, sampled from `pg_stat_activity` every "
        "5 ms during the rows above (average number of backends in each state; "
        "`active, Client: ClientRead` is a backend in a pipelined transaction waiting for "
        "its client's next statement; `[walwriter]` and the like are the server's own "
        "processes):",
        "",
        "| state, wait event | " + " | ".join(
            f"{names[t.workload]}, {t.sessions} {t.mode}" for t in shown) + " |",
        "|---|" + "---:|" * len(shown),
    ]
    for key in keys:
        lines.append(f"| {key} | " + " | ".join(
            f"{t.waits.get(key, 0.0):.2f}" for t in shown) + " |")
    return lines


def render(result: Result) -> str:
    """The markdown section for ``docs/benchmarks.md``."""
    lat, prof, facts = result.latency, result.profile, result.facts
    verdict = "met" if lat.target_met else "**not met**"
    lines = [
        HEADING,
        "",
        f"Run {result.when:%Y-%m-%d %H:%M} UTC by `make bench` (`python -m benchmarks.commit`). "
        f"Machine: {facts['nproc']} CPUs ({facts['cpu']}); PostgreSQL {facts['version']} on "
        f"the same host, `fsync={facts['fsync']}`, "
        f"`synchronous_commit={facts['synchronous_commit']}`, "
        f"`wal_sync_method={facts['wal_sync_method']}`, "
        f"`shared_buffers={facts['shared_buffers']}`; Python {facts['python']}, "
        f"psycopg {facts['psycopg']}, Django {facts['django']} "
        f"(`DEBUG` off unless `DJANGO_DEBUG` says so: `{facts['django_debug'] or 'unset'}`). "
        f"Load average (1 min) at start / end: {facts['load_start']} / "
        f"{facts.get('load_end', '?')}: other work on the machine inflates latencies and "
        "caps throughput.",
        "",
        "Method: a phase commit is what a worker's lease commits when a phase ends "
        "(`Lease.commit` on `PostgresStorage`): a draft with one `append` entry (~300 B "
        "JSON), one document `set` and one fenced transition (`Next(..., keep_lease=True)`, "
        "or `Finish` in the second row), each on a task freshly claimed with "
        "`storage.claim` (timed separately). A `Next` with writes is one statement, built "
        "from the lease's copies of its task and of the document's head (read once by a "
        "fresh lease, before its first write: `CommitKind.NEXT_WRITING`); a `Finish` with "
        "writes, and the third row's `Next` sent without the lease's copies "
        "(`SessionHandle.commit`), take the general commit: reads under the session's lock, "
        "then the writes. The throughput rows commit `Next` phases of one claimed task "
        "back to back, as a worker continuing a task inline does. The raw transaction is "
        "plain psycopg on one connection: BEGIN; UPDATE a counter row; INSERT a jsonb row "
        "(the same payload); INSERT a small jsonb row; UPDATE a row; COMMIT. Both run in "
        "the same process against the same server, interleaved in blocks of 100 after a "
        "warm-up, in the dedicated database `durable_bench` (recreated for the run). "
        "Percentiles are nearest-rank, in milliseconds.",
        "",
        "| latency (ms) | n | p50 | p90 | p99 | mean | max |",
        "|---|---:|---:|---:|---:|---:|---:|",
        _row("phase commit: entry + doc set + `Next` (keep lease)", lat.phase),
        _row("phase commit: entry + doc set + `Finish`", lat.finish),
        _row("the same `Next`, the general way (no lease's copies)", lat.general),
        _row("claim (one `UPDATE ... RETURNING`, autocommit)", lat.claim),
        _row("raw psycopg 4-statement transaction", lat.raw),
        "",
        f"Phase commit / raw transaction: **{lat.ratio_p50:.2f}x at p50**, "
        f"{lat.ratio_p99:.2f}x at p99 (`Finish`: {lat.finish.p50 / lat.raw.p50:.2f}x at p50). "
        f"Target (within {TARGET_RATIO:g}x at p50): {verdict}.",
        "",
        "| throughput | sessions | how | commits | s | commits/s | p50 ms | p99 ms "
        "| client CPU ms/commit | server CPU ms/commit |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    names = {"phase": "phase commit (`Next`, keep lease)", "raw": "raw 4-statement transaction"}
    for t in result.throughput:
        lines.append(
            f"| {names[t.workload]} | {t.sessions} | {t.mode} | {t.commits} | {t.seconds:.1f} "
            f"| {t.per_second:.0f} | {t.latency.p50:.2f} | {t.latency.p99:.2f} "
            f"| {_ms(t.client_ms)} | {_ms(t.server_ms)} |"
        )
    lines += _wait_tables(result.throughput, names)
    lines += [
        "",
        "Concurrent sessions each commit to their own session (no shared row locks); "
        "`processes` are spawned interpreters, as Celery's prefork workers are; `threads` "
        "share one interpreter and its GIL.",
        "",
        f"Where a phase commit's time goes ({prof.commits} profiled `Next` commits, "
        f"{prof.total_ms:.2f} ms mean with instrumentation; "
        f"{prof.statements_per_commit:.1f} statements per commit, BEGIN and COMMIT "
        "included, the head's read too):",
        "",
        "| step | per commit | mean ms | ms per commit |",
        "|---|---:|---:|---:|",
    ]
    for cost in sorted(prof.costs, key=lambda c: -c.ms_per_commit):
        lines.append(
            f"| {cost.label} | {cost.per_commit:.2f} | {cost.mean_ms:.3f} "
            f"| {cost.ms_per_commit:.3f} |"
        )
    raw_total = sum(lat.raw_steps.values())
    steps = ", ".join(f"{name} {ms:.3f}" for name, ms in lat.raw_steps.items())
    lines += ["", f"The raw transaction, by step (ms, mean {raw_total:.2f}): {steps}.", ""]
    lines += [
        "| CPU per commit (ms) | commits | this process | server backend |",
        "|---|---:|---:|---:|",
    ]
    for workload, cpu in result.cpu.items():
        server = "n/a" if cpu.server_ms is None else f"{cpu.server_ms:.2f}"
        lines.append(f"| {names[workload]} | {cpu.commits} | {cpu.client_ms:.2f} | {server} |")
    lines += [
        "",
        "CPU is read from the kernel's counters (`/proc`, server backend only when the "
        "server runs on this host); it is what caps commits/s once sessions outnumber cores.",
        "",
    ]
    return "\n".join(lines)


def run(
    url: str, *, warmup: int, count: int, seconds: float, sessions: int, profile: int
) -> Result:
    """Every measurement of this module against the database at ``url`` (Django set up)."""
    from controlplane.storage import PostgresStorage

    storage = PostgresStorage()
    facts = machine_facts(url)
    when = datetime.now(UTC)
    latency = measure_latency(storage, url, warmup=warmup, count=count)
    progress(
        f"latency: phase p50 {latency.phase.p50:.2f} ms, raw p50 {latency.raw.p50:.2f} ms "
        f"({latency.ratio_p50:.2f}x)"
    )
    progress(f"profile: {profile} instrumented phase commits")
    prof = profile_phase_commit(storage, count=profile)
    progress(f"cpu: {profile} phase commits and {profile} raw transactions")
    cpu = measure_cpu(storage, url, count=profile)
    plan: list[tuple[Workload, int, Mode]] = [
        ("phase", 1, "sequential"),
        ("phase", sessions, "processes"),
        ("phase", sessions, "threads"),
        ("raw", 1, "sequential"),
        ("raw", sessions, "processes"),
    ]
    throughput = []
    for workload, n, mode in plan:
        progress(f"throughput: {workload}, {n} session(s), {mode}, {seconds:g} s")
        result = measure_throughput(url, workload=workload, sessions=n, seconds=seconds, mode=mode)
        progress(f"throughput: {result.per_second:.0f} commits/s")
        throughput.append(result)
    facts["load_end"] = f"{os.getloadavg()[0]:.2f}"
    return Result(when, facts, latency, prof, cpu, throughput)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.commit", description=__doc__)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--count", type=int, default=2000, help="measured commits per kind")
    parser.add_argument("--seconds", type=float, default=5.0, help="per throughput stage")
    parser.add_argument("--sessions", type=int, default=8, help="concurrent sessions")
    parser.add_argument("--profile", type=int, default=300, help="instrumented commits")
    args, url = parse_arguments(parser, argv, BENCH_DATABASE)
    progress(f"database {args.database}: recreating and migrating")
    recreate_database(url)
    setup_django(url, migrate=True)
    result = run(
        url,
        warmup=args.warmup,
        count=args.count,
        seconds=args.seconds,
        sessions=args.sessions,
        profile=args.profile,
    )
    section = render(result)
    return publish(HEADING, section, write=not args.no_write)


if __name__ == "__main__":
    raise SystemExit(main())
