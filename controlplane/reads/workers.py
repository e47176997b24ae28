"""The workers: who holds which leases now, every worker process by the registry it
writes (:mod:`controlplane.worker.heartbeats`), live or dead, and each queue's depth."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings

from controlplane import models
from controlplane.process.kernel import process_kernel
from controlplane.reads.snapshot import rows as sql_rows
from controlplane.storage import task_blocked, task_runnable
from kernel import Status


@dataclass(frozen=True)
class Lease:
    task_id: str
    kind: str
    phase: str
    epoch: int
    lease_until: datetime


@dataclass(frozen=True)
class LeaseHolder:
    worker: str
    leases: list[Lease]
    last_heartbeat: datetime
    """Latest lease renewal seen: the latest lease end minus a lease's duration."""


def lease_holders() -> list[LeaseHolder]:
    """Workers holding leases, by name. A worker without a lease has nothing to show."""
    lease = timedelta(seconds=settings.KERNEL_LEASE_SECONDS)
    held: dict[str, list[Lease]] = defaultdict(list)
    for owner, *fields in models.Task.objects.filter(status=Status.RUNNING).exclude(
        lease_owner=None
    ).values_list("lease_owner", "id", "kind", "phase", "epoch", "lease_until"):
        held[owner].append(Lease(*fields))
    return [
        LeaseHolder(owner, leases, max(x.lease_until for x in leases) - lease)
        for owner, leases in sorted(held.items())
    ]


# -- the worker registry and the queues ----------------------------------------------------


@dataclass(frozen=True)
class WorkerState:
    """A worker process as its last heartbeat said, with the leases it holds now."""

    id: str
    name: str
    host: str
    pid: int
    queues: list[str]
    concurrency: int
    in_flight: int
    processed_last_minute: int
    failed_last_minute: int
    processed_total: int
    failed_total: int
    started_at: datetime
    last_heartbeat: datetime
    stopped_at: datetime | None
    state: str
    """``live``; ``dead`` (no heartbeat for ``WORKER_DEAD_SECONDS``); ``stopped`` (shut
    down cleanly)."""
    silent_seconds: float
    leases: list[Lease]

    @property
    def worker(self) -> str:
        """Its lease owner name, as :class:`LeaseHolder` says it."""
        return self.id


def registry(now: datetime | None = None) -> list[WorkerState]:
    """Every worker heard from within ``WORKER_FORGET_SECONDS``, live ones first, each
    with its state and the leases it holds (by the kernel's lease owner, ``host:pid``)."""
    now = now or process_kernel().clock.now()
    dead_after = settings.WORKER_DEAD_SECONDS
    held = {h.worker: h.leases for h in lease_holders()}
    found = []
    for row in models.Worker.objects.filter(
        last_heartbeat__gte=now - timedelta(seconds=settings.WORKER_FORGET_SECONDS)
    ).order_by("host", "pid"):
        silent = max(0.0, (now - row.last_heartbeat).total_seconds())
        state = "stopped" if row.stopped_at else "dead" if silent > dead_after else "live"
        fields = {f: getattr(row, f) for f in WorkerState.__dataclass_fields__
                  if f not in ("state", "silent_seconds", "leases")}
        found.append(WorkerState(**fields, state=state, silent_seconds=silent,
                                 leases=held.get(row.id, [])))
    return sorted(found, key=lambda w: (w.state != "live", w.host, w.pid))


