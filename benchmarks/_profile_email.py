"""Where a worker's time per email goes (issue 12, step 1): an in-process profile.

Not part of ``make bench`` (its name starts with ``_``). Run::

    python -m benchmarks._profile_email --emails 100 1000 10000

For each size, a ``send-batch`` is committed as the API would, in the dedicated
database ``durable_bench_profile``, against the local provider; its dispatches are
collected in memory instead of going to Redis, and this process runs them in order
with the runtime's own Worker (``Worker.advance``, what a Celery ``advance`` message
calls; ``Worker.advance_queue`` for a burst's queue messages, as a queue message's worker), so the
figures are the kernel's and the application's cost without Celery's receive/ack.
Each step is timed inclusively (wall and this process's CPU) by wrapping the method
that does it; the table gives milliseconds per email.
"""

from __future__ import annotations

import argparse
import os
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from benchmarks._support import BENCH_DATABASE, fresh_database, parse_arguments, progress

SPENT: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])


def timed(owner: Any, name: str, label: str) -> None:
    inner: Callable[..., Any] = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            return inner(*args, **kwargs)
        finally:
            slot = SPENT[label]
            slot[0] += time.perf_counter() - wall
            slot[1] += time.process_time() - cpu
            slot[2] += 1

    setattr(owner, name, wrapper)


def instrument() -> None:
    from controlplane.reference.notices import channels
    from controlplane.storage import READS, WRITES, PostgresStorage
    from controlplane.worker.runtime import runtime
    from kernel import run

    rt = runtime()
    storage = rt.kernel.storage
    timed(rt.worker, "advance", "advance (all of it)")
    timed(storage, "task", "read the task row (advance's check)")
    timed(storage, "claim", "claim (UPDATE ... RETURNING)")
    timed(storage, "claim_burst", "claim from the queue's burst rows")
    timed(storage, "commit", "phase commits (both)")
    timed(storage, "document_head", "plan document: head read")
    timed(storage, "document_versions", "plan document: versions read")
    timed(rt.kernel.registry, "resolve", "registry.resolve")
    timed(channels.HttpChannel, "send", "provider POST (HTTP client + provider)")
    timed(run.Lease, "commit", "lease.commit (phase commit, incl. after-commit)")
    timed(rt.dispatcher, "after_commit", "after-commit: dispatcher")

    def observer(stage: str, seconds: float) -> None:
        slot = SPENT[f"commit round trip: {'reads' if stage == READS else 'writes + COMMIT'}"]
        slot[0] += seconds
        slot[2] += 1

    assert isinstance(storage, PostgresStorage)  # the stages are its commit's
    storage.observer = observer
    del WRITES


def profile(emails: int) -> dict[str, list[float]]:
    from django.conf import settings

    from controlplane.worker.runtime import runtime
    from kernel import Draft

    rt = runtime()
    queue: list[str] = []
    woken: list[str] = []
    rt.dispatcher.deliver = lambda task_id, q: queue.append(task_id)
    rt.dispatcher.advance_queue = woken.append  # queue messages: run below
    handle = rt.kernel.create_session()
    draft = Draft(actor="user:profile")
    recipients = [f"r{i:05d}@profile.example" for i in range(emails)]
    draft.create_task("send-batch", {"recipients": recipients, "subject": "s", "body": "b" * 200})
    handle.commit(draft)
    rt.worker.advance(queue.pop(0))  # the plan phase: creates and dispatches the notices
    SPENT.clear()
    started, cpu = time.perf_counter(), time.process_time()
    notices = [t for t in queue]
    queue.clear()
    for task_id in notices:  # a burst of KERNEL_DISPATCH_MESSAGES or fewer: a message each
        rt.worker.advance(task_id)
    for name in dict.fromkeys(woken):  # a larger one: claimed from Postgres
        rt.worker.advance_queue(name, batch=settings.KERNEL_ENDINGS_PER_COMMIT, budget=3600)
    woken.clear()
    total = time.perf_counter() - started, time.process_time() - cpu
    for task_id in list(queue):  # summarize
        rt.worker.advance(task_id)
    result = dict(SPENT)
    result["total per email (notices only)"] = [total[0], total[1], emails]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks._profile_email")
    parser.add_argument("--emails", type=int, nargs="+", default=[100, 1000])
    args, url = parse_arguments(parser, argv, f"{BENCH_DATABASE}_profile")
    # Dispatches are collected in memory and nothing listens: a held message would reach
    # the collector only after the grace, when this process has already moved on.
    os.environ["KERNEL_LISTEN"] = "0"
    from controlplane.dev.processes import start_provider

    with start_provider() as provider:
        os.environ["EMAIL_PROVIDER_URL"] = provider.url
        fresh_database(args, url)
        instrument()
        rows: dict[int, dict[str, list[float]]] = {}
        for size in args.emails:
            progress(f"profile: {size} emails")
            rows[size] = profile(size)
    labels = list(rows[args.emails[0]])
    head = " | ".join(f"{n:,} emails: wall / CPU" for n in args.emails)
    print(f"| ms per email | {head} |")
    print("|---|" + "---:|" * len(args.emails))
    for label in labels:
        cells = []
        for size in args.emails:
            wall, cpu, _ = rows[size].get(label, [0.0, 0.0, 0])
            cells.append(f"{wall * 1000 / size:.2f} / {cpu * 1000 / size:.2f}")
        print(f"| {label} | {' | '.join(cells)} |")
    print(f"load average at the end: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
