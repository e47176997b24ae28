"""Retention: which sessions' history may be removed, and what a prune removed.

A session is *finished* when every task in it is terminal and every submission settled:
then no live, waiting or sleeping task and no unsettled submission can need anything in
it. Only finished sessions are pruned. What goes is their *history*: the commit log up
to the head, their conversations' entries, and their documents' versions older than
each document's newest baseline. What stays is their current state: the session (its
``head_seq``, and ``pruned_seq``, the last seq that may be gone), its tasks with their
input, checkpoint and outcome, its submissions, conversations and each document's
current value. A finished session that gets new work later (a resubmission) goes on at
``head_seq + 1``; a feed reader whose cursor is below ``pruned_seq`` is sent the current
state instead of the missing commits (docs: the change feed's ``snapshot`` frame).

A *live* session's history is trimmed instead (:class:`TrimReport`, the storages'
``trim``): up to a seq its owner chooses, what no read of the current state and of the
later history needs goes, and the session goes on as it was. Kept: every commit row
with an idempotency key (a later commit with that key must still be refused as a
duplicate, for the life of the session), every document version from the newest
baseline at or before that seq on (so each version after it still reads), entries
(conversations keep their own retention: summaries), tasks and submissions. Removed:
the other commit rows up to that seq (``pruned_seq`` moves there, as a prune sets it),
the versions before those baselines, and, of the kinds the caller names, the
documents whose whole value was replaced by an empty object at or before that seq
(they read as absent: their kind's initial value).

Whether a finished session is due: its last commit is older than its retention, the
first of ``metadata["retention_days"]`` (this session), the days for its status
(:func:`finished_status`), the default days. ``None`` everywhere keeps it forever, which
is the default: retention is off until configured.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from .records import Outcome

SESSION_RETENTION_KEY = "retention_days"
"""The session metadata key that overrides the policy for that session (days, a number)."""
MAX_RETENTION_DAYS = 36_525
"""The most days a session's own retention may ask for where it is written (a century):
:func:`check_retention_days`. A stored value beyond it (or beyond any date) keeps the
session, and never stops a prune."""

_WORST_FIRST = (Outcome.FAULTED, Outcome.FAILED, Outcome.CANCELLED, Outcome.SUCCEEDED)

Progress = Callable[[str], None]
"""Receives one line of progress per step of a prune (``manage.py prune`` prints them)."""


def quiet(line: str) -> None:
    return None


def finished_status(outcomes: Iterable[str | None]) -> str:
    """A finished session's status for the policy: the worst outcome among its root
    tasks (faulted, failed, cancelled, succeeded, in that order); ``succeeded`` for a
    session without tasks. ``outcomes`` are the root tasks' outcome kinds."""
    found = {o for o in outcomes if o}
    return str(next((o for o in _WORST_FIRST if o in found), Outcome.SUCCEEDED))


def check_retention_days(value: Any) -> float:
    """A session's own retention as written (its ``metadata["retention_days"]``): a
    number of days from 0 to :data:`MAX_RETENTION_DAYS`; ValueError saying so otherwise."""
    if (
        isinstance(value, bool) or not isinstance(value, int | float)
        or not 0 <= value <= MAX_RETENTION_DAYS
    ):
        raise ValueError(
            f"{SESSION_RETENTION_KEY}: a number of days from 0 to {MAX_RETENTION_DAYS}")
    return float(value)


def _days(value: Any) -> float | None:
    """A retention in days from configuration or metadata; None (keep) for anything else,
    a number no float holds or infinity among them."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        days = float(value)
    except OverflowError:
        return None
    return days if 0 <= days < math.inf else None


@dataclass(frozen=True)
class RetentionPolicy:
    """How long a finished session's history is kept, in days (see the module docstring)."""

    days: float | None = None
    by_status: Mapping[str, float | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        known = {str(o) for o in Outcome}
        unknown = sorted(set(self.by_status) - known)
        if unknown:
            raise ValueError(f"retention by status: unknown status {unknown}; use {sorted(known)}")

    def days_for(self, metadata: Mapping[str, Any] | None, status: str) -> float | None:
        own = (metadata or {}).get(SESSION_RETENTION_KEY)
        if own is not None:
            return _days(own)
        if status in self.by_status:
            return _days(self.by_status[status])
        return _days(self.days)

    def due(
        self, metadata: Mapping[str, Any] | None, status: str, last_commit: datetime,
        now: datetime,
    ) -> bool:
        """Whether a finished session whose last commit was at ``last_commit`` is pruned now."""
        days = self.days_for(metadata, status)
        if days is None:
            return False
        try:
            cutoff = now - timedelta(days=days)
        except OverflowError:
            return False  # before the first representable date: nothing is that old
        return last_commit < cutoff


@dataclass
class TrimReport:
    """What trimming a live session's history removed."""

    pruned_seq: int = 0
    """The session's ``pruned_seq`` after the trim."""
    commits: int = 0
    document_versions: int = 0
    documents: int = 0
    """Emptied documents removed whole (head and versions; their versions are not
    counted in ``document_versions``)."""


@dataclass
class PruneReport:
    """What a prune removed (or, ``dry_run``, would remove)."""

    dry_run: bool = False
    sessions: int = 0
    commits: int = 0
    """Commit rows deleted one by one."""
    entries: int = 0
    document_versions: int = 0
    partitions: list[str] = field(default_factory=list)
    """Whole partitions of the commit log dropped (Postgres)."""
    partition_commits: int = 0
    """Commit rows that went with those partitions."""
    skipped: int = 0
    """Sessions found due that changed before they were pruned (left for the next run)."""

    def summary(self) -> str:
        verb = "would remove" if self.dry_run else "removed"
        parts = (
            f"{verb} the history of {self.sessions} finished session(s): "
            f"{self.commits + self.partition_commits} commit(s) "
            f"({self.partition_commits} by dropping {len(self.partitions)} partition(s)), "
            f"{self.entries} entr(y/ies), {self.document_versions} document version(s)"
        )
        if self.skipped:
            parts += f"; {self.skipped} session(s) changed meanwhile and were left"
        return parts