def dead_owners(now: datetime, sweeper_steady: float | None = math.inf) -> list[str]:
    """The lease owners (``host:pid``) of the workers whose heartbeat stopped: silent for
    more than ``WORKER_DEAD_SECONDS`` at ``now`` (the database's clock, which their
    heartbeats are written by) and not stopped cleanly (a clean stop released its leases
    already). A worker that writes no row at all is never taken for dead here: its
    leases run out as ever. What the sweep ends the leases of
    (:class:`kernel.dispatch.Dispatcher`'s ``dead_owners``).

    ``sweeper_steady``: how long the asking worker's own beats have run without a gap up
    to ``now``, in seconds (None: it is in a gap now;
    :meth:`controlplane.worker.heartbeats.Heartbeat.steady_for`). After a database outage
    every row is silent, and each live worker beats again when it next tries, some later
    than others: the sweeper takes no one for dead until its own beats have run for
    ``WORKER_DEAD_SECONDS`` since, so a worker is dead only if it stayed silent that long
    while the database was in reach. Not given (a process that writes no row, such as
    ``manage.py sweep``): the rows alone decide."""
    dead_after = settings.WORKER_DEAD_SECONDS
    if sweeper_steady is None or sweeper_steady <= dead_after:
        return []
    return list(models.Worker.objects.filter(
        stopped_at=None, last_heartbeat__lt=now - timedelta(seconds=dead_after),
        last_heartbeat__gte=now - timedelta(seconds=settings.WORKER_FORGET_SECONDS),
    ).order_by("id").values_list("id", flat=True))


def everyone(now: datetime | None = None) -> list[WorkerState | LeaseHolder]:
    """The registry's workers, then lease holders it does not know (a worker of an older
    release that writes no heartbeat row)."""
    known = registry(now)
    ids = {w.id for w in known}
    return [*known, *(h for h in lease_holders() if h.worker not in ids)]


@dataclass(frozen=True)
class QueueDepth:
    queue: str
    runnable: int
    """Tasks a worker of this queue may claim now (pending, due sleepers, expired leases),
    not counting the blocked ones."""
    oldest: datetime | None
    """When the oldest of them became runnable: its last commit, its wake time, or, for
    an expired lease, its expiry (a long phase renews its lease without committing)."""
    broker: int | None
    """Messages waiting in the broker's list for this queue (None if unknown)."""
    blocked: int = 0
    """Tasks that would be runnable but that no worker here can run (blocked, as
    :func:`controlplane.storage.statements.task_blocked` says: their definition is
    missing, too old, or fails to migrate, or their environment is not offered): they
    wait for a deploy or an operator, not for a worker, so they are not work the queue is
    behind on."""



def queues(now: datetime | None = None, consumed: list[str] | None = None) -> list[QueueDepth]:
    """Each queue's runnable tasks and the age of the oldest, from ``kernel_task``, with
    the broker's list length beside it; a queue a worker consumes is shown even if empty."""
    now = now or process_kernel().clock.now()
    counted = {queue: (n, oldest, blocked) for queue, n, oldest, blocked in sql_rows(
        "SELECT t.queue, count(*) FILTER (WHERE NOT t.blocked), "
        "min(CASE WHEN t.status = 'sleeping' THEN t.wake_at "
        "WHEN t.status = 'running' THEN t.lease_until ELSE c.at END) "
        "FILTER (WHERE NOT t.blocked), count(*) FILTER (WHERE t.blocked) "
        f"FROM (SELECT t.*, {task_blocked('t')} AS blocked FROM kernel_task t "
        f"WHERE {task_runnable('t')}) t LEFT JOIN kernel_commit c "
        "ON c.session_id = t.session_id AND c.seq = t.updated_seq "
        "GROUP BY t.queue", {"now": now})}
    names = sorted(set(counted) | set(consumed or []))
    lengths = broker_lengths(names)
    return [QueueDepth(q, *counted.get(q, (0, None, 0))[:2], lengths.get(q),
                       blocked=counted.get(q, (0, None, 0))[2]) for q in names]


def broker_lengths(names: list[str]) -> dict[str, int]:
    """The Redis list length of each queue (Celery's Redis transport keeps a queue's
    messages in a list of its name); empty if the broker does not answer quickly."""
    if not names or not settings.CELERY_BROKER_URL.startswith("redis"):
        return {}
    import redis

    try:
        client = redis.Redis.from_url(settings.CELERY_BROKER_URL, socket_timeout=0.5,
                                      socket_connect_timeout=0.5)
        with client.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.llen(name)
            return dict(zip(names, (int(n) for n in pipe.execute()), strict=True))
    except redis.RedisError:
        return {}
