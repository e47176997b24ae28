"""The peers' submission shapes that the anchors' own scripts do not run.

Run by :mod:`benchmarks.fanout` with the anchors' virtualenv (which has the peers; this
project's does not), from the anchors' folder, whose modules it imports and runs as they
are (``celery_app``, ``proc_app``, ``bench_dbos``'s workflow, ``queue_harness``'s
completion counter): no peer code is copied here, only the client side changes shape.

- ``--shape item --threads T``: one client call per task (Celery ``apply_async``,
  Procrastinate ``defer``, DBOS ``enqueue``), the ``--n`` calls split over ``T`` client
  threads started together;
- ``--shape batch``: one client call for the whole burst (Celery ``group(...)
  .apply_async()``, Procrastinate ``batch_defer``).

Throughput is counted as the anchors count it: from the first submit until the last task
has run (Procrastinate: and its job row says ``succeeded``; DBOS: its workflow row says
``SUCCESS``). Prints one ``RESULT {json}`` line. Deliberately free of this project's
imports: it runs under another interpreter.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any


def split(n: int, threads: int) -> list[int]:
    """``n`` calls over ``threads`` client threads, as evenly as can be."""
    return [n // threads + (1 if i < n % threads else 0) for i in range(threads)]


def burst(
    submit_one: Callable[[float], Any],
    submit_batch: Callable[[int], Any] | None,
    n: int,
    threads: int,
) -> float:
    """Submit ``n`` tasks in the asked shape; returns when the last call returned (the
    clock time the first call started is the caller's ``t0``). A client thread's
    failure is raised here."""
    if submit_batch is not None:
        submit_batch(n)
        return time.time()
    failures: list[BaseException] = []
    go = threading.Barrier(threads + 1)

    def client(count: int) -> None:
        try:
            go.wait()
            for _ in range(count):
                submit_one(time.time())
        except BaseException as exc:  # reported by the caller, not lost in a thread
            failures.append(exc)

    workers = [threading.Thread(target=client, args=(c,)) for c in split(n, threads)]
    for worker in workers:
        worker.start()
    go.wait()
    for worker in workers:
        worker.join()
    if failures:
        raise failures[0]
    return time.time()


def measure(
    done: Callable[[], int],
    reset: Callable[[], None],
    submit_one: Callable[[float], Any],
    submit_batch: Callable[[int], Any] | None,
    n: int,
    threads: int,
    timeout: float,
    confirm: Callable[[], bool] = lambda: True,
) -> dict[str, Any]:
    from common import wait_until

    reset()
    t0 = time.time()
    submitted = burst(submit_one, submit_batch, n, threads)
    if not wait_until(lambda: done() >= n and confirm(), timeout, 0.005):
        raise SystemExit(f"only {done()} of {n} tasks ran within {timeout:g} s")
    wall = time.time() - t0
    return {"n": n, "threads": threads, "submit_s": submitted - t0,
            "submit_per_s": n / max(submitted - t0, 1e-9), "wall_s": wall, "per_s": n / wall}


def celery(a: argparse.Namespace) -> dict[str, Any]:
    import celery_app
    from celery import group
    from queue_harness import Harness

    h = Harness(celery_app.KEY_DONE, celery_app.KEY_LAT)
    h.r.delete("anchors")
    binary = os.path.join(os.path.dirname(sys.executable), "celery")
    h.start_worker([binary, "-A", "celery_app", "worker", "--pool", "prefork",
                    "-c", str(a.concurrency), "-Q", "anchors", "-n", "anchors-shapes@%h"],
                   cwd=a.anchors)

    def one(t: float) -> None:
        celery_app.trivial.apply_async(args=(t,))

    def batch(n: int) -> None:
        group(celery_app.trivial.s(time.time()) for _ in range(n)).apply_async()

    try:
        h.warm_up(one)
        return measure(h.done, h.reset, one, batch if a.shape == "batch" else None,
                       a.n, a.threads, a.timeout)
    finally:
        h.stop_worker()


def procrastinate(a: argparse.Namespace) -> dict[str, Any]:
    import proc_app
    import psycopg
    from common import pg_conninfo
    from queue_harness import Harness

    env = dict(os.environ, PYTHONPATH=a.anchors + os.pathsep + os.environ.get("PYTHONPATH", ""))
    binary = os.path.join(os.path.dirname(sys.executable), "procrastinate")
    subprocess.run([binary, "--app=proc_app.app", "schema", "--apply"], cwd=a.anchors,
                   env=env, check=True, stdout=subprocess.DEVNULL)
    h = Harness(proc_app.KEY_DONE, proc_app.KEY_LAT)
    conn = psycopg.connect(pg_conninfo(proc_app.DB), autocommit=True)

    def succeeded() -> int:
        row = conn.execute(
            "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'").fetchone()
        return int(row[0]) if row else 0

    h.start_worker([binary, "--app=proc_app.app", "--log-level", "warning", "worker", "-q",
                    "anchors", "-c", str(a.concurrency)], cwd=a.anchors, env=env)
    try:
        with proc_app.app.open():
            def one(t: float) -> None:
                proc_app.trivial.defer(t_sent=t)

            def batch(n: int) -> None:
                proc_app.trivial.batch_defer(*[{"t_sent": time.time()} for _ in range(n)])

            h.warm_up(one)
            time.sleep(0.2)
            base = succeeded()
            return measure(h.done, h.reset, one, batch if a.shape == "batch" else None,
                           a.n, a.threads, a.timeout,
                           confirm=lambda: succeeded() - base >= a.n)
    finally:
        h.stop_worker()
        conn.close()


def dbos(a: argparse.Namespace) -> dict[str, Any]:
    import bench_dbos
    from dbos import DBOS

    if a.shape != "item":
        raise SystemExit("DBOS is run per item only")
    bench_dbos.launch()
    q = DBOS.register_queue("anchors_shapes")

    def one(t: float) -> None:
        q.enqueue(bench_dbos.fan_wf, 0, t)

    def reset() -> None:
        with bench_dbos._lock:
            bench_dbos.STARTS.clear()
            bench_dbos.DONE[0] = 0

    def done() -> int:
        return bench_dbos.DONE[0]

    try:
        for _ in range(5):  # warm-up, as the anchors' fan-out does
            one(time.time())
        bench_dbos.wait_until(lambda: done() >= 5, 30, 0.01)
        bench_dbos.wait_db_success("%fan_wf%", 5, 30)
        ended = {"n": 5}

        def confirm() -> bool:
            return bench_dbos.count_status("%fan_wf%", "SUCCESS") >= ended["n"] + a.n

        result = measure(done, reset, one, None, a.n, a.threads, a.timeout, confirm)
        result["steps_per_s"] = 2 * result["per_s"]
        result["wf_per_s"] = result["per_s"]
        return result
    finally:
        DBOS.destroy()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("peer", choices=["celery", "procrastinate", "dbos"])
    ap.add_argument("--shape", choices=["item", "batch"], default="item")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--anchors", default=os.getcwd())
    a = ap.parse_args()
    sys.path.insert(0, a.anchors)
    from common import emit

    result = {"celery": celery, "procrastinate": procrastinate, "dbos": dbos}[a.peer](a)
    emit({"bench": f"{a.peer}_{a.shape}_t{a.threads}", "shape": a.shape, **result})


if __name__ == "__main__":
    main()
