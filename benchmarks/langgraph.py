"""LangGraph checkpoint saver benchmark: the Session Store saver beside LangGraph's own
``PostgresSaver`` (``langgraph-checkpoint-postgres``), on the same Postgres server in the
same run.

- ``put``, ``put_writes`` and ``get_tuple`` latency (p50/p99), each saver on its own
  database, one thread's steps in a row (a checkpoint, a task's two writes against it,
  a read of the newest checkpoint), measured in alternating blocks so that the
  machine's background load falls on both alike;
- a 50-step graph (50 nodes in a row, each appending to a list) run with no checkpointer
  and with each saver (``durability="sync"``, what a hosted run uses): the checkpoint
  overhead per step is the difference, per step;
- the floor (:class:`KernelCommits`): the very drafts the saver commits, committed
  through the kernel with nothing of the saver around them, in the same blocks: how much
  of each operation is the kernel's commit, and how much the saver's own work.

The Session Store saver commits every write through the kernel (one commit in the
thread's session, with its document versions and its commit log row); ``PostgresSaver``
upserts its own three tables. Run it with ``make bench BENCH_ARGS=langgraph``; it writes
the section "LangGraph saver" of ``docs/benchmarks.md``. The target: no slower than
``PostgresSaver`` at p50.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypedDict, cast

import psycopg

from benchmarks._support import (
    BENCH_DATABASE,
    Stats,
    database_url,
    machine_state,
    parse_arguments,
    progress,
    publish,
    recreate_database,
    server_facts,
    setup_django,
)

HEADING = "## LangGraph saver (issue 23)"
DATABASE = f"{BENCH_DATABASE}_langgraph"
PEER_DATABASE = f"{BENCH_DATABASE}_langgraph_pg"
OPERATIONS = ("put", "put_writes", "get_tuple")
FLOOR = "kernel_commit"
"""The row of :class:`KernelCommits`: the saver's commits alone."""
STEPS = 50
KEPT = 10
"""Checkpoints per thread the prune at the end keeps (what is left is counted)."""


def payload(step: int) -> dict[str, Any]:
    """A checkpoint's channel values of a realistic size: a conversation of a few short
    messages (~600 bytes serialized), and a counter."""
    return {"messages": [f"message {n}: " + "x" * 80 for n in range(max(1, step % 6))],
            "step": step}


class Thread:
    """One saver writing one thread: what ``put`` and ``put_writes`` are given, as a
    graph's loop gives them (each checkpoint the child of the last)."""

    def __init__(self, saver: Any, thread_id: str) -> None:
        self.saver = saver
        self.config: dict[str, Any] = {"configurable": {"thread_id": thread_id,
                                                        "checkpoint_ns": ""}}
        self.step = 0

    def put(self) -> None:
        from langgraph.checkpoint.conformance.test_utils import (
            generate_checkpoint,
            generate_metadata,
        )

        self.step += 1
        values = payload(self.step)
        versions: dict[str, str | int | float] = {channel: self.step for channel in values}
        checkpoint = generate_checkpoint(channel_values=values, channel_versions=versions)
        self.config = self.saver.put(self.config, checkpoint,
                                     generate_metadata(step=self.step), versions)

    def put_writes(self) -> None:
        # A task of this step saves its two writes: new rows, as in a graph's loop.
        self.saver.put_writes(self.config, [("messages", f"reply {self.step}"),
                                            ("step", self.step)], f"task-{self.step}")

    def get_tuple(self) -> None:
        found = self.saver.get_tuple({"configurable": {"thread_id":
                                                       self.config["configurable"]["thread_id"]}})
        assert found is not None

    def timed_part(self, op: str) -> Callable[[], None]:
        """What to time of ``op``: all of it."""
        return cast(Callable[[], None], getattr(self, op))


