"""Retention on Postgres: the partitioned commit log, its migration, ``manage.py prune``,
whole partitions dropped, and the REST feed's snapshot for a cursor retention passed."""

from __future__ import annotations

import io
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import Client, override_settings

from controlplane import commands
from controlplane.storage import PostgresStorage, partitions
from controlplane.worker.runtime import runtime
from kernel import (
    Draft,
    DuplicateCommit,
    Kernel,
    ManualClock,
    Registry,
    Run,
    Status,
    Transition,
    Worker,
)
from kernel.retention import RetentionPolicy
from tests.conformance.definitions import Effects, make_registry


def db(test: Any) -> Any:
    """A test that commits: its own transactions, and no broker to deliver to."""
    return pytest.mark.django_db(transaction=True)(pytest.mark.usefixtures("offline_broker")(test))


MARCH = datetime(2025, 3, 10, tzinfo=UTC)
APRIL = datetime(2025, 4, 10, tzinfo=UTC)
PLAN = "email-plan"  # a document kind the project registers


@pytest.fixture
def offline_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime().dispatcher, "deliver", lambda task, queue: None)


@pytest.fixture
def past_partitions() -> Iterator[None]:
    """The partitions of March and April 2025, made for the test and gone after it."""
    made = partitions.prepare(MARCH, "month", 1)
    assert made == ["kernel_commit_20250301", "kernel_commit_20250401"]
    yield
    with connection.cursor() as cur:
        for name in made:
            cur.execute(f"DROP TABLE IF EXISTS {name}")


def names() -> list[str]:
    with connection.cursor() as cur:
        return [p.name for p in partitions.partitions(cur)]


def commit_rows(table: str = "kernel_commit") -> list[tuple[Any, ...]]:
    with connection.cursor() as cur:
        cur.execute(f"SELECT id, session_id, seq, at FROM {table} ORDER BY id")
        return list(cur.fetchall())


@db
def test_the_commit_log_is_partitioned_by_month_with_a_default() -> None:
    with connection.cursor() as cur:
        cur.execute("SELECT partstrat FROM pg_partitioned_table "
                    "WHERE partrelid = 'kernel_commit'::regclass")
        assert cur.fetchone() == ("r",)
        found = partitions.partitions(cur)
    assert found[-1].name == partitions.DEFAULT
    now = datetime.now(UTC)
    current = partitions.period_start(now, "month")
    assert any(p.start == current for p in found)  # the migration made this month's
    assert len([p for p in found if p.start and p.start > current]) >= 2  # and two ahead


@db
def test_a_commit_outside_every_period_lands_in_the_default_and_moves_later() -> None:
    kernel = Kernel(PostgresStorage(), make_registry(Effects()), ManualClock(MARCH))
    handle = kernel.create_session()
    draft = Draft(actor="user:ann")
    draft.set("plan", "p", ["n"], 1)
    handle.commit(draft)
    assert len(commit_rows(partitions.DEFAULT)) == 1
    try:
        made = partitions.prepare(APRIL, "month", 0)  # April, and March for its row
        assert made == ["kernel_commit_20250301", "kernel_commit_20250401"]
        assert commit_rows(partitions.DEFAULT) == []
        assert [r[1:3] for r in commit_rows("kernel_commit_20250301")] == [(handle.id, 1)]
        assert partitions.prepare(APRIL, "month", 0) == []  # idempotent
    finally:
        with connection.cursor() as cur:
            cur.execute("DROP TABLE IF EXISTS kernel_commit_20250301, kernel_commit_20250401")


