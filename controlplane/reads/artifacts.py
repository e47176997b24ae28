"""Reading an artifact a session's record references (:mod:`kernel.artifacts`): its
bytes, their hash checked, for the dashboard's download; and whether the artifacts a
task's record names are still there to download."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import connection

from controlplane.process.kernel import process_kernel
from kernel.artifacts import MissingArtifact, references
from kernel.errors import UnknownRecord

REFERENCED_IN_SESSION = (
    "SELECT 1 FROM kernel_entry WHERE session_id = %(session)s "
    "AND strpos(payload::text, %(named)s) > 0 "
    "UNION ALL SELECT 1 FROM kernel_document_version v JOIN kernel_document d "
    "ON d.id = v.document_id WHERE d.session_id = %(session)s "
    "AND (strpos(v.ops::text, %(named)s) > 0 "
    "OR strpos(coalesce(v.baseline::text, ''), %(named)s) > 0) "
    "LIMIT 1"
)


@dataclass(frozen=True)
class Artifact:
    digest: str
    media_type: str
    data: bytes


def artifact(session_id: str, digest: str) -> Artifact:
    """The artifact ``digest`` if a record of ``session_id`` (an entry, a document
    version) references it (who may read the session may read it; a digest the session
    does not name is "no such artifact", whatever other sessions hold). CorruptArtifact
    if its bytes do not match its name."""
    if not digest.startswith("sha256:") or len(digest) != 71:
        raise UnknownRecord(f"no artifact {digest[:80]} in session {session_id}")
    with connection.cursor() as cur:
        cur.execute(REFERENCED_IN_SESSION, {"session": session_id, "named": f'"{digest}"'})
        if cur.fetchone() is None:
            raise UnknownRecord(f"no artifact {digest} in session {session_id}")
    store = process_kernel().artifacts
    assert store is not None
    return Artifact(digest, store.media_type(digest), store.get(digest))


@dataclass(frozen=True)
class Named:
    """An artifact a task's record (its outcome, say) references, as its page shows it."""

    digest: str
    state: str
    """``readable`` (an entry or a document version of the session references it: the
    download serves it), ``removed`` (no longer stored: retention pruned the history
    that referenced it and the sweep removed it), or ``unreferenced`` (stored, but no
    record of the session's history references it any more: the sweep removes it)."""


def named(session_id: str, value: Any) -> list[Named]:
    """The artifacts ``value`` (a record a task holds) references, in order, each with
    what a reader can do with it. An ended task's record is not read by the sweep (it
    reads the entries, document versions and the tasks that have not ended:
    :data:`kernel.artifacts.TASK_FIELDS`), so once retention removed the entries that
    referenced a large result, the task's copy of the reference outlives the artifact."""
    store = process_kernel().artifacts
    assert store is not None
    found = []
    for digest in dict.fromkeys(references(value)):
        try:
            store.media_type(digest)
        except MissingArtifact:
            found.append(Named(digest, "removed"))
            continue
        with connection.cursor() as cur:
            cur.execute(REFERENCED_IN_SESSION, {"session": session_id, "named": f'"{digest}"'})
            kept = cur.fetchone() is not None
        found.append(Named(digest, "readable" if kept else "unreferenced"))
    return found
