"""The commit log's partitions: ``kernel_commit`` is partitioned by range of ``at``.

One partition per period (a UTC day or month, ``KERNEL_COMMIT_PARTITION``), named after
its first day (``kernel_commit_20261201``), plus ``kernel_commit_default`` for any
commit no period partition covers (the partitions ahead were not made in time, or a
clock far off), so that a commit never fails for want of a partition.
:func:`ensure` makes the current period's partition and ``ahead`` more, and moves rows
that were written to the default partition into a partition of their own; beat runs it daily
with the prune (controlplane.commands.prune), the migration once.

Only the commit log is partitioned. Entries and document versions live as long as their
session, however old, and are read by conversation and by document, never by time: a
live session's old entries would sit in the same partition as a finished one's, so
partitions by time would seldom be droppable, and every key on them would have to carry
the time. Commits are read after a cursor and pruned whole per period.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db import connections, transaction

from controlplane.storage.schema import COMMIT

PERIODS = ("day", "month")
DEFAULT = f"{COMMIT.name}_default"
_BOUNDS = re.compile(r"FROM \('([^']+)'\) TO \('([^']+)'\)")


@dataclass(frozen=True)
class Partition:
    name: str
    start: datetime | None
    """First moment it holds; None for the default partition (and ``end`` too)."""
    end: datetime | None
    """First moment after it."""

    @property
    def is_default(self) -> bool:
        return self.start is None


def period_start(at: datetime, period: str) -> datetime:
    """The start of the UTC ``period`` that contains ``at``."""
    at = at.astimezone(UTC)
    if period == "day":
        return datetime(at.year, at.month, at.day, tzinfo=UTC)
    if period == "month":
        return datetime(at.year, at.month, 1, tzinfo=UTC)
    raise ValueError(f"KERNEL_COMMIT_PARTITION must be one of {PERIODS}, not {period!r}")


def next_start(start: datetime, period: str) -> datetime:
    if period == "day":
        return datetime.fromordinal(start.toordinal() + 1).replace(tzinfo=UTC)
    month = start.month % 12 + 1
    return start.replace(year=start.year + (start.month == 12), month=month)


def _moment(text: str) -> datetime:
    return datetime.fromisoformat(text).astimezone(UTC)


def partitions(cur: Any) -> list[Partition]:
    """Every partition of the commit log, the default one last, the others by start."""
    cur.execute(
        "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
        "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = %s::regclass",
        [COMMIT.name],
    )
    found = []
    for name, bound in cur.fetchall():
        match = _BOUNDS.search(bound)
        if match is None:
            found.append(Partition(name, None, None))
        else:
            found.append(Partition(name, _moment(match[1]), _moment(match[2])))
    return sorted(found, key=lambda p: (p.is_default, p.start or datetime.max.replace(tzinfo=UTC)))


def unmade(cur: Any, now: datetime, period: str, ahead: int) -> list[Partition]:
    """The partitions :func:`ensure` would make (it makes nothing): of the period holding
    ``now`` and of ``ahead`` periods after it, and of each period with rows in the
    default partition; a period that overlaps an existing partition is left alone."""
    start = period_start(now, period)
    wanted = [start]
    for _ in range(ahead):
        wanted.append(next_start(wanted[-1], period))
    cur.execute(
        f"SELECT DISTINCT date_trunc(%s, at, 'UTC') FROM {DEFAULT}", [period]
    )
    wanted += [row[0].astimezone(UTC) for row in cur.fetchall()]
    existing = [p for p in partitions(cur) if not p.is_default]
    found = []
    for lo in sorted(set(wanted)):
        hi = next_start(lo, period)
        if any(p.start < hi and lo < p.end for p in existing):  # type: ignore[operator]
            continue
        part = Partition(f"{COMMIT.name}_{lo:%Y%m%d}", lo, hi)
        existing.append(part)
        found.append(part)
    return found


def ensure(cur: Any, now: datetime, period: str, ahead: int) -> list[str]:
    """Make the partitions :func:`unmade` names, moving the default partition's rows of
    their periods into them. The partitions made."""
    made = unmade(cur, now, period, ahead)
    for part in made:
        _attach(cur, part.name, part.start, part.end)  # type: ignore[arg-type]
    return [p.name for p in made]


def to_make(now: datetime, period: str, ahead: int, using: str = "default") -> list[Partition]:
    """:func:`unmade`, read in a transaction of its own: what a dry run of the prune
    plans as if made."""
    with transaction.atomic(using=using), connections[using].cursor() as cur:
        return unmade(cur, now, period, ahead)


def relation(part: Partition, made: bool = True) -> str:
    """The rows of ``part`` as a relation of a query: its table, or, for a partition
    not ``made`` yet, the default partition's rows of its period (which making it
    moves there)."""
    if made:
        return part.name
    assert part.start is not None and part.end is not None
    return (f"(SELECT * FROM {DEFAULT} WHERE at >= '{part.start.isoformat()}' "
            f"AND at < '{part.end.isoformat()}')")


def prepare(now: datetime, period: str, ahead: int, using: str = "default") -> list[str]:
    """:func:`ensure` in a transaction of its own; what the prune runs first."""
    with transaction.atomic(using=using), connections[using].cursor() as cur:
        return ensure(cur, now, period, ahead)


def _attach(cur: Any, name: str, lo: datetime, hi: datetime) -> None:
    """One new partition ``[lo, hi)``, with the default partition's rows of that range
    moved into it, in one transaction (the caller's, or this statement's own): attaching
    checks that the default partition holds no row of the range any more."""
    bounds = [lo, hi]
    cur.execute(f"CREATE TABLE {name} (LIKE {COMMIT.name} INCLUDING DEFAULTS)")
    cur.execute(
        f"WITH moved AS (DELETE FROM {DEFAULT} WHERE at >= %s AND at < %s RETURNING *) "
        f"INSERT INTO {name} SELECT * FROM moved",
        bounds,
    )
    cur.execute(
        f"ALTER TABLE {COMMIT.name} ATTACH PARTITION {name} FOR VALUES FROM (%s) TO (%s)",
        bounds,
    )