class KernelCommits:
    """The Session Store saver's own commits without the saver around them: the floor of
    its ``put`` and ``put_writes``. Each step's draft is built by a saver that keeps it
    instead of committing it (not timed); then that draft is committed through the
    kernel on the calling thread (timed): no LangGraph translation, no serializing, no
    hop to the saver's thread. ``get_tuple``'s floor is its one read, not deserialized."""

    def __init__(self, kernel: Any, thread_id: str) -> None:
        from kernel.hosts.langgraph import SessionStoreSaver

        drafts: list[Any] = []

        class Keeping(SessionStoreSaver):
            def _commit(self, thread_id: str, draft: Any, progress: Any = None) -> int:
                drafts.append(draft)
                return 0

        self.kernel, self.thread_id, self.drafts = kernel, thread_id, drafts
        self.builder = Thread(Keeping(kernel), thread_id)
        self.handle = kernel.create_session(thread_id)

    def close(self) -> None:
        self.builder.saver.close()

    def timed_part(self, op: str) -> Callable[[], None]:
        from kernel.hosts.langgraph.layout import CHECKPOINT, checkpoint_key

        if op == "get_tuple":
            return lambda: self.kernel.newest_document(self.thread_id, CHECKPOINT,
                                                       checkpoint_key("", ""))
        getattr(self.builder, op)()
        draft = self.drafts.pop()
        assert not self.drafts
        return lambda: self.handle.commit(draft)

    # Warming up runs each operation whole.
    def put(self) -> None:
        self.timed_part("put")()

    def put_writes(self) -> None:
        self.timed_part("put_writes")()

    def get_tuple(self) -> None:
        self.timed_part("get_tuple")()


def timed(action: Callable[[], None], count: int) -> list[float]:
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        action()
        samples.append(time.perf_counter() - started)
    return samples


class Counting(TypedDict):
    log: list[int]


def chain(steps: int) -> Any:
    """``steps`` nodes in a row, each adding its number to ``log``."""
    from langgraph.graph import END, START, StateGraph

    builder = StateGraph(Counting)
    previous = START
    for n in range(steps):
        def step(state: Counting, n: int = n) -> dict[str, Any]:
            return {"log": [*state["log"], n]}

        builder.add_node(f"s{n}", step)
        builder.add_edge(previous, f"s{n}")
        previous = f"s{n}"
    builder.add_edge(previous, END)
    return builder


def graph_seconds(builder: Any, saver: Any, thread_id: str) -> float:
    graph = builder.compile(checkpointer=saver)
    config = {"configurable": {"thread_id": thread_id}, "recursion_limit": STEPS + 10}
    started = time.perf_counter()
    # LangGraph refuses durability without a checkpointer.
    options = {} if saver is None else {"durability": "sync"}
    result = graph.invoke({"log": []}, config, **options)
    seconds = time.perf_counter() - started
    assert result["log"] == list(range(STEPS))
    return seconds


@dataclass
class Result:
    latency: dict[str, dict[str, Stats]]
    """saver (and :data:`FLOOR`) -> operation -> latency."""
    graph: dict[str, Stats]
    """saver (and ``none``) -> one 50-step run's seconds (as milliseconds)."""
    facts: dict[str, str]
    rows: dict[str, int]
    """What the Session Store saver's puts (and the floor's commits) left in the kernel's
    tables."""
    pruned_rows: dict[str, int]
    """What is left after a prune of its threads keeping the newest :data:`KEPT` each."""
    statements: dict[str, dict[str, float]]
    """saver -> operation -> SQL statements sent per call (pipelined ones included)."""
    count: int
    blocks: int
    runs: int
    load: tuple[float, float, float]


def savers(peer_url: str) -> tuple[dict[str, Any], Callable[[], None]]:
    from langgraph.checkpoint.postgres import PostgresSaver

    from controlplane.worker.runtime import runtime
    from kernel.hosts.langgraph import SessionStoreSaver

    ours = SessionStoreSaver(runtime().kernel)
    peer_context = PostgresSaver.from_conn_string(peer_url)
    peer = peer_context.__enter__()
    peer.setup()

    def close() -> None:
        ours.close()
        peer_context.__exit__(None, None, None)

    return {"session_store": ours, "postgres_saver": peer}, close


