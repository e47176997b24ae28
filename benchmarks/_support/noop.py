"""The no-op task kind (every phase only commits its checkpoint), the client that
commits it as the API would, and real workers that run it: the engine's own cost with
nothing to do, which the fan-out, scaling and broker benchmarks measure in their shapes.

Workers load the kind through ``KERNEL_TASK_MODULES`` (:data:`TASK_MODULE`), as any
deployment adds task kinds.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks._support.delivery import delivering_kernel
from benchmarks._support.postgres import WaitSampler
from benchmarks._support.report import ROOT
from benchmarks._support.stats import Stats
from benchmarks._support.workers import Cluster
from controlplane.dev.processes import process_env

KIND = "bench-noop"
TASK_MODULE = "benchmarks._support.noop.register"


def register(registry: Any) -> None:
    """The no-op kind: ``input["phases"]`` phases, each committing only its checkpoint."""
    from kernel import Run, Transition

    @registry.task(KIND, queue="default")
    class Noop:
        initial = "step"

        def step(self, run: Run) -> Transition:
            now = time.time()
            done = int(run.checkpoint.get("done", 0)) + 1
            first = run.checkpoint.get("t0", now)
            if done >= int(run.input.get("phases", 1)):
                return run.succeed({"t0": first, "t1": time.time()})
            return run.next("step", {"done": done, "t0": first})


@dataclass(frozen=True)
class Submitted:
    """A burst submitted in one shape: tasks/s from the first submit until every task is
    terminal, the submission's own rate, and the delivery failures the client logged."""

    per_s: float
    submit_per_s: float
    delivery_errors: int = 0
    waits: dict[str, float] = field(default_factory=dict)
    """Where the database's backends were meanwhile (:class:`WaitSampler`)."""


