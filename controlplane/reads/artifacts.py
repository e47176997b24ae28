"""Reading an artifact a session's record references (:mod:`kernel.artifacts`): its
bytes, their hash checked, for the dashboard's download."""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connection

from controlplane.process.kernel import process_kernel
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
