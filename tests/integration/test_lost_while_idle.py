"""A connection the server closed while it sat idle (a restart, an administrator, an
idle timeout) is found before a commit that reads nothing is sent on it: the commit is
"unavailable, nothing written", not "sent, outcome unknown", and the storage's
``before_write`` point is not reached, as on the general path, whose reads meet the
loss first (and as the in-memory reference's lost connection says)."""

from __future__ import annotations

import psycopg
import pytest
from django.db import connection

from controlplane.storage import PostgresStorage
from kernel import Draft, Kernel, ManualClock, Registry, StorageUnavailable
from tests.databases import url_of_test_database

pytestmark = pytest.mark.django_db(transaction=True)


def kill_while_idle() -> None:
    connection.ensure_connection()
    pid = connection.connection.info.backend_pid
    with psycopg.connect(url_of_test_database(), autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s, 5000)", [pid])  # waits until gone


def registry() -> Registry:
    found = Registry()
    found.document("notes")

    @found.task("noted")
    class Noted:
        initial = "go"

        def go(self, run):  # type: ignore[no-untyped-def]
            return run.succeed({})

    return found


@pytest.mark.parametrize("kind", ["creates only", "documents only"])
def test_a_read_less_commit_on_a_connection_lost_while_idle_is_unavailable(kind: str) -> None:
    seen: list[str] = []
    storage = PostgresStorage(fault=seen.append)
    kernel = Kernel(storage, registry(), ManualClock())
    handle = kernel.create_session()
    draft = Draft(actor="user:t")
    if kind == "creates only":
        draft.create_task("noted", {})
    else:
        draft.set("notes", "a", ["x"], 1)
    assert draft.kind().value == kind
    head = handle.head_seq
    kill_while_idle()
    seen.clear()
    try:
        with pytest.raises(StorageUnavailable):
            handle.commit(draft)
    finally:
        connection.close()  # as a worker's task boundary closes a lost one
    assert "before_write" not in seen
    assert storage.session(handle.id).head_seq == head
