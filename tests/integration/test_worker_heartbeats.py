"""The worker registry: a worker's heartbeat row, live then dead or stopped, shown on the
Workers page and in the API beside the leases it holds; each queue's depth."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO
from types import SimpleNamespace

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.db import connection
from django.test import Client, override_settings
from django.utils import timezone

from controlplane.models import Worker
from controlplane.reads import pages
from controlplane.reads import workers as reads
from controlplane.worker import heartbeats
from controlplane.worker.runtime import runtime
from kernel import Draft, ManualClock

from .clients import login
from .clocks import behind

pytestmark = pytest.mark.django_db(transaction=True)


def viewer() -> Client:
    user = User.objects.create_user("wendy")
    user.groups.add(Group.objects.get_or_create(name="viewer")[0])
    client = Client()
    client.force_login(user)
    return client


def test_a_heartbeat_row_is_live_then_dead_and_counts_the_last_minute() -> None:
    beat = heartbeats.Heartbeat("w1@dev", ["default", "hands"], 4, every=60)
    beat.began()
    beat.ended(failed=False)
    beat.began()
    beat.ended(failed=True)
    beat.began()  # one in flight
    beat.write()
    beat.write()  # an upsert: one row, started_at kept
    [row] = Worker.objects.all()
    assert (row.id, row.name, row.queues, row.concurrency) == (
        heartbeats.worker_id(), "w1@dev", ["default", "hands"], 4)
    assert (row.in_flight, row.processed_last_minute, row.failed_last_minute) == (1, 2, 1)
    [shown] = reads.registry()
    assert shown.state == "live" and shown.worker == row.id and shown.leases == []
    later = timezone.now() + timedelta(seconds=11)
    with override_settings(WORKER_DEAD_SECONDS=10):
        assert reads.registry(later)[0].state == "dead"
    with override_settings(WORKER_FORGET_SECONDS=5):
        assert reads.registry(later) == []  # long gone: no longer listed
    beat.stop()  # never started: stop just marks the row
    assert reads.registry()[0].state == "stopped"


def a_batch() -> str:
    """A batch task committed to a new session, not run: one runnable task."""
    draft = Draft(actor="user:test")
    task_id = draft.create_task("send-batch", {"recipients": ["a@example.com"],
                                               "subject": "s", "body": "b"})
    runtime().kernel.create_session().commit(draft)
    return task_id


def test_the_workers_page_and_the_api_list_an_idle_worker_and_a_queue() -> None:
    kernel = runtime().kernel
    task_id = a_batch()
    heartbeats.Heartbeat("idle@dev", ["default"], 1, every=60).write()
    client = viewer()
    page = client.get("/workers/").content.decode()
    assert 'data-name="idle@dev"' in page and 'data-state="live"' in page
    assert '<span class="meta">idle</span>' in page
    queue = kernel.task(task_id).queue
    assert f'id="queue-{queue}" data-runnable="1"' in page
    [found] = [q for q in reads.queues() if q.queue == queue]
    assert found.runnable == 1 and found.oldest is not None
    listed = client.get("/api/workers").json()
    [mine] = [w for w in listed if w["name"] == "idle@dev"]
    assert mine["worker"] == heartbeats.worker_id() and mine["leases"] == []
    assert mine["state"] == "live" and mine["queues"] == ["default"]
    assert mine["last_heartbeat"] is not None  # the old fields kept
    queues = client.get("/api/queues").json()
    assert {"queue": queue, "runnable": 1} == {k: queues[0][k] for k in ("queue", "runnable")}


def test_a_queue_dates_an_expired_lease_from_its_expiry_not_from_the_tasks_last_commit() -> None:
    kernel = runtime().kernel
    task_id = a_batch()
    committed = kernel.clock.now()
    expiry = committed + timedelta(minutes=30)  # a long phase renewed its lease for 30 min
    assert kernel.storage.claim(task_id, "gone-worker", committed, expiry) is not None
    queue = kernel.task(task_id).queue
    [found] = [q for q in reads.queues(expiry + timedelta(seconds=5)) if q.queue == queue]
    assert found.runnable == 1 and found.oldest == expiry


def test_a_worker_whose_clock_runs_behind_is_shown_live_while_it_beats(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from datetime import UTC, datetime

    monkeypatch.setattr(heartbeats, "datetime", behind(minutes=1))  # the worker machine's
    heartbeats.Heartbeat("slow@dev", ["default"], 1, every=60).write()
    with override_settings(WORKER_DEAD_SECONDS=10):
        [shown] = reads.registry()
    assert shown.state == "live" and shown.silent_seconds < 10
    assert abs(Worker.objects.get().last_heartbeat - datetime.now(UTC)) < timedelta(seconds=10)


def test_a_queue_counts_a_due_sleeper_whatever_the_web_servers_own_clock_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kernel = runtime().kernel
    task_id = a_batch()
    due = kernel.clock.now() - timedelta(seconds=5)
    with connection.cursor() as cur:  # asleep until 5 s ago, as a sleep commit leaves it
        cur.execute("UPDATE kernel_task SET status = 'sleeping', wake_at = %s WHERE id = %s",
                    [due, task_id])
    monkeypatch.setattr(reads, "datetime", behind(minutes=1))  # the web machine's clock
    queue = kernel.task(task_id).queue
    [found] = [q for q in reads.queues() if q.queue == queue]
    assert found.runnable == 1 and found.oldest == due


def registered(owner: str, silent: float, *, stopped: bool = False) -> None:
    """A registry row for lease owner ``owner`` whose last heartbeat was ``silent``
    seconds ago by the database's clock."""
    last = runtime().kernel.clock.now() - timedelta(seconds=silent)
    host, pid = owner.split(":")
    Worker.objects.create(id=owner, name=f"w@{host}", host=host, pid=int(pid),
                          started_at=last, last_heartbeat=last,
                          stopped_at=last if stopped else None)


