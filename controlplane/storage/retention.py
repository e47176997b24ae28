"""Retention on Postgres: the kernel's prune (:mod:`kernel.retention`) with partitions.

1. Find the finished sessions (every task terminal, every submission settled) with
   history not pruned yet, and keep those the policy says are due.
2. Plan: a partition of the commit log that ended before now is dropped whole when
   every row in it is prunable (its session is due, or the row is at or below its
   session's ``pruned_seq`` already and has no key: a trim keeps keyed rows). A dry
   run plans the partitions the run makes first as made (``unmade``).
3. Per batch of sessions, one transaction: lock the session rows (every commit takes
   that lock, so nothing commits meanwhile) and keep those whose head did not move since
   step 1 (every change to a task or submission is a commit, so they are still
   finished); set ``pruned_seq`` to the head; delete their entries, their documents'
   versions older than the newest baseline, and their commits outside the planned
   partitions. A reader sees the whole history, or the marker and no history.
4. Drop each planned partition, after checking again that every row in it is at or
   below its session's marker, and keyed only if this prune pruned its session, under
   a lock that keeps rows out and a short lock timeout (a drop that must wait is left
   for the next run). A planned partition that cannot be dropped has its pruned rows
   deleted instead.

Trimming a live session (:func:`trim`) is one transaction that holds the session row's
lock, as a commit does: it deletes that session's rows only, by index.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import OperationalError, transaction

from controlplane.storage.partitions import Partition, partitions, relation
from controlplane.storage.schema import (
    COMMIT,
    DOCUMENT_HEAD,
    DOCUMENT_VERSION,
    ENTRY,
    SESSION,
    SUBMISSION,
    TASK,
    json_from_text,
)
from kernel.errors import UnknownRecord
from kernel.records import SETTLED_SUBMISSIONS, Status
from kernel.retention import (
    Progress,
    PruneReport,
    RetentionPolicy,
    TrimReport,
    finished_status,
)

BATCH = 500
"""Sessions pruned per transaction."""
LOCK_TIMEOUT = "2s"
"""How long dropping a partition may wait for its locks (feed reads and commits queue
behind a drop that waits)."""

# A session with history left: commits after its marker, or, trimmed up to its head,
# the keyed commit rows and the entries a trim keeps.
FINISHED = (
    f"SELECT s.id, s.head_seq, s.metadata, s.last_commit_at, ARRAY(SELECT DISTINCT "
    f"t.outcome->>'kind' FROM {TASK.name} t WHERE t.session_id = s.id AND t.parent_id IS NULL) "
    f"FROM {SESSION.name} s WHERE s.last_commit_at < %(now)s "
    f"AND (s.head_seq > s.pruned_seq OR EXISTS (SELECT FROM {COMMIT.name} c "
    f"WHERE c.session_id = s.id) OR EXISTS (SELECT FROM {ENTRY.name} e "
    "WHERE e.session_id = s.id)) "
    f"AND NOT EXISTS (SELECT FROM {TASK.name} t WHERE t.session_id = s.id "
    f"AND t.status <> '{Status.TERMINAL}') "
    f"AND NOT EXISTS (SELECT FROM {SUBMISSION.name} b WHERE b.session_id = s.id "
    "AND b.status <> ALL(%(settled)s)) ORDER BY s.id"
)
DUE = "unnest(%(ids)s::text[], %(heads)s::bigint[]) AS due(id, head_seq)"
# A row is prunable when its session is due now, or it is below its session's marker
# and has no key: a trim keeps a live session's keyed rows below its marker, so that a
# commit retried with that key is still refused.
UNPRUNABLE_ROWS = (
    "SELECT FROM {partition} c JOIN " + SESSION.name + " s ON s.id = c.session_id "
    f"LEFT JOIN {DUE} ON due.id = c.session_id "
    "WHERE c.seq > greatest(s.pruned_seq, coalesce(due.head_seq, 0)) "
    "OR (c.key IS NOT NULL AND due.id IS NULL)"
)
COUNT_ROWS = "SELECT count(*), coalesce(max(c.id), 0) FROM {partition} c"
LOCK_SESSIONS = (
    f"SELECT s.id FROM {SESSION.name} s JOIN {DUE} ON due.id = s.id "
    "WHERE s.head_seq = due.head_seq ORDER BY s.id FOR UPDATE OF s"
)
MARK = f"UPDATE {SESSION.name} SET pruned_seq = head_seq WHERE id = ANY(%s)"
DELETE_ENTRIES = f"DELETE FROM {ENTRY.name} WHERE session_id = ANY(%s)"
COUNT_ENTRIES = f"SELECT count(*) FROM {ENTRY.name} WHERE session_id = ANY(%s)"
_OLD_VERSIONS = (
    f"{DOCUMENT_HEAD.name} d WHERE v.document_id = d.id AND d.session_id = ANY(%s) "
    "AND v.version < d.baseline_version"
)
DELETE_VERSIONS = f"DELETE FROM {DOCUMENT_VERSION.name} v USING {_OLD_VERSIONS}"
COUNT_VERSIONS = f"SELECT count(*) FROM {DOCUMENT_VERSION.name} v, {_OLD_VERSIONS}"
DELETE_PRUNED = (
    "DELETE FROM {partition} c USING " + SESSION.name + " s "
    "WHERE s.id = c.session_id AND c.seq <= s.pruned_seq "
    "AND (c.key IS NULL OR c.session_id = ANY(%(ids)s))"
)


@dataclass(frozen=True)
class Due:
    ids: list[str]
    heads: list[int]

    def params(self) -> dict[str, Any]:
        return {"ids": self.ids, "heads": self.heads}

    def batches(self) -> Iterator[Due]:
        for start in range(0, len(self.ids), BATCH):
            yield Due(self.ids[start:start + BATCH], self.heads[start:start + BATCH])


def due_sessions(cur: Any, policy: RetentionPolicy, now: datetime) -> Due:
    cur.execute(FINISHED, {"now": now, "settled": [str(s) for s in SETTLED_SUBMISSIONS]})
    found = [
        (session_id, head)
        for session_id, head, metadata, last, outcomes in cur.fetchall()
        if policy.due(json_from_text(metadata), finished_status(outcomes), last, now)
    ]
    return Due([i for i, _ in found], [h for _, h in found])


def _outside(planned: Sequence[Partition]) -> tuple[str, list[Any]]:
    """A predicate on ``at`` that leaves out the planned partitions' ranges."""
    if not planned:
        return "", []
    ranges = " OR ".join(["(at >= %s AND at < %s)"] * len(planned))
    return f" AND NOT ({ranges})", [b for p in planned for b in (p.start, p.end)]