@db
def test_the_migration_partitions_an_existing_log_keeping_its_rows_and_ids() -> None:
    """Back to the unpartitioned table (the migration's reverse), rows written there,
    then forward: every row is kept with its id, in a partition of its month, and new
    ids continue after the old ones."""
    executor = MigrationExecutor(connection)
    before = [("controlplane", "0008_task_waiting_index")]
    after = executor.loader.graph.leaf_nodes("controlplane")
    executor.migrate(before)
    try:
        with connection.cursor() as cur:
            cur.execute("INSERT INTO kernel_session VALUES ('sess_old', 2, now(), '{}')")
            cur.execute(
                "INSERT INTO kernel_commit (seq, at, actor, summary, session_id) VALUES "
                "(1, %s, 'a', '[]', 'sess_old'), (2, %s, 'a', '[]', 'sess_old')",
                [MARCH, APRIL],
            )
        old = commit_rows()
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(after)
        assert commit_rows() == old
        assert [r[0] for r in commit_rows("kernel_commit_20250301")] == [old[0][0]]
        assert [r[0] for r in commit_rows("kernel_commit_20250401")] == [old[1][0]]
        with connection.cursor() as cur:
            cur.execute("SELECT nextval('kernel_commit_id_seq')")
            assert cur.fetchone()[0] > old[-1][0]
            cur.execute("SELECT pruned_seq FROM kernel_session WHERE id = 'sess_old'")
            assert cur.fetchone() == (0,)
    finally:
        MigrationExecutor(connection).migrate(after)
        with connection.cursor() as cur:
            cur.execute("DROP TABLE IF EXISTS kernel_commit_20250301, kernel_commit_20250401")


def finished(kernel: Kernel, commits: int, document: str = "plan") -> str:
    """A session of ``commits`` document changes and no task: finished."""
    handle = kernel.create_session()
    for i in range(commits):
        draft = Draft(actor="user:ann")
        draft.set(document, "p", ["n"], i)
        handle.commit(draft)
    return handle.id


@db
@pytest.mark.usefixtures("past_partitions")
def test_prune_drops_a_partition_of_prunable_rows_and_deletes_rows_elsewhere() -> None:
    """March holds only a finished session's commits: dropped whole. April holds a
    finished session's and a live one's: the finished one's rows are deleted, the live
    task's session keeps all of its log, and its task still runs."""
    registry = make_registry(Effects())
    clock = ManualClock(MARCH)
    kernel = Kernel(PostgresStorage(), registry, clock)
    march = finished(kernel, 3)
    clock.set(APRIL)
    april = finished(kernel, 2)
    live = kernel.create_session()
    draft = Draft(actor="user:ann")
    task_id = draft.create_task("step", {"name": "live"})
    live.commit(draft)
    policy = RetentionPolicy(days=30)
    now = datetime(2025, 6, 1, tzinfo=UTC)

    dry = kernel.storage.prune(policy, now, dry_run=True)
    assert (dry.sessions, dry.partitions, dry.partition_commits, dry.commits) == (
        2, ["kernel_commit_20250301"], 3, 2)
    assert "kernel_commit_20250301" in names()

    lines: list[str] = []
    report = kernel.storage.prune(policy, now, progress=lines.append)
    assert (report.sessions, report.partitions, report.partition_commits, report.commits) == (
        2, ["kernel_commit_20250301"], 3, 2)
    assert "kernel_commit_20250301" not in names()
    assert any("dropped kernel_commit_20250301" in line for line in lines)
    assert [r[1:3] for r in commit_rows("kernel_commit_20250401")] == [(live.id, 1)]
    assert kernel.storage.session(march).pruned_seq == 3
    assert kernel.storage.session(april).pruned_seq == 2
    assert kernel.storage.session(live.id).pruned_seq == 0
    clock.set(now)
    Worker(kernel, "w1").advance(task_id)
    assert kernel.storage.task(task_id).outcome["kind"] == "succeeded"
    assert kernel.storage.task(task_id).status is Status.TERMINAL


