"""Who holds which leases now, and when each holder last renewed one."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings

from controlplane import models
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