ONE_AT_A_TIME = "SELECT pg_try_advisory_lock(hashtext('kernel_prune'))"
DONE = "SELECT pg_advisory_unlock(hashtext('kernel_prune'))"


class PruneRunning(Exception):
    """Another prune holds the lock (two beats, or a manual run during beat's)."""


def prune(
    db: Any, policy: RetentionPolicy, now: datetime, dry_run: bool, progress: Progress,
    unmade: Sequence[Partition] = (),
) -> PruneReport:
    """``unmade``: the partitions the run makes before it prunes
    (:func:`controlplane.commands.prune`), which a dry run, making none, plans as if
    they were made, their rows moved there from the default partition."""
    with db.cursor() as cur:
        cur.execute(ONE_AT_A_TIME)
        if not cur.fetchone()[0]:
            raise PruneRunning("another prune is running; this one did nothing")
        try:
            return _prune(db, cur, policy, now, dry_run, progress,
                          unmade if dry_run else ())
        finally:
            cur.execute(DONE)


def _prune(
    db: Any, cur: Any, policy: RetentionPolicy, now: datetime, dry_run: bool,
    progress: Progress, unmade: Sequence[Partition],
) -> PruneReport:
    report = PruneReport(dry_run=dry_run)
    due = due_sessions(cur, policy, now)
    progress(f"{len(due.ids)} finished session(s) due for pruning")
    planned, sizes = [], {}
    for part in [*partitions(cur), *unmade]:
        if part.is_default or part.end is None or part.end > now:
            continue
        found = relation(part, made=part not in unmade)
        cur.execute(UNPRUNABLE_ROWS.format(partition=found) + " LIMIT 1", due.params())
        if cur.fetchone() is None:
            cur.execute(COUNT_ROWS.format(partition=found))
            sizes[part.name] = cur.fetchone()
            planned.append(part)
    progress(f"{len(planned)} partition(s) of the commit log to drop whole")
    outside, bounds = _outside(planned)
    delete_commits = f"DELETE FROM {COMMIT.name} WHERE session_id = ANY(%s){outside}"
    count_commits = f"SELECT count(*) FROM {COMMIT.name} WHERE session_id = ANY(%s){outside}"
    pruned = Due([], [])
    for batch in due.batches():
        with transaction.atomic(using=db.alias):
            if dry_run:
                ids = batch.ids
            else:
                cur.execute(LOCK_SESSIONS, batch.params())
                ids = [row[0] for row in cur.fetchall()]
                report.skipped += len(batch.ids) - len(ids)
                cur.execute(MARK, [ids])
                heads = dict(zip(batch.ids, batch.heads, strict=True))
                pruned.ids.extend(ids)
                pruned.heads.extend(heads[i] for i in ids)
            for counter, count, delete, params in (
                ("entries", COUNT_ENTRIES, DELETE_ENTRIES, [ids]),
                ("document_versions", COUNT_VERSIONS, DELETE_VERSIONS, [ids]),
                ("commits", count_commits, delete_commits, [ids, *bounds]),
            ):
                if dry_run:
                    cur.execute(count, params)
                    removed = cur.fetchone()[0]
                else:
                    cur.execute(delete, params)
                    removed = cur.rowcount
                setattr(report, counter, getattr(report, counter) + removed)
            report.sessions += len(ids)
        progress(f"pruned {report.sessions} of {len(due.ids)} session(s)")
    for part in planned:
        rows, _ = sizes[part.name]
        if dry_run:
            report.partitions.append(part.name)
            report.partition_commits += rows
        elif _drop(db, cur, part, sizes[part.name], pruned):
            report.partitions.append(part.name)
            report.partition_commits += rows
            progress(f"dropped {part.name} ({rows} commit(s))")
        else:
            cur.execute(DELETE_PRUNED.format(partition=part.name), {"ids": pruned.ids})
            report.commits += cur.rowcount
            progress(f"kept {part.name}: it changed or was busy; deleted its pruned rows")
    progress(report.summary())
    return report


