"""Real worker processes and beat on one database, one Redis db and one provider, and
what their logs say they did.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from controlplane.dev.processes import CeleryWorker, Process, celery_beat, celery_worker


class Cluster:
    """Workers and beat on one database, one Redis db and one provider.

    The processes are ``controlplane.dev.processes``'s, as in the chaos tests; the
    stack is not the chaos harness's, which is bound to pytest-django's test database:
    here the database is whatever URL the run is given.
    """

    def __init__(self, workdir: Path, env: dict[str, str]) -> None:
        self.workdir = workdir
        self.env = env
        self.processes: list[Process] = []
        self._spawned = 0

    def spawn_workers(self, count: int) -> list[CeleryWorker]:
        """Start ``count`` workers without waiting for them (their start is measured)."""
        spawned = []
        for _ in range(count):
            self._spawned += 1
            worker = celery_worker(self.workdir, f"w{self._spawned}", self.env, host="bench")
            self.processes.append(worker.spawn())
            spawned.append(worker)
        return spawned

    def wait_ready(self, workers: Sequence[Process], timeout: float = 60.0) -> None:
        for worker in workers:
            worker.wait_ready(timeout)

    def start_beat(self) -> Process:
        beat = celery_beat(self.workdir, self.env).spawn()
        self.processes.append(beat)
        return beat

    def workers(self) -> list[CeleryWorker]:
        """The workers running now."""
        return [p for p in self.all_workers() if p.alive]

    def all_workers(self) -> list[CeleryWorker]:
        """Every worker this run started, stopped and killed ones too."""
        return [p for p in self.processes if isinstance(p, CeleryWorker)]

    def stop(self, processes: Sequence[Process]) -> None:
        """Stop ``processes`` gracefully, all at once: each takes a second or two."""
        for process in processes:
            process.terminate()
        for process in processes:
            process.stop()

    def close(self) -> None:
        self.stop(self.processes)

    def activity(self, workers: Sequence[CeleryWorker] | None = None) -> Activity:
        """What the logs of ``workers`` (every worker of the run by default) say they did.

        Read it once they have stopped: a queue message's runs are logged together when
        it ends, which can be after the commits that a waiting reader saw."""
        if workers is None:
            workers = self.all_workers()
        advances = [ran for worker in workers for ran in worker.advances()]
        text = "".join(worker.output() for worker in workers)
        return Activity(
            phases=advances.count(True)
            + sum(worker.announced() + worker.woken() for worker in workers),
            idle=advances.count(False),
            redelivered=sum(int(n) for n in re.findall(r"SweepReport\(delivered=(\d+)", text)),
        )


@dataclass(frozen=True)
class Activity:
    """Counts from the worker logs (``-l info``), for what the database does not record.

    ``phases`` counts the advance messages that ran a task, the tasks that workers'
    announcement readers ran (:mod:`controlplane.worker.announcements`) and those that
    queue messages ran; the message of a task a reader ran finds it claimed, and counts
    as ``idle``. A killed worker's runs are not all there: a queue message logs how
    many it ran when it ends, so the runs of the one it was in are not logged at all.

    ``idle`` advance messages found their task not claimable: already claimed or
    finished (a duplicate or re-sent dispatch), or its row locked by another commit in
    progress (the claim skips locked rows), in which case ``advance`` looks again shortly
    (``controlplane.worker.execution.BUSY_RETRIES``) and the sweep's redelivery is the backstop.

    ``redelivered`` sums the dispatches that sweeps sent (a worker logs each sweep that
    sent something, and its start's sweep). Sweeps that sent nothing are not counted:
    Celery's lines for them are routine and dropped at INFO
    (:class:`controlplane.process.logs.Routine`).
    """

    phases: int
    idle: int
    redelivered: int
