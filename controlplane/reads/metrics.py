"""The figures ``/metrics`` serves, read from the store: one aggregate query per figure."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from controlplane.reads.snapshot import rows
from controlplane.storage import task_blocked, task_runnable
from kernel import Outcome, Status


@dataclass(frozen=True)
class StoreFigures:
    commits: int
    claims: int
    restarts: int
    tasks_by_status: dict[str, int]
    """Every :class:`~kernel.records.Status`, zero where none."""
    finished_by_outcome: dict[str, int]
    """Every :class:`~kernel.records.Outcome`, zero where none."""
    expired_leases: int
    dispatch_lag_seconds: float
    blocked_tasks: int
    """Runnable tasks no worker can run, as the queue depths count them
    (:func:`controlplane.storage.statements.task_blocked`)."""


def store_figures(now: datetime) -> StoreFigures:
    [(commits, claims, restarts)] = rows(
        "SELECT (SELECT coalesce(sum(head_seq), 0) FROM kernel_session), "
        "coalesce(sum(epoch), 0), coalesce(sum(restarts), 0) FROM kernel_task"
    )
    by_status = dict(rows("SELECT status, count(*) FROM kernel_task GROUP BY status"))
    by_outcome = dict(rows(
        "SELECT outcome->>'kind', count(*) FROM kernel_task WHERE status = 'terminal' GROUP BY 1"
    ))
    [(expired,)] = rows(
        "SELECT count(*) FROM kernel_task WHERE status = 'running' AND lease_until < %s", [now]
    )
    [(oldest,)] = rows(
        "SELECT min(not_before) FROM kernel_dispatch WHERE not_before <= %s "
        "AND delivered_at IS NULL",
        [now],
    )
    [(blocked,)] = rows(
        f"SELECT count(*) FROM kernel_task t WHERE {task_runnable('t')} AND t.id IN "
        f"(SELECT task_id FROM kernel_dispatch WHERE blocked) AND {task_blocked('t')}",
        {"now": now},
    )
    return StoreFigures(
        commits=int(commits),
        claims=int(claims),
        restarts=int(restarts),
        tasks_by_status={s.value: int(by_status.get(s.value, 0)) for s in Status},
        finished_by_outcome={o.value: int(by_outcome.get(o.value, 0)) for o in Outcome},
        expired_leases=int(expired),
        dispatch_lag_seconds=(now - oldest).total_seconds() if oldest else 0.0,
        blocked_tasks=int(blocked),
    )
