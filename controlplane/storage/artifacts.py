"""Artifacts in Postgres (:mod:`kernel.artifacts`): one row per digest, its bytes in a
``bytea`` column (TOASTed, compressed), written by one ``INSERT``, so an artifact is
stored completely or not at all; the hash is checked on every read.

A sweep removes artifacts older than the grace period that no record references: no
entry's payload, no document version's ops or baseline (the values kept apart,
:mod:`kernel.large_values`, and what their stand-ins hold), no input, checkpoint or
signals of a task that has not ended nor outcome of its ended children
(:data:`kernel.artifacts.TASK_FIELDS`). Finding references reads those columns as text
(no index holds them): a maintenance job's cost, proportional to the entries, document
versions and tasks that have not ended, run rarely and in batches.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta

from django.db import connections

from controlplane.storage.connection import HotCursor
from kernel.artifacts import GRACE, TASK_FIELDS, MissingArtifact, check, digest_of

ARTIFACT_INSERT = (
    "INSERT INTO kernel_artifact (digest, data, media_type, size, created_at) "
    "VALUES (%s, %s, %s, %s, now()) "
    # Stored again: whole (over any bytes that no longer match, should a row be damaged),
    # and the grace period starts over, so a sweep cannot remove it before the record
    # about to reference it commits.
    "ON CONFLICT (digest) DO UPDATE SET data = EXCLUDED.data, created_at = now()"
)
ARTIFACT_INSERT_UNFLUSHED = ARTIFACT_INSERT.replace(
    "VALUES (%s, %s, %s, %s, now()) ",
    # Its own transaction commits without waiting for its WAL to reach the disk: the
    # record that references it commits after it on this same server (the sweep reads
    # both tables in one query), and that commit's flush covers every WAL record before
    # its own. A crash before then loses only an artifact nothing references yet.
    "SELECT %s, %s, %s, %s, now() "
    "FROM (SELECT set_config('synchronous_commit', 'off', true)) AS unflushed ",
)
ARTIFACT_DATA = "SELECT data FROM kernel_artifact WHERE digest = %s"
ARTIFACT_MEDIA_TYPE = "SELECT media_type FROM kernel_artifact WHERE digest = %s"
ARTIFACTS_OLDER = (
    "SELECT digest, created_at FROM kernel_artifact WHERE created_at < %s "
    "AND (created_at, digest) > (%s, %s) ORDER BY created_at, digest LIMIT %s"
)
ARTIFACTS_REFERENCED = (
    # What tasks name (kernel.artifacts.TASK_FIELDS) is read once per batch, each live
    # task's fields as one text and its ended children's outcomes through their index,
    # then searched for each digest: ended tasks, which a prune never removes, are
    # never scanned.
    "WITH live AS MATERIALIZED (SELECT id, concat_ws(' ', "
    + ", ".join(f"{name}::text" for name in TASK_FIELDS)
    + ") AS named FROM kernel_task WHERE status <> 'terminal'), "
    "named AS MATERIALIZED (SELECT named FROM live UNION ALL "
    "SELECT c.outcome::text FROM live JOIN kernel_task c ON c.parent_id = live.id "
    "WHERE c.status = 'terminal' AND c.outcome IS NOT NULL) "
    "SELECT d FROM unnest(%s::text[]) AS d WHERE EXISTS "
    "(SELECT 1 FROM kernel_entry e WHERE strpos(e.payload::text, d) > 0) OR EXISTS "
    "(SELECT 1 FROM kernel_document_version v WHERE strpos(v.ops::text, d) > 0 "
    "OR strpos(coalesce(v.baseline::text, ''), d) > 0) OR EXISTS "
    "(SELECT 1 FROM named n WHERE strpos(n.named, d) > 0)"
)
ARTIFACTS_DELETE = "DELETE FROM kernel_artifact WHERE digest = ANY(%s) AND created_at < %s"
SWEEP_BATCH = 500


class PostgresArtifacts:
    def __init__(self, using: str = "default") -> None:
        self.using = using

    def put(self, data: bytes, media_type: str) -> str:
        digest = digest_of(data)
        connection = connections[self.using]
        # Inside a caller's transaction the setting would hold for all of it: there the
        # row is as durable as that transaction.
        insert = ARTIFACT_INSERT if connection.in_atomic_block else ARTIFACT_INSERT_UNFLUSHED
        connection.ensure_connection()
        # Bound server-side: the bytes go as a binary parameter. Django's cursors bind
        # client-side, which sends them as a hex literal inside the statement's text, twice
        # their size, for the server to parse.
        HotCursor(connection).execute(insert, [digest, data, media_type, len(data)])
        return digest

    def get(self, digest: str) -> bytes:
        with connections[self.using].cursor() as cur:
            cur.execute(ARTIFACT_DATA, [digest])
            row = cur.fetchone()
        if row is None:
            raise MissingArtifact(f"no artifact {digest}")
        return check(digest, bytes(row[0]))

    def media_type(self, digest: str) -> str:
        with connections[self.using].cursor() as cur:
            cur.execute(ARTIFACT_MEDIA_TYPE, [digest])
            row = cur.fetchone()
        if row is None:
            raise MissingArtifact(f"no artifact {digest}")
        return str(row[0])

    def sweep(self, referenced: Callable[[Iterable[str]], set[str]], now: datetime,
              grace: timedelta = GRACE) -> int:
        before = now - grace
        removed = 0
        # Batch after batch, oldest first, to the end: the oldest artifacts are the ones
        # records keep referencing, so a sweep of the first batch alone would meet them
        # at every run and never reach an unreferenced one stored after them.
        after: tuple[datetime, str] = (datetime.min.replace(tzinfo=UTC), "")
        with connections[self.using].cursor() as cur:
            while True:
                cur.execute(ARTIFACTS_OLDER, [before, *after, SWEEP_BATCH])
                rows = cur.fetchall()
                if not rows:
                    return removed
                after = (rows[-1][1], rows[-1][0])
                old = [row[0] for row in rows]
                kept = referenced(old)
                gone = [d for d in old if d not in kept]
                if gone:
                    cur.execute(ARTIFACTS_DELETE, [gone, before])
                    removed += cur.rowcount

    def referenced(self, digests: Iterable[str]) -> set[str]:
        """Which of ``digests`` some record names (:func:`referenced_artifacts`)."""
        return referenced_artifacts(digests, self.using)


def referenced_artifacts(digests: Iterable[str], using: str = "default") -> set[str]:
    """Which of ``digests`` some entry's payload, document version, task that has not
    ended or ended child of one names (the records are in Postgres whichever store holds
    the artifacts' bytes)."""
    with connections[using].cursor() as cur:
        cur.execute(ARTIFACTS_REFERENCED, [list(digests)])
        return {row[0] for row in cur.fetchall()}
