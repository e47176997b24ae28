"""Artifacts in Postgres: stored whole by one statement, read with their hash checked, a
damaged row refused with a clear error, old unreferenced ones swept; the dashboard shows
a large result's reference on its card and downloads it for whoever may read the
session, and refuses a corrupt one."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext

from controlplane.storage.artifacts import PostgresArtifacts
from controlplane.worker.runtime import runtime
from kernel import Draft, Scheduler
from kernel.artifacts import (
    REFERENCE,
    CorruptArtifact,
    MissingArtifact,
    digest_of,
    encoded,
    load,
    offload,
)
from kernel.retention import RetentionPolicy

from .api_kinds import with_test_kinds
from .clients import client_as
from .sessions import LONG_TEXT, REPORT, session_with_a_large_result, session_with_large_entries

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_artifact_round_trips_with_its_hash_checked_and_a_damaged_one_is_refused() -> None:
    store = PostgresArtifacts()
    reference = offload(store, REPORT, 4_096)
    assert load(store, reference) == REPORT
    again = offload(store, REPORT, 4_096)
    assert again[REFERENCE] == reference[REFERENCE]
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM kernel_artifact")
        assert cur.fetchone()[0] == 1  # stored once
        cur.execute("UPDATE kernel_artifact SET data = %s WHERE digest = %s",
                    [b'{"rows": []}', reference[REFERENCE]])
    with pytest.raises(CorruptArtifact, match=f"artifact {reference[REFERENCE]} is corrupt"):
        load(store, reference)
    offload(store, REPORT, 4_096)  # stored again, whole
    assert load(store, reference) == REPORT
    with pytest.raises(MissingArtifact):
        store.get("sha256:" + "1" * 64)


def test_the_sweep_keeps_referenced_and_young_artifacts() -> None:
    session_id, conversation, reference = session_with_a_large_result()
    store = PostgresArtifacts()
    orphan = store.put(b"a dead writer's", "text/plain")
    with connection.cursor() as cur:
        cur.execute("SELECT now()")
        now = cur.fetchone()[0]
    assert store.sweep(store.referenced, now) == 0  # both too young
    later = now + timedelta(hours=2)
    assert store.sweep(store.referenced, later) == 1
    with pytest.raises(MissingArtifact):
        store.get(orphan)
    assert load(store, reference) == REPORT


def test_the_sweep_reaches_unreferenced_artifacts_behind_a_batch_of_referenced_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The oldest artifacts are the ones kept longest: referenced ones. A sweep that
    looked at the oldest batch only would find them again at every run, and never reach
    an unreferenced one stored after them."""
    import controlplane.storage.artifacts as artifacts

    monkeypatch.setattr(artifacts, "SWEEP_BATCH", 2)
    store = PostgresArtifacts()
    referenced = [offload(store, {"n": n, "rows": "x" * 5_000}, 100)[REFERENCE]
                  for n in range(3)]
    orphan = store.put(b"a dead writer's", "text/plain")
    with connection.cursor() as cur:  # the referenced ones oldest, all past the grace
        cur.execute("UPDATE kernel_artifact SET created_at = now() - interval '3 hours' "
                    "WHERE digest = ANY(%s)", [referenced])
        cur.execute("UPDATE kernel_artifact SET created_at = now() - interval '2 hours' "
                    "WHERE digest = %s", [orphan])
        cur.execute("SELECT now()")
        now = cur.fetchone()[0]

    def every_but_the_orphan(digests: Iterable[str]) -> set[str]:
        return {d for d in digests if d != orphan}  # what records reference, here

    assert store.sweep(every_but_the_orphan, now) == 1
    with pytest.raises(MissingArtifact):
        store.get(orphan)
    assert all(store.get(d) for d in referenced)


def test_beat_sweeps_the_unreferenced_artifacts_daily(settings: object) -> None:
    from controlplane.celery import ARTIFACT_SWEEP, app
    from controlplane.worker.execution import sweep_artifacts

    (entry,) = [e for e in app.conf.beat_schedule.values() if e["task"] == ARTIFACT_SWEEP]
    assert entry["schedule"].hour == {settings.KERNEL_PRUNE_HOUR}  # type: ignore[attr-defined]
    _, _, reference = session_with_a_large_result()
    store = runtime().kernel.artifacts
    orphan = store.put(b"what a writer that died before its commit left", "text/plain")
    young = store.put(b"stored a moment ago: its reference may be coming", "text/plain")
    with connection.cursor() as cur:  # both stored before the grace period
        cur.execute("UPDATE kernel_artifact SET created_at = now() - interval '2 hours' "
                    "WHERE digest = ANY(%s)", [[orphan, reference[REFERENCE]]])
    assert sweep_artifacts() == {"removed": 1}  # what beat's message runs
    with pytest.raises(MissingArtifact):
        store.get(orphan)
    assert load(store, reference) == REPORT
    assert store.get(young).startswith(b"stored")


