"""The change feed over REST: ``/api/sessions/{id}/changes`` and ``/api/changes``."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client

from controlplane.access import issue_token
from controlplane.reads import feed
from controlplane.worker.runtime import runtime
from kernel import Draft, DuplicateCommit, SessionHandle

from .clients import user_in
from .plan_documents import PLAN, commit

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def offline_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    """No Celery worker here: deliveries go nowhere (the commits below dispatch nothing
    anyway, but a stray one must not try to reach a broker)."""
    monkeypatch.setattr(runtime().dispatcher, "deliver", lambda task, queue: None)


@pytest.fixture
def viewer() -> Client:
    client = Client()
    client.force_login(user_in("viewer"))
    return client


def commits(handle: SessionHandle, count: int) -> list[Any]:
    return [commit(handle, i) for i in range(count)]


def changes(client: Client, url: str, **params: Any) -> dict[str, Any]:
    response = client.get(url, params)
    assert response.status_code == 200, response.content
    return response.json()


def session_url(handle: SessionHandle) -> str:
    return f"/api/sessions/{handle.id}/changes"


def in_thread(work: Callable[[], None]) -> threading.Thread:
    """Run ``work`` on a thread with its own database connection, closed afterwards."""

    def run() -> None:
        try:
            work()
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_a_session_feed_is_in_seq_order_after_the_cursor(viewer: Client) -> None:
    kernel = runtime().kernel
    handle = kernel.create_session()
    made = commits(handle, 5)

    page = changes(viewer, session_url(handle))
    assert page["session_id"] == handle.id and page["head_seq"] == 5
    assert [c["seq"] for c in page["changes"]] == [1, 2, 3, 4, 5]
    assert [c["id"] for c in page["changes"]] == [c.id for c in made]
    first = page["changes"][0]
    assert first["actor"] == "user:ann"
    assert first["summary"] == made[0].summary and first["summary"][0]["type"] == "document"
    assert first["at"].startswith(made[0].at.strftime("%Y-%m-%dT%H:%M:%S"))

    assert [c["seq"] for c in changes(viewer, session_url(handle), limit=2)["changes"]] == [1, 2]
    assert [c["seq"] for c in changes(viewer, session_url(handle), after=3)["changes"]] == [4, 5]
    end = changes(viewer, session_url(handle), after=5)
    assert end["changes"] == [] and end["head_seq"] == 5


def test_a_client_that_pages_by_seq_sees_every_commit_once(viewer: Client) -> None:
    handle = runtime().kernel.create_session()
    commits(handle, 7)
    seen: list[int] = []
    after = 0
    while page := changes(viewer, session_url(handle), after=after, limit=3)["changes"]:
        seen += [c["seq"] for c in page]
        after = page[-1]["seq"]
    assert seen == list(range(1, 8))


def test_the_global_feed_is_in_id_order_across_sessions(viewer: Client) -> None:
    kernel = runtime().kernel
    start = changes(viewer, "/api/changes")["last_id"]  # other tests' commits are flushed,
    a, b = kernel.create_session(), kernel.create_session()  # but ids are never reused
    made = [commit(a, 1), commit(b, 1), commit(a, 2), commit(b, 2), commit(b, 3)]

    page = changes(viewer, "/api/changes", after_id=start)
    assert [(c["session_id"], c["seq"], c["id"]) for c in page["changes"]] == [
        (c.session_id, c.seq, c.id) for c in made
    ]
    assert page["after_id"] == start and page["last_id"] == made[-1].id
    seen: list[int] = []
    cursor = start
    while batch := changes(viewer, "/api/changes", after_id=cursor, limit=2)["changes"]:
        seen += [c["id"] for c in batch]
        cursor = batch[-1]["id"]
    assert seen == [c.id for c in made]
    assert changes(viewer, "/api/changes", after_id=cursor) == {
        "after_id": cursor, "last_id": cursor, "changes": [],
    }


def test_the_global_feed_leaves_out_the_keyed_commits_a_trim_kept(viewer: Client) -> None:
    """A trim keeps the keyed commits below its ``pruned_seq`` (a retried action is still
    a duplicate) but takes them out of the log: the global feed shows the session from
    ``pruned_seq + 1`` on, as its own feed does, not a lone commit from before."""
    kernel = runtime().kernel
    handle = kernel.create_session()
    start = changes(viewer, "/api/changes")["last_id"]
    commit(handle, 1)
    keyed = Draft(actor="user:olga", key="action-1")
    keyed.set(PLAN, "doc", ["n"], 2)
    handle.commit(keyed)
    commit(handle, 3)
    kernel.trim(handle.id, 3)
    kept = commit(handle, 4)

    own = changes(viewer, session_url(handle), after=3)["changes"]
    assert [c["seq"] for c in own] == [4]
    assert [(c["session_id"], c["seq"]) for c in changes(
        viewer, "/api/changes", after_id=start)["changes"]] == [(handle.id, 4)]
    assert changes(viewer, "/api/changes", after_id=start)["last_id"] == kept.id
    with pytest.raises(DuplicateCommit):  # the key is still known
        again = Draft(actor="user:olga", key="action-1")
        again.set(PLAN, "doc", ["n"], 2)
        kernel.open(handle.id).commit(again)


def reads_counted(monkeypatch: pytest.MonkeyPatch, name: str, reads: int) -> threading.Event:
    """Wrap ``feed.<name>``; the event is set once it has been called ``reads`` times
    (a long-poll reads once, subscribes to hints, reads again, then waits)."""
    waiting = threading.Event()
    original = getattr(feed, name)
    calls = 0

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        result = original(*args, **kwargs)
        calls += 1
        if calls >= reads:
            waiting.set()
        return result

    monkeypatch.setattr(feed, name, counted)
    return waiting


def commit_when(waiting: threading.Event, handle: SessionHandle) -> tuple[threading.Thread, list]:
    landed: list[Any] = []

    def work() -> None:
        assert waiting.wait(10), "the long-poll never started waiting"
        landed.append(commit(handle, "late"))
        landed.append(time.monotonic())

    return in_thread(work), landed


def test_a_long_poll_returns_as_soon_as_a_commit_lands(
    viewer: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    handle = runtime().kernel.create_session()
    commits(handle, 2)
    waiting = reads_counted(monkeypatch, "session_page", reads=2)
    thread, landed = commit_when(waiting, handle)

    started = time.monotonic()
    page = changes(viewer, session_url(handle), after=2, wait=20)
    answered = time.monotonic()
    thread.join(10)

    landed_commit, landed_at = landed
    assert [(c["seq"], c["id"]) for c in page["changes"]] == [(3, landed_commit.id)]
    assert page["head_seq"] == 3
    assert answered - landed_at < 1.0, "the long-poll answered late"
    assert answered - started < 10


def test_a_long_poll_on_the_global_feed_returns_when_a_commit_lands(
    viewer: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    handle = runtime().kernel.create_session()
    start = commit(handle, 0).id
    waiting = reads_counted(monkeypatch, "_global_visible", reads=2)
    thread, landed = commit_when(waiting, handle)

    page = changes(viewer, "/api/changes", after_id=start, wait=20)
    answered = time.monotonic()
    thread.join(10)

    assert [c["id"] for c in page["changes"]] == [landed[0].id]
    assert answered - landed[1] < 1.0


def test_a_long_poll_with_nothing_new_returns_empty_after_wait(viewer: Client) -> None:
    handle = runtime().kernel.create_session()
    commits(handle, 1)
    for url, params in [
        (session_url(handle), {"after": 1}),
        ("/api/changes", {"after_id": changes(viewer, "/api/changes")["last_id"]}),
    ]:
        started = time.monotonic()
        page = changes(viewer, url, wait=0.6, **params)
        took = time.monotonic() - started
        assert page["changes"] == []
        assert 0.6 <= took < 3.0, took


@contextmanager
def commit_in_flight(session_id: str) -> Iterator[tuple[psycopg.Connection[Any], int]]:
    """A commit of ``session_id`` that has drawn its id and not committed yet, as the
    kernel's commit does it (head and commit row in one transaction); the caller
    commits or rolls it back."""
    db = settings.DATABASES["default"]
    conn = psycopg.connect(
        dbname=connection.settings_dict["NAME"], user=db["USER"] or None,
        host=db["HOST"] or None, port=db["PORT"] or None, autocommit=False,
    )
    try:
        row = conn.execute(
            "WITH head AS (UPDATE kernel_session SET head_seq = head_seq + 1 WHERE id = %s "
            "RETURNING head_seq) INSERT INTO kernel_commit (session_id, seq, at, actor, summary) "
            "SELECT %s, head_seq, now(), 'test:in-flight', '[]'::jsonb FROM head RETURNING id",
            [session_id, session_id],
        ).fetchone()
        assert row is not None
        yield conn, row[0]
    finally:
        conn.close()


@pytest.mark.parametrize("ending", ["commit", "rollback"])
def test_the_global_feed_never_skips_an_id_still_in_flight(
    viewer: Client, monkeypatch: pytest.MonkeyPatch, ending: str
) -> None:
    """Commit ids are drawn before their transactions commit: B's later id can be
    visible while A's earlier one is not. Serving B would move the client's cursor past
    A for good, so B waits until A has committed (then both come, in id order) or
    rolled back (then A's id is a gap for good)."""
    monkeypatch.setattr(feed, "SETTLE_SECONDS", 0.2)
    kernel = runtime().kernel
    a, b = kernel.create_session(), kernel.create_session()
    start = commit(a, 0).id
    with commit_in_flight(a.id) as (conn, in_flight_id):
        later = commit(b, 0)
        assert later.id > in_flight_id
        assert changes(viewer, "/api/changes", after_id=start)["changes"] == []
        # The session feed has no such hazard: B's seq 1 is there at once.
        assert [c["id"] for c in changes(viewer, session_url(b))["changes"]] == [later.id]
        getattr(conn, ending)()
    page = changes(viewer, "/api/changes", after_id=start)
    expected = [in_flight_id, later.id] if ending == "commit" else [later.id]
    assert [c["id"] for c in page["changes"]] == expected


@contextmanager
def id_drawn_before_any_write() -> Iterator[tuple[psycopg.Connection[Any], int]]:
    """A transaction as a commit statement leaves it between drawing its commit id and
    its first write: it holds ``kernel_commit``'s row-exclusive lock (an INSERT takes it
    before it draws the id) and the id, but no transaction id yet (``nextval`` assigns
    none, 31 times in 32), so no snapshot lists it as in flight. A fast commit's
    statement draws the id before it updates the session's head (its first write)."""
    db = settings.DATABASES["default"]
    params = {"dbname": connection.settings_dict["NAME"], "user": db["USER"] or None,
              "host": db["HOST"] or None, "port": db["PORT"] or None, "autocommit": False}
    for _ in range(64):
        conn = psycopg.connect(**params)
        conn.execute("LOCK TABLE kernel_commit IN ROW EXCLUSIVE MODE")
        drawn = conn.execute("SELECT nextval('kernel_commit_id_seq')").fetchone()
        xid = conn.execute("SELECT pg_current_xact_id_if_assigned()").fetchone()
        assert drawn is not None and xid is not None
        if xid[0] is None:
            break
        conn.close()  # this nextval logged the sequence, and took a transaction id for it
    else:
        raise AssertionError("every nextval took a transaction id")
    try:
        yield conn, drawn[0]
    finally:
        conn.close()


def test_the_global_feed_never_skips_an_id_drawn_by_a_transaction_not_written_yet(
    viewer: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No snapshot lists a transaction that has drawn its commit id but written nothing
    yet: B's later id, committed meanwhile, must wait for A all the same."""
    monkeypatch.setattr(feed, "SETTLE_SECONDS", 0.2)
    kernel = runtime().kernel
    a, b = kernel.create_session(), kernel.create_session()
    start = commit(a, 0).id
    with id_drawn_before_any_write() as (conn, drawn):
        later = commit(b, 0)
        assert later.id > drawn
        assert changes(viewer, "/api/changes", after_id=start)["changes"] == []
        conn.execute(
            "WITH head AS (UPDATE kernel_session SET head_seq = head_seq + 1 WHERE id = %s "
            "RETURNING head_seq) INSERT INTO kernel_commit (id, session_id, seq, at, actor, "
            "summary) SELECT %s, %s, head_seq, now(), 'test:late', '[]'::jsonb FROM head",
            [a.id, drawn, a.id],
        )
        conn.commit()
    page = changes(viewer, "/api/changes", after_id=start)
    assert [c["id"] for c in page["changes"]] == [drawn, later.id]


BAD_INPUT = [
    ({"after": -1}, "after"),
    ({"after": "x"}, "after"),
    ({"after": "1.5"}, "after"),
    ({"limit": 0}, "limit"),
    ({"limit": 1001}, "limit"),
    ({"limit": "many"}, "limit"),
    ({"wait": 31}, "wait"),
    ({"wait": -0.5}, "wait"),
    ({"wait": "soon"}, "wait"),
    ({"wait": "nan"}, "wait"),
]


def test_bad_input_is_a_422_naming_the_field(viewer: Client) -> None:
    handle = runtime().kernel.create_session()
    for params, field in BAD_INPUT:
        global_params = {("after_id" if k == "after" else k): v for k, v in params.items()}
        global_field = "after_id" if field == "after" else field
        for url, query, name in [
            (session_url(handle), params, field),
            ("/api/changes", global_params, global_field),
        ]:
            response = viewer.get(url, query)
            assert response.status_code == 422, (url, query, response.content)
            assert name in [error["loc"][-1] for error in response.json()["detail"]], query


def test_an_unknown_parameter_is_a_422_naming_it_not_a_replay_from_0(viewer: Client) -> None:
    """The websockets take ``after`` on either feed and ``after_seq`` / ``after_id``: the
    same cursor under a name the REST feed does not take would otherwise be ignored, and
    the log served from 0 again."""
    handle = runtime().kernel.create_session()
    last = commits(handle, 2)[-1]
    for url, query, unknown in [
        (session_url(handle), {"after_seq": 2}, ["after_seq"]),
        (session_url(handle), {"after": 2, "after_id": last.id}, ["after_id"]),
        ("/api/changes", {"after": last.id}, ["after"]),
        ("/api/changes", {"after_id": last.id, "wait": 0, "batch": 1}, ["batch"]),
    ]:
        response = viewer.get(url, query)
        assert response.status_code == 422, (url, query, response.content)
        assert [error["loc"] for error in response.json()["detail"]] == [
            ["query", name] for name in unknown
        ]
    assert changes(viewer, session_url(handle), after=1)["changes"][0]["id"] == last.id


def test_a_cursor_past_the_newest_position_is_a_409_naming_it(viewer: Client) -> None:
    """A cursor the feed never sent (another database's, or made up) would otherwise be
    answered with nothing, or long-polled until the log passed it, silently."""
    handle = runtime().kernel.create_session()
    last = commits(handle, 2)[-1]
    for url, query, name in [
        (session_url(handle), {"after": 3}, "after"),
        (session_url(handle), {"after": 3, "wait": 5}, "after"),
        ("/api/changes", {"after_id": last.id + 1000}, "after_id"),
        ("/api/changes", {"after_id": last.id + 1000, "wait": 5}, "after_id"),
    ]:
        started = time.monotonic()
        response = viewer.get(url, query)
        assert response.status_code == 409, (url, query, response.content)
        assert response.json()["detail"].startswith(f"{name}: ")
        assert "past the newest position" in response.json()["detail"]
        assert time.monotonic() - started < 2
    assert changes(viewer, session_url(handle), after=2)["changes"] == []
    assert changes(viewer, "/api/changes", after_id=last.id)["last_id"] >= last.id


def test_an_unknown_session_is_a_404(viewer: Client) -> None:
    for wait in (0, 5):
        started = time.monotonic()
        response = viewer.get("/api/sessions/sess_nope/changes", {"wait": wait})
        assert response.status_code == 404
        assert "sess_nope" in response.json()["detail"]
        assert time.monotonic() - started < 2


def test_reading_needs_a_viewer_or_an_operator() -> None:
    handle = runtime().kernel.create_session()
    commits(handle, 1)
    urls = [session_url(handle), "/api/changes"]

    anonymous = Client()
    assert [anonymous.get(url).status_code for url in urls] == [401, 401]

    roleless = Client()
    roleless.force_login(user_in(None, "nora"))
    assert [roleless.get(url).status_code for url in urls] == [403, 403]

    bearer = Client()
    nora_key = issue_token(User.objects.get(username="nora"), "script")
    answers = [bearer.get(u, HTTP_AUTHORIZATION=f"Bearer {nora_key}") for u in urls]
    assert [r.status_code for r in answers] == [403, 403]
    assert [bearer.get(u, HTTP_AUTHORIZATION="Bearer dcp_wrong").status_code for u in urls] == [
        401, 401,
    ]
    olga_key = issue_token(user_in("operator", "olga"), "script")
    answers = [bearer.get(u, HTTP_AUTHORIZATION=f"Bearer {olga_key}") for u in urls]
    assert [r.status_code for r in answers] == [200, 200]
    assert [c["seq"] for c in answers[0].json()["changes"]] == [1]