def test_the_sweep_ends_at_once_the_leases_of_a_worker_whose_heartbeat_stopped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Only a row that stopped beating is a dead worker: one beating now, one stopped
    cleanly and one that writes no row at all keep their leases until they run out."""
    from controlplane.worker.runtime import dispatcher_of

    kernel = runtime().kernel
    now = kernel.clock.now()
    owners = {"killed:1": 30, "beating:2": 1, "stopped:3": 30, "unregistered:4": None}
    tasks = {}
    for owner, silent in owners.items():
        tasks[owner] = a_batch()
        assert kernel.storage.claim(tasks[owner], owner, now, now + timedelta(minutes=10))
        if silent is not None:
            registered(owner, silent, stopped=owner.startswith("stopped"))
    sent: list[tuple[str, str]] = []
    dispatcher = dispatcher_of(kernel, lambda task, queue: sent.append((task, queue)),
                               lambda queue: None)
    with override_settings(WORKER_DEAD_SECONDS=10), caplog.at_level("INFO"):
        assert reads.dead_owners(kernel.clock.now()) == ["killed:1"]
        assert dispatcher.sweep().delivered == 1
        assert dispatcher.sweep().delivered == 0  # the next beat: nothing more
    [(task_id, queue)] = sent
    assert task_id == tasks["killed:1"] and queue.endswith(".now")
    ended = kernel.task(task_id)
    assert ended.lease_until is not None and ended.lease_until <= kernel.clock.now()
    for owner in ("beating:2", "stopped:3", "unregistered:4"):
        assert kernel.task(tasks[owner]).lease_until == now + timedelta(minutes=10)
    assert "killed:1 is dead; its 1 lease(s) end now" in caplog.text


def test_after_an_outage_a_worker_that_beats_again_later_than_the_sweeper_is_not_dead(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The database was out for half a minute: every worker's row went silent. The
    sweeping worker beats again first; another live worker's first beat comes a few
    seconds later. The sweep takes no one for dead until the sweeper's own beats have run
    without a gap for WORKER_DEAD_SECONDS, so the late one keeps its leases; once it dies
    for real (silent that long while the sweeper beats), it is taken for dead."""
    from controlplane.worker.runtime import dispatcher_of

    clock = ManualClock(runtime().kernel.clock.now() - timedelta(minutes=5))
    monkeypatch.setattr(heartbeats, "process_kernel", lambda: SimpleNamespace(clock=clock))
    sweeper = heartbeats.Heartbeat("sweeper@host", ["default"], 1, every=2)
    monkeypatch.setattr(heartbeats, "_beat", sweeper)  # this process's own heartbeat
    other = heartbeats.Heartbeat("other@host", ["default"], 1, every=2)
    other.id = "other:2"
    dead_owners = dispatcher_of(runtime().kernel).dead_owners
    assert dead_owners is not None

    def beat(*beating: heartbeats.Heartbeat, seconds: float) -> list[list[str]]:
        """Beat every 2 s for ``seconds``; who the sweep took for dead at each beat."""
        found = []
        for _ in range(int(seconds // 2)):
            clock.advance(2)
            for one in beating:
                one.write()
            found.append(dead_owners(clock.now()))
        return found

    with override_settings(WORKER_DEAD_SECONDS=10):
        assert beat(sweeper, other, seconds=20) == [[]] * 10
        clock.advance(30)  # the outage: nobody's beat is written
        assert beat(sweeper, seconds=6) == [[]] * 3  # the other reconnects later
        assert beat(sweeper, other, seconds=20) == [[]] * 10
        assert beat(sweeper, seconds=12) == [[]] * 5 + [["other:2"]]  # it died


def test_a_sweeper_whose_own_beats_have_a_gap_takes_no_worker_for_dead() -> None:
    """How long the sweeper's own beats have run without a gap decides whether it may
    judge the others' silence: not at all while it is silent itself (None), nor before
    WORKER_DEAD_SECONDS; then a worker still silent is taken for dead."""
    with connection.cursor() as cur:
        cur.execute("SELECT now()")
        now = cur.fetchone()[0]
    long_ago = now - timedelta(minutes=1)
    Worker.objects.create(id="host:2", name="w2@host", host="host", pid=2,
                          started_at=long_ago, last_heartbeat=long_ago)
    with override_settings(WORKER_DEAD_SECONDS=10):
        assert reads.dead_owners(now, sweeper_steady=None) == []
        assert reads.dead_owners(now, sweeper_steady=10) == []
        assert reads.dead_owners(now, sweeper_steady=10.5) == ["host:2"]
        assert reads.dead_owners(now) == ["host:2"]  # a sweep of a process with no row


def test_a_queue_shows_its_blocked_tasks_apart_from_its_runnable_ones() -> None:
    """A task no worker here can run (its dispatch rows marked blocked) is not work the
    queue's workers are behind on: counted apart, and not the oldest runnable."""
    kernel = runtime().kernel
    stuck = a_batch()
    kernel.storage.block_dispatches(stuck)
    waiting = a_batch()
    queue = kernel.task(waiting).queue
    [found] = [q for q in reads.queues() if q.queue == queue]
    assert found.runnable == 1
    assert found.blocked == 1
    [commit] = kernel.storage.commits_after(kernel.task(waiting).session_id, 0, 10)
    assert found.oldest == commit.at
    page = viewer().get("/workers/").content.decode()
    assert f'id="queue-{queue}" data-runnable="1" data-blocked="1"' in page
    [listed] = [q for q in viewer_api("/api/queues") if q["queue"] == queue]
    assert (listed["runnable"], listed["blocked"]) == (1, 1)

    kernel.storage.retry_dispatches([stuck])  # a definition that runs it is deployed
    [found] = [q for q in reads.queues() if q.queue == queue]
    assert (found.runnable, found.blocked) == (2, 0)


def viewer_api(path: str) -> list[dict]:
    user = User.objects.get_or_create(username="vera")[0]
    user.groups.add(Group.objects.get_or_create(name="viewer")[0])
    client = Client()
    client.force_login(user)
    return client.get(path).json()


def test_every_view_takes_the_same_tasks_for_blocked() -> None:
    """One task a worker found blocked (all its dispatch rows marked), one that an
    operator migrated since (a commit's row of its own beside the marked one, delivered as
    any other): the queue depths, the API, the storage's retry list, the Needs attention
    page, the task's page, ``manage.py tasks`` and the metrics all take the first for
    blocked, and only it."""
    kernel = runtime().kernel
    stuck, changed = a_batch(), a_batch()
    for task_id in (stuck, changed):
        kernel.storage.block_dispatches(task_id)
    migrate = Draft(actor="user:ann")
    migrate.migrate_environment(changed, {}, expected_seq=kernel.task(changed).updated_seq)
    kernel.open(kernel.task(changed).session_id).commit(migrate)
    queue = kernel.task(stuck).queue

    [found] = [q for q in reads.queues() if q.queue == queue]
    assert (found.runnable, found.blocked) == (1, 1)
    [listed] = [q for q in viewer_api("/api/queues") if q["queue"] == queue]
    assert (listed["runnable"], listed["blocked"]) == (1, 1)
    assert [t.id for t in kernel.storage.blocked_tasks(10)] == [stuck]
    assert [t.id for t in pages.attention().blocked] == [stuck]
    client = viewer()
    page = client.get(f"/tasks/{stuck}/").content.decode()
    assert "<dt>Blocked</dt><dd>the workers that took it have no definition" in page
    assert "<dt>Blocked</dt>" not in client.get(f"/tasks/{changed}/").content.decode()
    out = StringIO()
    call_command("tasks", "--older-than", "3600", stdout=out)
    assert [line.split()[0] for line in out.getvalue().splitlines()] == [stuck]
    assert "blocked: the workers that took it have no definition" in out.getvalue()
    assert "durable_blocked_tasks 1.0" in login("operator").get("/metrics").content.decode()
