"""A commit that only writes documents (no version expected) is built before anything is
read, as if every document were new, and written as one statement: the database advances
the session's head and numbers each existing document's next version, continuing it as
the usual build would. A document that needs its value read (a baseline due, its kind's
version changed) or anything the database refuses sends it down the usual
two-round-trip path, whose build decides and says why.
"""

from __future__ import annotations

import psycopg
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from controlplane.storage import PostgresStorage
from kernel import (
    Draft,
    Kernel,
    ManualClock,
    Registry,
    SessionHandle,
    StorageUnavailable,
    UnknownRecord,
)
from kernel.commit import CommitKind
from kernel.documents import MIN_BASELINE_BYTES
from kernel.errors import DocumentConflict

from .round_trips import counting_pipelines, log_is_whole

pytestmark = pytest.mark.django_db(transaction=True)


def kernel(version: int = 1) -> Kernel:
    registry = Registry()
    registry.document("notes", version=version, migrate=lambda _, value: value)
    registry.document("plan")
    return Kernel(PostgresStorage(), registry, ManualClock())


def commit(handle: SessionHandle, *writes: tuple[str, str, list[str], object]) -> object:
    draft = Draft(actor="user:x")
    for kind, key, path, value in writes:
        draft.set(kind, key, path, value)
    assert draft.kind() is CommitKind.DOCUMENTS_ONLY
    return handle.commit(draft)


def statements(captured: CaptureQueriesContext) -> list[str]:
    return [q["sql"].split(" AS ")[0] for q in captured]


def test_documents_are_written_in_one_statement_numbered_by_the_database() -> None:
    kernel_ = kernel()
    handle = kernel_.create_session()
    first = commit(handle, ("notes", "a", ["x"], 1))
    for _ in range(3):  # the head moves: the build's guess (0) is not it
        commit(handle, ("plan", "other", ["y"], 2))
    with counting_pipelines() as pipelines, CaptureQueriesContext(connection) as captured:
        written = commit(handle, ("notes", "a", ["x"], 2), ("notes", "b", ["z"], 3),
                         ("plan", "p", [], {"whole": True}))
    assert statements(captured) == ["WITH head"] and pipelines == [0]
    seq = written.commit.seq
    assert seq == handle.head_seq == log_is_whole(kernel_, handle.id)[-1] == 5
    a, b, p = written.document_heads
    assert a.id == first.document_heads[0].id  # continued, not made anew
    assert (a.version, a.baseline_version, a.updated_seq) == (2, 1, seq)
    assert (b.version, b.baseline_version, p.version) == (1, 1, 1)
    assert [v.has_baseline for v in written.document_versions] == [False, True, True]
    assert [(i["key"], i["version"]) for i in written.commit.summary] == [
        ("a", 2), ("b", 1), ("p", 1)]
    [stored] = kernel_.commits_after(handle.id, seq - 1)
    assert stored.summary == written.commit.summary and stored.id == written.commit.id
    for head in written.document_heads:
        assert kernel_.storage.document_head(handle.id, head.kind, head.key) == head
    assert kernel_.storage.document_versions(a.id, 2)[1] == written.document_versions[0]
    assert kernel_.document(handle.id, "notes", "a") == {"x": 2}
    assert kernel_.document(handle.id, "plan", "p") == {"whole": True}


def test_a_document_replaced_whole_gets_its_baseline_in_the_one_statement() -> None:
    kernel_ = kernel()
    handle = kernel_.create_session()
    commit(handle, ("notes", "a", ["x"], 1))
    with CaptureQueriesContext(connection) as captured:
        written = commit(handle, ("notes", "a", [], {"fresh": 1}))
    assert statements(captured) == ["WITH head"]
    [head], [version] = written.document_heads, written.document_versions
    assert (head.version, head.baseline_version, head.ops_bytes_since_baseline) == (2, 2, 0)
    assert version.has_baseline and version.baseline == {"fresh": 1}
    assert kernel_.document(handle.id, "notes", "a") == {"fresh": 1}


@pytest.mark.parametrize("what", ["a baseline due", "a newer kind version"])
def test_a_document_that_needs_its_value_read_takes_the_usual_path(what: str) -> None:
    kernel_ = kernel()
    handle = kernel_.create_session()
    commit(handle, ("notes", "a", ["x"], 1))
    half = "x" * (MIN_BASELINE_BYTES // 2)
    if what == "a baseline due":  # ops only so far: the next ops outweigh the baseline
        assert not commit(handle, ("notes", "a", ["big"], half)).document_versions[0].has_baseline
    else:
        kernel_ = kernel(version=2)
        handle = kernel_.open(handle.id)
    before = handle.head_seq
    with counting_pipelines() as pipelines:
        written = commit(handle, ("notes", "a", ["x"], 2), ("notes", "a", ["more"], half),
                         ("notes", "new", ["n"], 1))
    assert pipelines == [2]  # refused in one statement that wrote nothing, then the usual two
    assert written.commit.seq == before + 1 == log_is_whole(kernel_, handle.id)[-1]
    head = written.document_heads[0]
    assert head.baseline_version == head.version and written.document_versions[0].has_baseline
    assert head.kind_version == (2 if what == "a newer kind version" else 1)
    assert kernel_.document(handle.id, "notes", "a")["x"] == 2
    assert kernel_.document(handle.id, "notes", "new") == {"n": 1}


def test_an_expected_version_is_a_general_commit_that_checks_it() -> None:
    kernel_ = kernel()
    handle = kernel_.create_session()
    commit(handle, ("notes", "a", ["x"], 1))
    draft = Draft(actor="user:x")
    draft.update_document("notes", "a", {"op": "set", "path": ["x"], "value": 2},
                          expected_version=0)
    assert draft.kind() is CommitKind.GENERAL
    with pytest.raises(DocumentConflict):
        handle.commit(draft)


def test_documents_in_a_session_that_does_not_exist_land_nothing() -> None:
    kernel_ = kernel()
    handle = kernel_.create_session()
    handle.id = "session_0000000000000000000000000000"
    with pytest.raises(UnknownRecord, match="no session"):
        commit(handle, ("notes", "a", ["x"], 1))
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM kernel_document")
        assert cur.fetchone() == (0,)


def test_a_lost_connection_before_the_statement_is_unavailable_and_lands_nothing() -> None:
    kernel_ = kernel()
    handle = kernel_.create_session()
    commit(handle, ("notes", "a", ["x"], 1))
    connection.ensure_connection()
    pid = connection.connection.info.backend_pid
    settings = connection.settings_dict
    with psycopg.connect(dbname=settings["NAME"], user=settings["USER"] or "postgres",
                         host=settings["HOST"] or None, port=settings["PORT"] or None,
                         password=settings["PASSWORD"] or None, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s, 5000)", [pid])
    with pytest.raises(StorageUnavailable):
        commit(handle, ("notes", "a", ["x"], 2))
    connection.close()
    assert log_is_whole(kernel_, handle.id) == [1]
    assert kernel_.document(handle.id, "notes", "a") == {"x": 1}