@db
@pytest.mark.usefixtures("past_partitions")
def test_a_session_that_commits_after_it_was_found_due_is_left_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found due, then a commit lands before its batch locks it: its head moved, so the
    prune leaves it (and keeps the partition its rows are in)."""
    from controlplane.storage import retention

    clock = ManualClock(MARCH)
    kernel = Kernel(PostgresStorage(), make_registry(Effects()), clock)
    session = finished(kernel, 2)
    found = retention.due_sessions

    def then_a_commit(*args: Any) -> Any:
        due = found(*args)
        draft = Draft(actor="user:ann")
        draft.set("plan", "p", ["late"], 1)
        kernel.open(session).commit(draft)  # still in March: into the planned partition
        return due

    monkeypatch.setattr(retention, "due_sessions", then_a_commit)
    report = kernel.storage.prune(RetentionPolicy(days=30), datetime(2025, 6, 1, tzinfo=UTC))
    assert (report.sessions, report.skipped) == (0, 1)
    assert report.partitions == ["kernel_commit_20250401"]  # empty, so dropped; not March
    assert kernel.storage.session(session).pruned_seq == 0
    assert [c.seq for c in kernel.storage.commits_after(session, 0, 10)] == [1, 2, 3]


def operator() -> User:
    user = User.objects.create_user("olga")
    user.groups.add(Group.objects.get_or_create(name="viewer")[0])
    return user


@db
def test_manage_py_prune_reports_progress_and_a_summary(settings: Any) -> None:
    settings.KERNEL_RETENTION_DAYS = 0  # every finished session is due at once
    session = finished(runtime().kernel, 2, PLAN)
    out = io.StringIO()
    call_command("prune", "--dry-run", stdout=out)
    assert "1 finished session(s) due for pruning" in out.getvalue()
    summary = "would remove the history of 1 finished session(s): 2 commit(s)"
    assert out.getvalue().count(summary) == 1
    assert runtime().kernel.storage.session(session).pruned_seq == 0
    out = io.StringIO()
    call_command("prune", stdout=out)
    assert "partitions made:" in out.getvalue()
    assert out.getvalue().count(summary.replace("would remove", "removed")) == 1
    assert runtime().kernel.storage.session(session).pruned_seq == 2


def test_beat_runs_the_prune_daily() -> None:
    from controlplane.celery import PRUNE, app

    entries = [e for e in app.conf.beat_schedule.values() if e["task"] == PRUNE]
    assert len(entries) == 1
    schedule = entries[0]["schedule"]
    assert schedule.hour == {settings.KERNEL_PRUNE_HOUR} and schedule.minute == {0}


@db
def test_a_rest_reader_behind_retention_gets_the_snapshot_then_the_changes() -> None:
    kernel = runtime().kernel
    handle = kernel.create_session(metadata={"retention_days": 0})
    for i in range(3):
        draft = Draft(actor="user:ann")
        draft.set(PLAN, "doc", ["n"], i)
        handle.commit(draft)
    assert commands.prune().sessions >= 1
    client = Client()
    client.force_login(operator())
    assert client.get(f"/api/sessions/{handle.id}").json()["pruned_seq"] == 3
    url = f"/api/sessions/{handle.id}/changes"
    page = client.get(url, {"after": 1, "wait": 5}).json()  # answered at once
    snapshot = page["snapshot"]
    assert (snapshot["seq"], snapshot["pruned_seq"], page["changes"]) == (3, 3, [])
    assert [d["version"] for d in snapshot["documents"]] == [3]
    assert snapshot["session"]["metadata"] == {"retention_days": 0}
    draft = Draft(actor="user:ann")
    draft.set(PLAN, "doc", ["n"], 9)
    kernel.open(handle.id).commit(draft)
    page = client.get(url, {"after": 1}).json()
    assert page["snapshot"]["seq"] == 4 and page["changes"] == []  # the state at the head
    page = client.get(url, {"after": snapshot["seq"]}).json()
    assert page["snapshot"] is None and [c["seq"] for c in page["changes"]] == [4]
    assert client.get(url, {"after": 3}).json()["snapshot"] is None
    assert client.get(url, {"after": 2}).json()["snapshot"]["seq"] == 4


@db
def test_two_prunes_never_run_at_once() -> None:
    """A second prune (two beats, or a manual run during beat's) finds the first's lock,
    says so, and changes nothing; beat's task takes that as done."""
    from controlplane.errors import Conflict
    from controlplane.worker import execution

    db = connection.settings_dict
    session = finished(runtime().kernel, 1, PLAN)
    first = psycopg.connect(
        dbname=db["NAME"], user=db["USER"] or None, host=db["HOST"] or None,
        port=db["PORT"] or None, autocommit=True,
    )
    try:
        first.execute("SELECT pg_advisory_lock(hashtext('kernel_prune'))")
        with pytest.raises(Conflict, match="another prune is running"):
            commands.prune()
        with override_settings(KERNEL_RETENTION_DAYS=0):
            assert execution.prune() == {"sessions": 0, "partitions": 0}
        assert runtime().kernel.storage.session(session).pruned_seq == 0
        # Released here, not by closing: a closed connection's backend lets go of its
        # locks when it gets to exit, which can be after the next prune has looked.
        first.execute("SELECT pg_advisory_unlock(hashtext('kernel_prune'))")
    finally:
        first.close()
    with override_settings(KERNEL_RETENTION_DAYS=0):
        assert execution.prune()["sessions"] >= 1
    assert runtime().kernel.storage.session(session).pruned_seq == 1


def test_periods_by_day_or_month_in_utc() -> None:
    late = datetime(2025, 12, 31, 23, 30, tzinfo=UTC)
    assert partitions.period_start(late, "month") == datetime(2025, 12, 1, tzinfo=UTC)
    assert partitions.next_start(datetime(2025, 12, 1, tzinfo=UTC), "month") == datetime(
        2026, 1, 1, tzinfo=UTC)
    assert partitions.next_start(partitions.period_start(late, "day"), "day") == datetime(
        2026, 1, 1, tzinfo=UTC)
    with pytest.raises(ValueError, match="KERNEL_COMMIT_PARTITION must be one of"):
        partitions.period_start(late, "week")


@db
def test_daily_partitions_beside_monthly_ones_never_overlap() -> None:
    """Switching to days: a day inside an existing month's partition is not made again."""
    try:
        assert partitions.prepare(MARCH, "month", 0) == ["kernel_commit_20250301"]
        made = partitions.prepare(datetime(2025, 3, 31, tzinfo=UTC), "day", 2)
        assert made == ["kernel_commit_20250401", "kernel_commit_20250402"]
        bounds = {p.name: (p.start, p.end) for p in partitions.partitions(connection.cursor())}
        assert bounds["kernel_commit_20250402"] == (
            datetime(2025, 4, 2, tzinfo=UTC), datetime(2025, 4, 3, tzinfo=UTC))
    finally:
        with connection.cursor() as cur:
            cur.execute("DROP TABLE IF EXISTS kernel_commit_20250301, kernel_commit_20250401, "
                        "kernel_commit_20250402")


@db
def test_the_pages_of_a_pruned_session_still_render() -> None:
    """A pruned session's page, history and task page read records whose commits and
    entries are gone (the times of their last change among them)."""
    kernel = runtime().kernel
    handle = kernel.create_session(metadata={"retention_days": 0})
    draft = Draft(actor="user:ann")
    conversation = draft.create_conversation()
    draft.append(conversation, "user", {"text": "hello"})
    task_id = draft.create_task("send-batch", {"recipients": ["a@example.com"],
                                               "subject": "s", "body": "b"})
    handle.commit(draft)
    draft = Draft(actor="user:ann")
    draft.cancel(task_id, "not needed")
    kernel.open(handle.id).commit(draft)
    Worker(kernel, "w1").advance(task_id)  # runs the cancel through
    assert kernel.storage.task(task_id).outcome["kind"] == "cancelled"
    assert commands.prune().sessions >= 1
    assert kernel.storage.session(handle.id).pruned_seq == kernel.storage.session(
        handle.id).head_seq > 0
    client = Client()
    client.force_login(operator())
    for url in (f"/sessions/{handle.id}/", f"/sessions/{handle.id}/history",
                f"/tasks/{task_id}/", f"/api/tasks/{task_id}",
                f"/api/conversations/{conversation}/entries"):
        assert client.get(url).status_code == 200, url


@db
def test_a_session_keeping_its_history_beyond_any_date_does_not_stop_the_prune() -> None:
    """Written before the API bounded it (or by a trusted caller): a prune, dry or not,
    still runs for everyone, and that session is kept."""
    kernel = runtime().kernel
    forever = kernel.create_session(metadata={"retention_days": 1e6})
    due = kernel.create_session(metadata={"retention_days": 0})
    for handle in (forever, due):
        draft = Draft(actor="user:ann")
        draft.set(PLAN, "doc", ["n"], 1)
        handle.commit(draft)
    assert commands.prune(dry_run=True).sessions == 1
    assert commands.prune().sessions == 1
    assert kernel.storage.session(forever.id).pruned_seq == 0
    assert kernel.storage.session(due.id).pruned_seq == 1



@db
def test_a_pruned_sessions_fork_is_read_as_the_kernel_reads_it() -> None:
    """Retention removed a fork's fork point with every entry before it: the fork's
    transcript is what it added since, on the session page and the API's entry pages as
    in the kernel, not an error."""
    kernel = runtime().kernel
    handle = kernel.create_session(metadata={"retention_days": 0})
    draft = Draft(actor="user:ann")
    conversation = draft.create_conversation()
    handle.commit(draft)
    draft = Draft(actor="user:ann")
    first = draft.append(conversation, "user", {"text": "hello"})
    handle.commit(draft)
    draft = Draft(actor="user:ann")
    fork = draft.create_conversation(fork_of=conversation, fork_entry_id=first)
    draft.append(fork, "user", {"text": "forked"})
    handle.commit(draft)
    assert commands.prune().sessions >= 1
    client = Client()
    client.force_login(operator())
    assert client.get(f"/sessions/{handle.id}/").status_code == 200
    draft = Draft(actor="user:ann")  # new work after the prune
    draft.append(fork, "user", {"text": "after the prune"})
    kernel.open(handle.id).commit(draft)
    assert [e.payload["text"] for e in kernel.entries(fork)] == ["after the prune"]
    page = client.get(f"/sessions/{handle.id}/")
    assert page.status_code == 200 and "after the prune" in page.content.decode()
    entries = client.get(f"/api/conversations/{fork}/entries")
    assert entries.status_code == 200
    assert [e["payload"]["text"] for e in entries.json()["entries"]] == ["after the prune"]


@db
@pytest.mark.usefixtures("past_partitions")
@pytest.mark.parametrize("drop", ["possible", "busy"])
def test_a_prune_keeps_the_keyed_commits_a_trim_of_a_live_session_kept(
    drop: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A live session trimmed to its head keeps its keyed commits (an operator's action
    ids) below its marker: a prune that drops or clears the partition they are in leaves
    them, so the action repeated is still refused as a duplicate."""
    from controlplane.storage import retention

    if drop == "busy":  # the partition cannot be dropped: its pruned rows are deleted
        monkeypatch.setattr(retention, "_drop", lambda *args: False)
    clock = ManualClock(MARCH)
    kernel = Kernel(PostgresStorage(), make_registry(Effects()), clock)
    live = kernel.create_session()
    draft = Draft(actor="user:ann", key="action-1")
    draft.create_task("step", {"name": "live"})
    live.commit(draft)
    draft = Draft(actor="user:ann")
    draft.set("plan", "p", ["n"], 1)
    live.commit(draft)
    finished(kernel, 2)  # a due session beside it in March
    assert kernel.trim(live.id, 2).commits == 1
    report = kernel.storage.prune(RetentionPolicy(days=30), datetime(2025, 6, 1, tzinfo=UTC))
    assert report.sessions == 1
    assert [r[1:3] for r in commit_rows() if r[1] == live.id] == [(live.id, 1)]
    again = Draft(actor="user:ann", key="action-1")
    again.set("plan", "p", ["n"], 2)
    with pytest.raises(DuplicateCommit):
        kernel.open(live.id).commit(again)


@db
def test_a_resubmit_repeated_after_its_session_was_pruned_is_answered_with_its_submission(
) -> None:
    """The resubmission is kept, under the action id as its request id, though the
    operations log that named the action went with the prune: the repeat is answered
    with that submission (replayed), not refused as an id another submission took."""
    from kernel import SubmissionStatus
    from tests.integration.clients import client_for, post

    kernel = runtime().kernel
    handle = kernel.create_session(metadata={"retention_days": 0})
    draft = Draft(actor="user:ann")
    conversation = draft.create_conversation()
    handle.commit(draft)
    draft = Draft(actor="user:ann")
    draft.submit(conversation, "q", {"text": "a"})
    handle.commit(draft)
    original = kernel.storage.submission_by_request(handle.id, "q")
    draft = Draft(actor="user:ann")
    draft.update_submission(original.id, SubmissionStatus.CANCELLED, reason="model down")
    kernel.open(handle.id).commit(draft)
    olga = client_for("olga", "operator")
    url = f"/api/submissions/{original.id}/resubmit"
    body = {"action_id": "re-1", "reason": "model back",
            "expected_seq": kernel.storage.submission(original.id).updated_seq}
    first = post(olga, url, body)
    assert first.status_code == 200 and first.json()["replayed"] is False
    again = kernel.storage.submission_by_request(handle.id, "re-1")
    draft = Draft(actor="user:ann")
    for task in kernel.storage.session_tasks(handle.id):
        draft.cancel(task.id, "not needed")
    draft.update_submission(again.id, SubmissionStatus.CANCELLED, reason="not needed")
    kernel.open(handle.id).commit(draft)
    for task in kernel.storage.session_tasks(handle.id):
        Worker(kernel, "w1").advance(task.id)
    assert all(t.terminal for t in kernel.storage.session_tasks(handle.id))
    assert commands.prune().sessions >= 1
    assert kernel.storage.session(handle.id).pruned_seq > 0
    repeated = post(olga, url, body)  # the same request again
    assert repeated.status_code == 200, repeated.content
    assert repeated.json()["replayed"] is True
    assert repeated.json()["seq"] == first.json()["seq"]


@db
def test_the_page_of_a_pruned_task_says_retention_removed_its_commits() -> None:
    """A finished task whose commits went with its session's history: its page says so,
    not that no commit names it yet (as of a task that has not started)."""
    kernel = runtime().kernel
    handle = kernel.create_session(metadata={"retention_days": 0})
    draft = Draft(actor="user:ann")
    task_id = draft.create_task("send-batch", {"recipients": ["a@example.com"],
                                               "subject": "s", "body": "b"})
    handle.commit(draft)
    client = Client()
    client.force_login(operator())
    before = client.get(f"/tasks/{task_id}/").content.decode()
    assert "No commit names this task yet" not in before
    assert "Retention removed" not in before
    draft = Draft(actor="user:ann")
    draft.cancel(task_id, "not needed")
    kernel.open(handle.id).commit(draft)
    Worker(kernel, "w1").advance(task_id)
    assert commands.prune().sessions >= 1
    pruned_seq = kernel.storage.session(handle.id).pruned_seq
    page = client.get(f"/tasks/{task_id}/").content.decode()
    assert "No commit names this task yet" not in page
    assert f"Retention removed the session's history up to commit {pruned_seq}" in page


@db
def test_manage_py_tasks_says_retention_removed_a_pruned_tasks_history() -> None:
    kernel = runtime().kernel
    handle = kernel.create_session(metadata={"retention_days": 0})
    draft = Draft(actor="user:ann")
    task_id = draft.create_task("send-batch", {"recipients": ["a@example.com"],
                                               "subject": "s", "body": "b"})
    handle.commit(draft)
    before = io.StringIO()
    call_command("tasks", task_id, stdout=before)
    assert "Retention removed" not in before.getvalue()
    draft = Draft(actor="user:ann")
    draft.cancel(task_id, "not needed")
    kernel.open(handle.id).commit(draft)
    Worker(kernel, "w1").advance(task_id)
    assert commands.prune().sessions >= 1
    pruned_seq = kernel.storage.session(handle.id).pruned_seq
    out = io.StringIO()
    call_command("tasks", task_id, stdout=out)
    shown = out.getvalue()
    said = f"Retention removed the session's history up to commit {pruned_seq}"
    assert said in shown, shown
    assert shown.index("history:") < shown.index(said)


@db
def test_a_pruned_sessions_page_says_why_its_transcript_is_empty() -> None:
    """A prune takes a finished session's transcript: the page says so beside each
    conversation it emptied, not only an empty list as of a conversation never used."""
    kernel = runtime().kernel
    handle = kernel.create_session(metadata={"retention_days": 0})
    draft = Draft(actor="user:ann")
    used = draft.create_conversation()
    draft.append(used, "user", {"text": "hello"})
    handle.commit(draft)
    client = Client()
    client.force_login(operator())
    before = client.get(f"/sessions/{handle.id}/").content.decode()
    assert "hello" in before and "retention removed" not in before
    assert commands.prune().sessions >= 1
    pruned_seq = kernel.storage.session(handle.id).pruned_seq
    draft = Draft(actor="user:ann")
    unused = draft.create_conversation()  # made after the prune: empty, but not by it
    kernel.open(handle.id).commit(draft)
    page = client.get(f"/sessions/{handle.id}/").content.decode()
    note = f"No entries: retention removed this session's history up to commit {pruned_seq}"
    assert "hello" not in page and page.count(note) == 1
    emptied = page[page.index(f'id="conv-{used}"'):page.index(f'id="conv-{unused}"')]
    assert note in emptied


class Ticking(ManualClock):
    """A clock a second later at each reading: every commit has its own time."""

    def now(self) -> datetime:
        return self.advance(1)


@db
def test_every_commit_path_dates_its_session_by_its_commit() -> None:
    """Each way a commit is written (``controlplane.storage.fast_commits`` and the
    general one) sets the session's ``last_commit_at`` to the commit's time."""
    registry = Registry()
    registry.document("plan")

    @registry.task("steps")
    class Steps:
        initial = "step"

        def step(self, run: Run) -> Transition:
            done = int(run.checkpoint.get("done", 0)) + 1
            if done == 2:
                run.update("plan", "p", {"op": "set", "path": ["n"], "value": done})
            if done >= 3:
                return run.succeed({"done": done})
            return run.next("step", {"done": done})

    kernel = Kernel(PostgresStorage(), registry, Ticking())
    handle = kernel.create_session()
    seen: list[datetime] = []

    def dated() -> None:
        last = kernel.storage.commits_after(handle.id, 0, 1000)[-1]
        at = kernel.storage.session(handle.id).last_commit_at
        assert at == last.at, (len(seen), at, last)
        assert at not in seen
        seen.append(at)

    draft = Draft()
    task_id = draft.create_task("steps", {})
    handle.commit(draft)  # one task and its dispatch row: one statement
    dated()
    draft = Draft()
    draft.create_task("steps", {})
    draft.create_task("steps", {})
    handle.commit(draft)  # tasks only, at the head
    dated()
    draft = Draft()
    draft.set("plan", "q", ["n"], 1)
    handle.commit(draft)  # documents only
    dated()
    draft = Draft(key="op-1")
    draft.cancel(task_id, reason="enough")
    handle.commit(draft)  # the general commit
    dated()
    worker = Worker(kernel, "w1")
    for other in [t.id for t in kernel.storage.session_tasks(handle.id) if t.id != task_id]:
        assert worker.advance(other)  # inline, inline with a document, the ending
        dated()


@db
def test_a_dry_run_says_what_the_run_would_do_with_commits_in_the_default_partition(
    settings: Any,
) -> None:
    """March 2025 has no partition: its commits wait in the default one. The run first
    makes March's partition (moving them there), then drops it whole; the dry run, which
    makes nothing, says so all the same."""
    settings.KERNEL_RETENTION_DAYS = 30
    kernel = Kernel(PostgresStorage(), make_registry(Effects()), ManualClock(MARCH))
    finished(kernel, 3)
    assert len(commit_rows(partitions.DEFAULT)) == 3
    try:
        lines: list[str] = []
        dry = commands.prune(dry_run=True, progress=lines.append)
        assert commit_rows(partitions.DEFAULT) and "kernel_commit_20250301" not in names()
        report = commands.prune()
        assert "kernel_commit_20250301" not in names()  # made, then dropped
        assert (report.sessions, report.partitions, report.partition_commits,
                report.commits) == (1, ["kernel_commit_20250301"], 3, 0)
        assert (dry.sessions, dry.partitions, dry.partition_commits, dry.commits) == (
            report.sessions, report.partitions, report.partition_commits, report.commits)
        assert dry.summary() == report.summary().replace("removed", "would remove", 1)
        assert any("kernel_commit_20250301" in line for line in lines[:1]), lines
    finally:
        with connection.cursor() as cur:
            cur.execute("DROP TABLE IF EXISTS kernel_commit_20250301")


@db
def test_the_migration_dates_each_session_by_its_head_commit_or_else_by_now() -> None:
    """Back before ``last_commit_at``, sessions written there, then forward: one is
    dated by its head commit; one whose head commit a trim removed, by the migration's
    time (it is pruned a retention period later, never earlier); one never committed to,
    not at all."""
    executor = MigrationExecutor(connection)
    before = [("controlplane", "0017_fewer_indexes")]
    after = executor.loader.graph.leaf_nodes("controlplane")
    executor.migrate(before)
    try:
        with connection.cursor() as cur:
            cur.execute("INSERT INTO kernel_session (id, head_seq, created_at, metadata, "
                        "pruned_seq) VALUES ('sess_dated', 2, now(), '{}', 0), "
                        "('sess_trimmed', 2, now(), '{}', 2), ('sess_empty', 0, now(), '{}', 0)")
            cur.execute(
                "INSERT INTO kernel_commit (seq, at, actor, summary, session_id, key) VALUES "
                "(1, %s, 'a', '[]', 'sess_dated', NULL), (2, %s, 'a', '[]', 'sess_dated', NULL), "
                "(1, %s, 'a', '[]', 'sess_trimmed', 'op-1')",
                [MARCH, APRIL, MARCH],
            )
            cur.execute("SELECT clock_timestamp()")
            started = cur.fetchone()[0]
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(after)
        with connection.cursor() as cur:
            cur.execute("SELECT id, last_commit_at FROM kernel_session ORDER BY id")
            found = dict(cur.fetchall())
            cur.execute("SELECT clock_timestamp()")
            ended = cur.fetchone()[0]
        trimmed = found.pop("sess_trimmed")
        assert found == {"sess_dated": APRIL, "sess_empty": None}
        assert started <= trimmed <= ended
    finally:
        MigrationExecutor(connection).migrate(after)
        with connection.cursor() as cur:
            cur.execute("DROP TABLE IF EXISTS kernel_commit_20250301, kernel_commit_20250401")