def _drop(db: Any, cur: Any, part: Partition, size: tuple[int, int], pruned: Due) -> bool:
    """Drop a planned partition if it still holds only pruned rows (``pruned``: the
    sessions this prune pruned, at their heads) and the rows counted when it was planned
    (SHARE keeps inserts out while this checks); False otherwise."""
    try:
        with transaction.atomic(using=db.alias):
            cur.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
            cur.execute(f"LOCK TABLE {part.name} IN SHARE MODE")
            cur.execute(COUNT_ROWS.format(partition=part.name))
            if tuple(cur.fetchone()) != tuple(size):
                return False
            cur.execute(UNPRUNABLE_ROWS.format(partition=part.name) + " LIMIT 1",
                        pruned.params())
            if cur.fetchone() is not None:
                return False
            cur.execute(f"DROP TABLE {part.name}")
            return True
    except OperationalError:  # the lock timeout: leave it for the next run
        return False


TRIM_LOCK = (
    f"UPDATE {SESSION.name} SET pruned_seq = greatest(pruned_seq, least(%(upto)s, head_seq)) "
    "WHERE id = %(session)s RETURNING pruned_seq, least(%(upto)s, head_seq)"
)
TRIM_COMMITS = (
    f"DELETE FROM {COMMIT.name} WHERE session_id = %(session)s AND seq <= %(upto)s "
    "AND key IS NULL"
)
# Emptied documents of the named kinds: their current version is a baseline of {} at
# the kind's registered version, written at or before the trim's seq.
EMPTIED = (
    f"SELECT d.id FROM {DOCUMENT_HEAD.name} d "
    "JOIN unnest(%(kinds)s::text[], %(versions)s::int[]) AS f(kind, version) "
    "ON f.kind = d.kind AND f.version = d.kind_version "
    f"JOIN {DOCUMENT_VERSION.name} v ON v.document_id = d.id AND v.version = d.version "
    "WHERE d.session_id = %(session)s AND d.updated_seq <= %(upto)s "
    "AND d.baseline_version = d.version AND v.has_baseline AND v.baseline = '{}'::jsonb"
)
FORGET_VERSIONS = f"DELETE FROM {DOCUMENT_VERSION.name} WHERE document_id = ANY(%(ids)s)"
FORGET_HEADS = f"DELETE FROM {DOCUMENT_HEAD.name} WHERE id = ANY(%(ids)s)"
SUPERSEDED = (
    f"DELETE FROM {DOCUMENT_VERSION.name} v USING ("
    f"SELECT b.document_id, max(b.version) AS version FROM {DOCUMENT_VERSION.name} b "
    f"JOIN {DOCUMENT_HEAD.name} d ON d.id = b.document_id "
    "WHERE d.session_id = %(session)s AND b.has_baseline AND b.seq <= %(upto)s "
    "GROUP BY b.document_id) newest "
    "WHERE v.document_id = newest.document_id AND v.version < newest.version"
)


def trim(db: Any, session_id: str, upto_seq: int, forget: Mapping[str, int]) -> TrimReport:
    """:meth:`kernel.storage.Storage.trim` in one transaction."""
    with transaction.atomic(using=db.alias), db.cursor() as cur:
        cur.execute(TRIM_LOCK, {"session": session_id, "upto": upto_seq})
        row = cur.fetchone()
        if row is None:
            raise UnknownRecord(f"no session {session_id}")
        report = TrimReport(pruned_seq=row[0])
        params = {"session": session_id, "upto": row[1]}
        cur.execute(TRIM_COMMITS, params)
        report.commits = cur.rowcount
        if forget:
            kinds = sorted(forget)
            cur.execute(EMPTIED, {**params, "kinds": kinds,
                                  "versions": [forget[k] for k in kinds]})
            ids = [r[0] for r in cur.fetchall()]
            if ids:
                cur.execute(FORGET_VERSIONS, {"ids": ids})
                cur.execute(FORGET_HEADS, {"ids": ids})
                report.documents = cur.rowcount
        cur.execute(SUPERSEDED, params)
        report.document_versions = cur.rowcount
        return report