def run(peer_url: str, *, count: int, blocks: int, runs: int) -> Result:
    from controlplane.worker.runtime import runtime

    found, close = savers(peer_url)
    floor = KernelCommits(runtime().kernel, "bench-kernel_commit")
    try:
        threads: dict[str, Thread | KernelCommits] = {
            name: Thread(saver, f"bench-{name}") for name, saver in found.items()}
        threads[FLOOR] = floor
        progress("warming up")
        for thread in threads.values():
            for _ in range(20):
                thread.put()
                thread.put_writes()
                thread.get_tuple()
        samples: dict[str, dict[str, list[float]]] = {
            name: {op: [] for op in OPERATIONS} for name in threads}
        per_block = max(1, count // blocks)
        for block in range(blocks):
            order = list(threads.items()) if block % 2 == 0 else list(threads.items())[::-1]
            for name, thread in order:
                for _ in range(per_block):  # a graph's step: a checkpoint, its writes, a read
                    for op in OPERATIONS:
                        samples[name][op] += timed(thread.timed_part(op), 1)
            progress(f"block {block + 1}/{blocks}")
        statements = {name: statements_per_call(thread) for name, thread in threads.items()
                      if isinstance(thread, Thread)}
        builder = chain(STEPS)
        graph: dict[str, list[float]] = {"none": [], **{name: [] for name in found}}
        for n in range(runs):
            graph["none"].append(graph_seconds(builder, None, f"g{n}"))
            for name, saver in (found.items() if n % 2 == 0 else list(found.items())[::-1]):
                graph[name].append(graph_seconds(builder, saver, f"graph-{name}-{n}"))
        progress(f"{runs} runs of the {STEPS}-step graph each")
        rows = table_rows()
        from kernel.hosts.langgraph import KeepLatest

        found["session_store"].prune_by(
            ["bench-session_store", floor.thread_id,
             *(f"graph-session_store-{n}" for n in range(runs))],
            KeepLatest(KEPT))
        pruned_rows = table_rows()
    finally:
        floor.close()
        close()
    with psycopg.connect(peer_url) as conn:
        facts = server_facts(conn)
    return Result(
        {name: {op: Stats.of(s) for op, s in ops.items()} for name, ops in samples.items()},
        {name: Stats.of(s) for name, s in graph.items()}, facts, rows, pruned_rows, statements,
        per_block * blocks, blocks, runs, os.getloadavg(),
    )


def statements_per_call(thread: Thread, calls: int = 50) -> dict[str, float]:
    """How many statements each operation sends to the server (psycopg's ``execute`` and
    ``executemany`` calls, on any thread: the savers run one at a time)."""
    from psycopg import Cursor

    sent = [0]
    originals = {name: getattr(Cursor, name) for name in ("execute", "executemany")}

    def counting(name: str) -> Any:
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            sent[0] += 1
            return originals[name](self, *args, **kwargs)
        return call

    found = {}
    try:
        for name in originals:
            setattr(Cursor, name, counting(name))
        for op in OPERATIONS:
            sent[0] = 0
            for _ in range(calls):
                getattr(thread, op)()
            found[op] = sent[0] / calls
    finally:
        for name, original in originals.items():
            setattr(Cursor, name, original)
    return found


def table_rows() -> dict[str, int]:
    from django.db import connection

    found = {}
    with connection.cursor() as cursor:
        for table in ("kernel_commit", "kernel_document", "kernel_document_version"):
            cursor.execute(f"SELECT count(*) FROM {table}")  # noqa: S608 - our own names
            found[table] = int(cursor.fetchone()[0])
    return found


def render(result: Result) -> str:
    ours, peer = result.latency["session_store"], result.latency["postgres_saver"]
    lines = [
        HEADING, "",
        f"`make bench BENCH_ARGS=langgraph`: {result.count} of each operation per saver, "
        f"in {result.blocks} alternating blocks; {result.runs} runs of a {STEPS}-step graph "
        "per saver, alternating. Postgres "
        f"{result.facts['version']} (fsync {result.facts['fsync']}, synchronous_commit "
        f"{result.facts['synchronous_commit']}), the same server for both savers, each on "
        f"its own database; Python {platform.python_version()}, {os.cpu_count()} cores. "
        f"{machine_state(result.load[0])} (load average "
        f"{result.load[0]:.1f} / {result.load[1]:.1f} / {result.load[2]:.1f} at its end): "
        "the absolute figures are noisy, the ratios (same run, interleaved) are what to read. "
        "Commit log lines off (`LOG_LEVEL=WARNING`).",
        "",
        "| operation | Session Store saver p50 | p99 | PostgresSaver p50 | p99 | ratio p50 "
        "| statements per call (ours / theirs) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for op in OPERATIONS:
        a, b = ours[op], peer[op]
        sent = (result.statements["session_store"][op], result.statements["postgres_saver"][op])
        lines.append(f"| `{op}` | {a.p50:.2f} ms | {a.p99:.2f} ms | {b.p50:.2f} ms | "
                     f"{b.p99:.2f} ms | {a.p50 / b.p50:.2f}x | {sent[0]:.1f} / {sent[1]:.1f} |")
    floor = result.latency[FLOOR]
    lines += [
        "",
        "The floor: the same drafts the saver commits, each committed through the kernel on "
        "the calling thread, with no LangGraph translation, serializing or hop to the saver's "
        "thread (`KernelCommits`; for `get_tuple`, its one read, not deserialized). Where "
        "the floor is already slower than PostgresSaver, no work in the saver can meet the "
        "target: the kernel's commit (a head, a commit-log row, a document head and version "
        "per document) is what costs.",
        "",
        "| operation | kernel commit alone p50 | p99 | ratio p50 to PostgresSaver "
        "| the saver's own part of its p50 |",
        "|---|---:|---:|---:|---:|",
    ]
    for op in OPERATIONS:
        a, b, f = ours[op], peer[op], floor[op]
        lines.append(f"| `{op}` | {f.p50:.2f} ms | {f.p99:.2f} ms | {f.p50 / b.p50:.2f}x | "
                     f"{a.p50 - f.p50:.2f} ms |")
    none = result.graph["none"].p50
    lines += [
        "",
        f"A {STEPS}-step graph (`durability=\"sync\"`), p50 of {result.runs} runs:",
        "",
        "| checkpointer | run | overhead per step |",
        "|---|---:|---:|",
        f"| none | {none:.1f} ms | |",
    ]
    for name, label in (("session_store", "Session Store saver"),
                        ("postgres_saver", "PostgresSaver")):
        stats = result.graph[name]
        lines.append(f"| {label} | {stats.p50:.1f} ms | "
                     f"{(stats.p50 - none) / STEPS:.2f} ms |")
    verdict = all(ours[op].p50 <= peer[op].p50 for op in OPERATIONS)
    lines += [
        "",
        f"Target (no slower than PostgresSaver at p50, each operation): "
        f"{'met' if verdict else 'not met'} in this run. The Session Store saver's writes "
        "are kernel commits: after the run its database held (with the floor's commits, "
        "the same again as its `put` and `put_writes`) "
        + ", ".join(f"{n} rows in `{t}`" for t, n in result.rows.items())
        + f"; after a prune of its threads keeping the newest {KEPT} checkpoints of each "
        "(which trims each thread's history up to it: docs/retention.md), "
        + ", ".join(f"{n} in `{t}`" for t, n in result.pruned_rows.items()) + ".",
        "",
        "What each operation sends: a `put` or `put_writes` is a kernel commit that only "
        "writes documents (`kernel.commit.CommitKind.DOCUMENTS_ONLY`, held equal to the "
        "general commit by the differential property test): one statement, one round trip "
        "(`statements.DOCUMENTS_COMMIT`), in which the database advances the session's head, "
        "writes the commit-log row and numbers each document's next version (a head and a "
        "version row per document: `put` the checkpoint and the thread's index, "
        "`put_writes` the checkpoint); a document whose value must be read first (a "
        "baseline due) sends that commit the general way, two round trips. PostgresSaver "
        "sends its upserts in one pipeline in autocommit. A `get_tuple` of the newest "
        "checkpoint is one statement (`Storage.newest_document`: the checkpoint document "
        "with the greatest id, and its versions), as PostgresSaver's one joined row.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.langgraph", description=__doc__)
    parser.add_argument("--count", type=int, default=600, help="of each operation, per saver")
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--runs", type=int, default=10, help="of the 50-step graph")
    args, url = parse_arguments(parser, argv, DATABASE)
    peer_url = database_url(PEER_DATABASE, url)
    progress(f"databases {args.database} and {PEER_DATABASE}: recreating")
    recreate_database(url)
    recreate_database(peer_url)
    # No line per commit on stderr (PostgresSaver logs nothing): what is timed is the
    # commit, not the terminal.
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    setup_django(url, migrate=True)
    result = run(peer_url, count=args.count, blocks=args.blocks, runs=args.runs)
    return publish(HEADING, render(result), write=not args.no_write)


if __name__ == "__main__":
    raise SystemExit(main())