class Driver:
    """Commits tasks as a client would, with deliveries to this run's Redis db."""

    def __init__(self, redis_url: str, url: str | None = None) -> None:
        self.url = url
        self.kernel, self._broker = delivering_kernel(redis_url)
        self.handle = self.kernel.create_session()
        self.durable_at = 0.0
        self.kernel.listeners.insert(0, self._durable)
        self.failures = FailedDeliveries()
        logging.getLogger("kernel.dispatch").addHandler(self.failures)

    def _durable(self, write_set: Any) -> None:
        self.durable_at = time.time()

    def create(self, count: int, phases: int) -> list[str]:
        from kernel import Draft

        draft = Draft(actor="user:bench")
        ids = [draft.create_task(KIND, {"phases": phases}) for _ in range(count)]
        self.handle.commit(draft)
        return ids

    def terminal(self, ids: list[str]) -> int:
        from django.db import connection

        with connection.cursor() as cur:
            cur.execute(
                "SELECT count(*) FROM kernel_task WHERE id = ANY(%s) AND status = 'terminal'",
                [ids],
            )
            return int(cur.fetchone()[0])

    def results(self, ids: list[str]) -> list[dict[str, Any]]:
        from django.db import connection

        with connection.cursor() as cur:
            cur.execute("SELECT outcome::text FROM kernel_task WHERE id = ANY(%s)", [ids])
            return [json.loads(row[0])["result"] for row in cur.fetchall()]

    def wait(self, ids: list[str], timeout: float) -> float:
        deadline = time.monotonic() + timeout
        while self.terminal(ids) < len(ids):
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {self.terminal(ids)} of {len(ids)} tasks ended")
            time.sleep(0.01)
        return time.time()

    def per_item(self, count: int, phases: int, threads: int, timeout: float) -> Submitted:
        """``count`` tasks, each created by a commit of its own (a client call), from
        ``threads`` client threads started together, each on a session of its own (one
        session's commits take turns); timed from the first submit until every task is
        terminal. The commits deliver as the API's do (``delivering_kernel``)."""
        from django.db import connection

        handles = [self.kernel.create_session() for _ in range(threads)]
        made: list[list[str]] = [[] for _ in range(threads)]
        failures: list[BaseException] = []
        go = threading.Barrier(threads + 1)

        def client(index: int, share: int) -> None:
            from kernel import Draft

            try:
                go.wait()
                for _ in range(share):
                    draft = Draft(actor="user:bench")
                    made[index].append(draft.create_task(KIND, {"phases": phases}))
                    handles[index].commit(draft)
            except BaseException as exc:  # raised below, not lost in the thread
                failures.append(exc)
            finally:
                connection.close()  # this thread's own, which Django opened for it

        shares = [count // threads + (1 if i < count % threads else 0) for i in range(threads)]
        clients = [threading.Thread(target=client, args=(i, n)) for i, n in enumerate(shares)]
        errors_before = self.failures.count
        for thread in clients:
            thread.start()
        sampler = WaitSampler(self.url) if self.url else None
        with sampler or contextlib.nullcontext():
            started = time.time()
            go.wait()
            for thread in clients:
                thread.join()
            submitted = time.time()
            if failures:
                raise failures[0]
            ended = self.wait([i for ids in made for i in ids], timeout)
        return Submitted(
            count / (ended - started),
            count / max(submitted - started, 1e-9),
            self.failures.count - errors_before,
            sampler.averages() if sampler else {},
        )

    def burst(self, count: int, phases: int, timeout: float) -> float:
        started = time.time()
        ids = self.create(count, phases)
        return count / (self.wait(ids, timeout) - started)

    def sequential(self, phases: int, timeout: float) -> float:
        ids = self.create(1, phases)
        self.wait(ids, timeout)
        [result] = self.results(ids)
        return phases / (result["t1"] - result["t0"])

    def latency(self, count: int, gap_ms: float, timeout: float) -> tuple[Stats, Stats]:
        """Commit to phase start, from before the commit and from its durable point."""
        sent: dict[str, float] = {}
        durable: dict[str, float] = {}
        next_at = time.perf_counter()
        for _ in range(count):
            before = time.time()
            [task_id] = self.create(1, 1)
            sent[task_id], durable[task_id] = before, self.durable_at
            next_at += gap_ms / 1000
            pause = next_at - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
        ids = list(sent)
        self.wait(ids, timeout)
        from django.db import connection

        with connection.cursor() as cur:
            cur.execute("SELECT id, outcome::text FROM kernel_task WHERE id = ANY(%s)", [ids])
            started = {i: json.loads(o)["result"]["t0"] for i, o in cur.fetchall()}
        return (Stats.of([started[i] - sent[i] for i in ids]),
                Stats.of([started[i] - durable[i] for i in ids]))

    def close(self) -> None:
        logging.getLogger("kernel.dispatch").removeHandler(self.failures)
        self._broker.release()


class FailedDeliveries(logging.Handler):
    """Counts the dispatcher's warnings (a message it could not hand to the broker)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0
        self.last = ""

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1
        self.last = record.getMessage()


@contextlib.contextmanager
def cluster(url: str, redis_url: str, workers: int, logs: str | None) -> Iterator[Any]:
    """Beat and ``workers`` workers that run the no-op kind, on ``url`` and ``redis_url``
    (emptied first), their logs in ``logs`` (default: a temporary folder)."""
    import redis

    redis.Redis.from_url(redis_url).flushdb()
    with contextlib.ExitStack() as stack:
        if logs is None:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-fanout-"))
        else:
            tmp = logs
            Path(tmp).mkdir(parents=True, exist_ok=True)
        env = process_env(
            url,
            redis_url,
            KERNEL_TASK_MODULES=TASK_MODULE,
            PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            DJANGO_DEBUG="0",
            DJANGO_SETTINGS_MODULE="controlplane.settings",
        )
        running = Cluster(Path(tmp), env)
        try:
            running.start_beat()
            running.wait_ready(running.spawn_workers(workers))
            yield running
        finally:
            running.close()