def test_the_daily_sweep_keeps_what_a_sleeping_task_names_until_it_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An artifact only a task's input names, past the grace period: kept while the task
    sleeps, swept by the next run once it has ended."""
    from controlplane.commands import sweep_artifacts

    kernel = with_test_kinds(monkeypatch)
    reference = offload(kernel.artifacts, REPORT, 4_096)
    handle = kernel.create_session()
    draft = Draft(actor="user:test")
    task_id = draft.create_task("api-step", {"sleep": True, "report": reference})
    handle.commit(draft)
    Scheduler(kernel, "w1", 30.0).run_until_idle()
    assert not kernel.task(task_id).terminal
    with connection.cursor() as cur:
        cur.execute("UPDATE kernel_artifact SET created_at = now() - interval '2 hours'")
    assert sweep_artifacts() == 0
    assert load(kernel.artifacts, kernel.task(task_id).input["report"]) == REPORT
    draft = Draft(actor="user:test")
    draft.cancel(task_id, "done with it")
    kernel.open(handle.id).commit(draft)
    Scheduler(kernel, "w1", 30.0).run_until_idle()
    assert kernel.task(task_id).shown_status == "cancelled"
    assert sweep_artifacts() == 1


def test_the_dashboard_shows_and_downloads_an_artifact_for_readers_only() -> None:
    session_id, conversation, reference = session_with_a_large_result()
    digest = reference[REFERENCE]
    url = f"/sessions/{session_id}/artifacts/{digest}"
    viewer = client_as("vic", "viewer")
    page = viewer.get(f"/sessions/{session_id}/").content.decode()
    assert f'href="{url}"' in page and "&lt;b&gt;bold" in page  # the excerpt, escaped
    answer = viewer.get(url)
    assert answer.status_code == 200
    assert answer["Content-Type"] == "application/json"
    assert "attachment" in answer["Content-Disposition"]
    assert json.loads(b"".join(answer)) == REPORT
    assert Client().get(url).status_code == 302  # to the login page
    other, _, _ = session_with_a_large_result()
    assert viewer.get(f"/sessions/{other}/artifacts/{'sha256:' + '2' * 64}").status_code == 404
    with connection.cursor() as cur:
        cur.execute("UPDATE kernel_artifact SET data = %s WHERE digest = %s",
                    [b"{}", digest])
    refused = viewer.get(url)
    assert refused.status_code == 500 and b"is corrupt" in refused.content


def test_the_dashboard_links_an_entry_stored_apart_and_downloads_it() -> None:
    session_id, conversation, (user, answer) = session_with_large_entries()
    text = digest_of(encoded(LONG_TEXT))
    said = digest_of(encoded("**Read.** " + LONG_TEXT))
    progress = digest_of(encoded(LONG_TEXT[::-1]))
    viewer = client_as("vic", "viewer")
    page = viewer.get(f"/sessions/{session_id}/").content.decode()
    for digest in (text, said):
        assert f'href="/sessions/{session_id}/artifacts/{digest}"' in page
    assert f"entry {user} (user) payload field &#x27;text&#x27;" in page
    assert "word0 &lt;i&gt;&lt;script&gt;" in page  # its beginning, escaped
    assert "word999" not in page  # not the whole text
    for digest, value in ((text, LONG_TEXT), (progress, LONG_TEXT[::-1])):
        answer_ = viewer.get(f"/sessions/{session_id}/artifacts/{digest}")
        assert answer_.status_code == 200  # a document version's reference counts too
        assert json.loads(b"".join(answer_)) == value
    kernel = runtime().kernel
    assert [e.payload["text"] for e in kernel.entries(conversation)] == [
        LONG_TEXT, "**Read.** " + LONG_TEXT]  # the kernel reads them whole
    other, _, _ = session_with_a_large_result()
    assert viewer.get(f"/sessions/{other}/artifacts/{text}").status_code == 404
    store = PostgresArtifacts()
    with connection.cursor() as cur:
        cur.execute("UPDATE kernel_artifact SET created_at = now() - interval '2 hours'")
        cur.execute("SELECT now()")
        now = cur.fetchone()[0]
    assert store.referenced([text, said, progress]) == {text, said, progress}
    assert store.sweep(store.referenced, now) == 0


def test_an_artifact_alone_does_not_wait_for_its_flush_but_a_callers_transaction_does() -> None:
    """Put on its own, an artifact's transaction commits without waiting for the disk
    (the record referencing it commits after it, and that flush covers it); inside a
    caller's transaction the caller's own durability is left as it was."""
    store = PostgresArtifacts()
    with connection.cursor() as cur:
        cur.execute("CREATE TABLE probe_setting (setting text)")
        cur.execute(
            "CREATE FUNCTION probe_setting() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "INSERT INTO probe_setting VALUES (current_setting('synchronous_commit')); "
            "RETURN NEW; END $$")
        cur.execute("CREATE TRIGGER probe_setting AFTER INSERT OR UPDATE ON kernel_artifact "
                    "FOR EACH ROW EXECUTE FUNCTION probe_setting()")
    try:
        store.put(b"alone", "text/plain")
        with transaction.atomic():
            store.put(b"inside", "text/plain")
            with connection.cursor() as cur:
                cur.execute("SHOW synchronous_commit")
                inside_after = cur.fetchone()[0]
        with connection.cursor() as cur:
            cur.execute("SELECT setting FROM probe_setting")
            assert [row[0] for row in cur.fetchall()] == ["off", "on"]
        assert inside_after == "on"
        assert store.get(digest_of(b"alone")) == b"alone"
    finally:
        with connection.cursor() as cur:
            cur.execute("DROP TRIGGER probe_setting ON kernel_artifact")
            cur.execute("DROP FUNCTION probe_setting()")
            cur.execute("DROP TABLE probe_setting")


def test_an_artifacts_bytes_go_as_a_parameter_not_inside_the_statement_text() -> None:
    """Bound server-side: the bytes are sent as a binary parameter, not spelled as a hex
    literal inside the statement (twice their size, parsed by the server on every put)."""
    store = PostgresArtifacts()
    data = bytes(range(256)) * 64
    with CaptureQueriesContext(connection) as captured:
        digest = store.put(data, "application/octet-stream")
    assert captured.captured_queries
    assert all(len(q["sql"]) < len(data) for q in captured.captured_queries), [
        len(q["sql"]) for q in captured.captured_queries]
    assert store.get(digest) == data


def test_a_task_page_says_retention_removed_an_artifact_its_outcome_references(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A task's outcome holds a large result's reference, as the transcript's entry
    does. Once a prune removed the entries and the sweep the artifact, the outcome still
    names it: the task page says that retention removed it instead of linking to it."""
    kernel = with_test_kinds(monkeypatch)
    store = kernel.artifacts
    assert isinstance(store, PostgresArtifacts)
    session_id, conversation, reference = session_with_a_large_result()
    handle = kernel.open(session_id)
    draft = Draft(actor="user:test")
    task_id = draft.create_task("api-step", {"ask": True})
    handle.commit(draft)
    Scheduler(kernel).run_until_idle()
    draft = Draft(actor="user:test")
    draft.signal(task_id, "resolution-1", reference)
    handle.commit(draft)
    Scheduler(kernel).run_until_idle()
    assert kernel.task(task_id).outcome["result"] == reference
    url = f"/sessions/{session_id}/artifacts/{reference[REFERENCE]}"
    viewer = client_as("vic", "viewer")
    page = viewer.get(f"/tasks/{task_id}/").content.decode()
    assert f'href="{url}"' in page and "retention removed" not in page

    with connection.cursor() as cur:
        cur.execute("UPDATE kernel_artifact SET created_at = now() - interval '2 hours'")
        cur.execute("SELECT now()")
        now = cur.fetchone()[0]
    pruned = kernel.storage.prune(RetentionPolicy(days=0), now + timedelta(seconds=1))
    assert pruned.sessions == 1 and kernel.entries(conversation) == []
    page = viewer.get(f"/tasks/{task_id}/").content.decode()  # not swept yet: no link
    assert f'href="{url}"' not in page and "next sweep removes it" in page
    assert store.sweep(store.referenced, now) == 1
    page = viewer.get(f"/tasks/{task_id}/").content.decode()
    assert f'href="{url}"' not in page
    assert f"artifact {reference[REFERENCE]}" in page and "retention removed it" in page
    assert viewer.get(url).status_code == 404
