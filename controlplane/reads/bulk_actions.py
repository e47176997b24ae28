"""Bulk actions as recorded under their action ids (``controlplane_bulk_action``): what
a repeat of a bulk request is answered from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from controlplane import models


@dataclass(frozen=True)
class BulkRecord:
    action_id: str
    action: str
    digest: str
    task_ids: list[str]
    seen: list[int] | None
    """What the preview found of each task (:data:`controlplane.reads.tasks.NAMED_BY`),
    in ``task_ids``' order; None: nothing."""
    reason: str
    results: list[dict[str, Any]] | None
    """What it did to each task; None while it runs (or if its process died)."""
    by: str
    """Who asked for it (:func:`controlplane.access.actor`)."""


def recorded(action_id: str) -> BulkRecord | None:
    row = models.BulkAction.objects.filter(action_id=action_id).first()
    if row is None:
        return None
    return BulkRecord(row.action_id, row.action, row.digest, list(row.task_ids),
                      None if row.seen is None else list(row.seen), row.reason, row.results,
                      row.by)
