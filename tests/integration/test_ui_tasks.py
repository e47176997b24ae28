"""The tasks page across sessions: its filters, sort and pages in the URL, and the bulk
actions on its result (a preview count, then a confirmation of exactly that count)."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.reads import pages
from controlplane.reads import tasks as task_reads
from controlplane.worker.runtime import runtime
from kernel import Status, Task

from .clients import login
from .sessions import EVIL, batch

pytestmark = pytest.mark.django_db(transaction=True)


def found_ids(html: str) -> list[str]:
    return re.findall(r'id="found-([^"]+)"', html)


def test_search_across_sessions_by_a_word_of_the_input() -> None:
    _, first = batch(subject="quarterly invoice")
    _, second = batch(subject="Weekly digest")
    _, third = batch(subject=f"{EVIL} invoice 100%_")
    client = login("viewer")
    page = client.get("/tasks/?q=INVOICE").content.decode()
    assert sorted(found_ids(page)) == sorted([first, third])  # case-insensitive, 2 sessions
    assert "&lt;script&gt;" in page and "<script>window" not in page
    assert found_ids(client.get("/tasks/?q=100%25_").content.decode()) == [third]
    assert found_ids(client.get("/tasks/?q=100%25x").content.decode()) == []  # % is literal
    everything = client.get("/tasks/").content.decode()
    assert found_ids(everything) == [third, second, first]  # newest first
    assert found_ids(client.get("/tasks/?sort=created").content.decode()) == [first, second, third]
    assert 'aria-sort="descending"' in everything


def test_filters_by_kind_status_session_and_time_and_pages() -> None:
    session_id, root = batch(recipients=2)
    batch(recipients=1)
    client = login("viewer")
    assert found_ids(client.get(f"/tasks/?session={session_id}").content.decode()) == [root]
    assert found_ids(client.get("/tasks/?kind=send-notice").content.decode()) == []
    assert len(found_ids(client.get("/tasks/?status=pending").content.decode())) == 2
    assert found_ids(client.get("/tasks/?status=succeeded").content.decode()) == []
    later = (timezone.now() + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S")
    assert found_ids(client.get(f"/tasks/?since={later}").content.decode()) == []
    assert len(found_ids(client.get(f"/tasks/?until={later}").content.decode())) == 2
    # Malformed values from a URL are dropped, not an error.
    answer = client.get("/tasks/?status=nope&since=yesterday&sort=evil&page=-3")
    assert answer.status_code == 200 and len(found_ids(answer.content.decode())) == 2
    search = pages.task_search(status="nope", since="yesterday", sort="evil", page="-3")
    assert search == pages.TaskSearch()
    # Pages of TASKS_PAGE, the filter kept in the links.
    many = pages.tasks_page(pages.TaskSearch(kind="send-batch", page=1))
    assert many.total == 2 and many.pages == 1


@pytest.mark.parametrize("moment", ["9999-12-31T23:59:59-05:00", "0001-01-01T00:00:00+05:00"])
def test_a_time_at_the_ends_of_the_calendar_is_read_by_the_page_its_socket_and_a_preview(
    moment: str,
) -> None:
    """A time a form's field or a URL may give that lies past the calendar's ends once in
    UTC (year 9999 behind UTC, year 1 ahead of it) filters as the end it is past: since
    it finds nothing, until it finds everything (or the reverse), on the page, in its
    live update and in a bulk preview, as the API reads it."""
    batch()
    client = login("operator")
    from controlplane.ui.live import GLOBAL_PAGES

    found = {}
    for name in ("since", "until"):
        page = client.get("/tasks/", {name: moment})
        assert page.status_code == 200, page.content[-300:]
        found[name] = len(found_ids(page.content.decode()))
        assert len(found_ids(GLOBAL_PAGES["tasks"].update(0, True, **{name: moment}))) \
            == found[name]
        preview = client.get("/bulk/preview", {"action": "cancel", "kind": "send-batch",
                                               name: moment})
        assert preview.status_code == 200, preview.content[-300:]
    assert sorted(found.values()) == [0, 1]


def test_the_live_part_follows_the_filter() -> None:
    _, wanted = batch(subject="alpha")
    batch(subject="beta")
    page = pages.task_search(q="alpha")
    from controlplane.ui.live import GLOBAL_PAGES

    html = GLOBAL_PAGES["tasks"].update(0, False, q="alpha")
    assert found_ids(html) == [wanted] and 'hx-swap-oob="true"' in html
    whole = GLOBAL_PAGES["tasks"].page(False, q="alpha")
    assert whole["socket"].startswith("/ws/ui/tasks/?") and "q=alpha" in whole["socket"]
    assert page.query() == "q=alpha"


def test_a_rows_markup_is_made_once_for_what_it_shows_and_anew_when_that_changes() -> None:
    """Live renders of the tasks page reuse the markup of rows that did not change; a
    row whose task moved (here: asked to cancel, a commit of its own) is made anew, and
    shows it."""
    from controlplane.ui.live import GLOBAL_PAGES, task_row
    from kernel import Draft

    session_id, task_id = batch(subject=f"{EVIL} kept")
    _, other = batch(subject="kept too")
    page = GLOBAL_PAGES["tasks"]
    task_row.cache_clear()
    first = page.update(0, True, q="kept")
    made = task_row.cache_info()
    assert made.misses == 2 and made.hits == 0
    assert rows(page.update(0, True, q="kept")) == rows(first)
    assert task_row.cache_info().hits == 2 and task_row.cache_info().misses == 2
    draft = Draft(actor="user:test")
    draft.cancel(task_id, "not wanted")
    runtime().kernel.open(session_id).commit(draft)
    moved = page.update(0, True, q="kept")
    assert task_row.cache_info().misses == 3  # the cancelled one; the other was kept
    row = moved.split(f'<tr id="found-{task_id}"')[1].split("</tr>")[0]
    assert '<span class="meta">seq 2</span>' in row and "&lt;script&gt;" in row
    assert row not in rows(first)
    assert "<script>" not in rows(moved)
    assert f'id="found-{other}"' in moved


def test_a_page_of_rows_is_one_statement_that_reads_only_what_the_rows_show() -> None:
    """The rows come with their status as shown and their last change's time in one
    statement, which reads no checkpoint, wait or lease: a live page renders them on
    every commit."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from kernel import Draft

    session_id, asked = batch(subject="listed asked to cancel")
    _, pending = batch(subject="listed pending")
    draft = Draft(actor="user:test")
    draft.cancel(asked, "not wanted")
    runtime().kernel.open(session_id).commit(draft)
    with CaptureQueriesContext(connection) as queries:
        found = pages.tasks_page(pages.TaskSearch(q="listed"))
    statements = [q["sql"] for q in queries.captured_queries]
    rows_read = [s for s in statements if "kernel_task" in s and "ILIKE" not in s]
    assert len(rows_read) == 1, statements
    assert "checkpoint" not in rows_read[0] and "lease_owner" not in rows_read[0]
    shown = {row.id: row for row in found.rows}
    assert set(shown) == {asked, pending}
    assert shown[asked].updated_seq == 2 and shown[pending].updated_seq == 1
    assert shown[pending].shown_status == "pending"  # the status as shown: SHOWN_STATUS_SQL
    assert '"subject": "listed pending"' in shown[pending].input_start
    commit = runtime().kernel.storage.commits_after(session_id, 1, 1)[0]
    assert commit.seq == 2 and shown[asked].changed_at == commit.at
    # Planned once per connection: its planning (a join over the commit log's
    # partitions) would cost as much as its execution on every live update.
    with connection.cursor() as cur:
        cur.execute("SELECT statement FROM pg_prepared_statements")
        prepared = [statement for (statement,) in cur.fetchall()]
    assert any(statement.startswith(task_reads.ROWS.split(" FROM ")[0])
               for statement in prepared), prepared


def test_a_row_reads_and_shows_only_the_start_of_a_large_input() -> None:
    """A task's input may be large: a page of rows reads only what a row shows of it,
    cut with an ellipsis, and escaped."""
    from controlplane.ui.live import GLOBAL_PAGES

    _, large = batch(subject=f"{EVIL} large " + "é" * 200_000)
    _, small = batch(subject="large but not")
    found = {row.id: row for row in task_reads.rows([large, small])}
    assert len(found[large].input_start) == task_reads.INPUT_SHOWN + 1
    assert len(found[small].input_start) < task_reads.INPUT_SHOWN
    html = GLOBAL_PAGES["tasks"].update(0, False, q="large")
    shown = {i: row.split('<td class="input"><code>')[1].split("</code>")[0]
             for i, row in re.findall(r'<tr id="found-([^"]+)"(.*?)</tr>', html)}
    assert shown[large].endswith("é…") and "&lt;script&gt;" in shown[large]
    assert len(shown[large]) < 2 * task_reads.INPUT_SHOWN  # escaped, still short
    assert shown[small].endswith("}") and "…" not in shown[small]


def rows(html: str) -> str:
    return html.split("<tbody>")[1].split("</tbody>")[0]


def test_an_operator_previews_then_cancels_exactly_the_previewed_count() -> None:
    ids = [batch(subject=f"renewal notice {i}")[1] for i in range(3)]
    batch(subject="something else")
    operator = login("operator")
    page = operator.get("/tasks/?q=renewal").content.decode()
    assert "Preview retry…" in page
    viewer = login("viewer")
    assert "Preview retry…" not in viewer.get("/tasks/?q=renewal").content.decode()
    assert "Filter first" in operator.get("/tasks/").content.decode()
    token = operator.cookies["csrftoken"].value

    preview = operator.get("/bulk/preview?action=cancel&q=renewal").content.decode()
    assert 'data-count="3"' in preview and "Confirm cancel of 3" in preview
    fields = dict(re.findall(r'name="(\w+)" value="([^"]*)"', preview))
    assert fields["q"] == "renewal" and fields["expected_count"] == "3"
    stale = {**fields, "expected_count": "2", "reason": "stale count"}
    answer = operator.post("/bulk/act", stale, HTTP_X_CSRFTOKEN=token, HTTP_HX_REQUEST="true")
    assert answer.status_code == 409
    assert all(runtime().kernel.task(t).cancel is None for t in ids)  # nothing done
    answer = operator.post("/bulk/act", {**fields, "reason": "duplicates"},
                           HTTP_X_CSRFTOKEN=token, HTTP_HX_REQUEST="true")
    assert answer.status_code == 200, answer.content
    assert "cancel: 3 of 3 done." in answer.content.decode()
    assert all(runtime().kernel.task(t).cancel is not None for t in ids)
    # A viewer may not act, nor preview.
    assert viewer.get("/bulk/preview?action=retry&q=renewal").status_code == 403
    assert viewer.post("/bulk/act", {**fields, "reason": "no"},
                       HTTP_X_CSRFTOKEN=viewer.cookies["csrftoken"].value).status_code == 403
    assert operator.get("/bulk/preview?action=drop&q=renewal").status_code == 422
    assert task_reads.count(task_reads.TaskFilter(text="renewal")) == 3


def test_the_count_and_the_pages_come_from_one_read_and_agree_past_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from benchmarks.ui import seed_tasks

    monkeypatch.setattr(pages, "COUNT_UP_TO", 5)
    monkeypatch.setattr(pages, "TASKS_PAGE", 2)
    seed_tasks(12, sessions=2)
    newest = [t.id for t in task_reads.find(task_reads.TaskFilter(), 0, 12, order="-created")]
    assert len(newest) == 12

    def shown(page: int, **search: str) -> tuple[list[str], int, bool, int, int]:
        found = pages.tasks_page(pages.TaskSearch(page=page, **search))
        return [t.id for t in found.rows], found.total, found.more, found.pages, found.search.page

    # More than the count: pages within the ids read for the count, and past them.
    assert shown(1) == (newest[0:2], 5, True, 3, 1)
    assert shown(3) == (newest[4:6], 5, True, 4, 3)
    assert shown(6) == (newest[10:12], 5, True, 6, 6)
    # Past the last match: the last page, not an empty one.
    assert shown(7) == (newest[10:12], 5, True, 6, 6)
    assert shown(100) == (newest[10:12], 5, True, 6, 6)
    # Fewer: every match was read; a page past the last is the last.
    kind = task_reads.find(task_reads.TaskFilter(kind="send-batch"), 0, 12, order="-created")
    assert len(kind) == 3
    assert shown(1, kind="send-batch") == ([t.id for t in kind[:2]], 3, False, 2, 1)
    assert shown(9, kind="send-batch") == ([kind[2].id], 3, False, 2, 2)
    by_kind = [t.id for t in task_reads.find(task_reads.TaskFilter(), 0, 12, order="kind")]
    assert shown(2, sort="kind") == (by_kind[2:4], 5, True, 3, 2)


def test_a_deep_page_of_a_search_reads_its_matches_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A common word on a deep page costs one scan and one sort of the matches (the ids,
    which count them too), not a second for the page's rows: on a large table each is a
    read of every match, and a viewer can ask for the deepest page as often as it likes."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    monkeypatch.setattr(pages, "COUNT_UP_TO", 3)
    monkeypatch.setattr(pages, "TASKS_PAGE", 2)
    made = [batch(subject=f"renewal {i}")[1] for i in range(9)]
    for page, sort in ((1, "-created"), (4, "-created"), (100, "kind"), (3, "-status")):
        with CaptureQueriesContext(connection) as queries:
            found = pages.tasks_page(pages.TaskSearch(q="renewal", page=page, sort=sort))
        searched = [q["sql"] for q in queries.captured_queries if "ILIKE" in q["sql"]]
        assert len(searched) == 1, (page, sort, searched)
        assert found.rows, (page, sort)
    assert len(made) == 9


def test_a_word_too_short_for_the_index_searches_nothing_and_acts_on_nothing() -> None:
    batch(subject="ab cd")
    operator = login("operator")
    page = operator.get("/tasks/?q=ab").content.decode()
    assert found_ids(page) == [] and 'id="short-word"' in page
    assert "at least 3 characters" in page
    preview = operator.get("/bulk/preview?action=cancel&q=ab")
    assert preview.status_code == 422 and b"at least 3 characters" in preview.content
    assert len(found_ids(operator.get("/tasks/?q=ab%20").content.decode())) == 0


def test_pages_stop_at_the_last_page_and_say_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pages, "TASKS_PAGE", 2)
    monkeypatch.setattr(pages, "COUNT_UP_TO", 3)
    monkeypatch.setattr(pages, "MAX_TASKS_PAGES", 2)
    made = [batch(subject=f"notice {i}")[1] for i in range(7)]
    viewer = login("viewer")
    for asked in ("2", "3", "100000"):
        page = viewer.get(f"/tasks/?page={asked}").content.decode()
        assert found_ids(page) == made[::-1][2:4], asked
        assert 'id="last-page"' in page and "Pages stop at 2" in page
        assert 'rel="next"' not in page
    assert 'id="last-page"' not in viewer.get("/tasks/?page=1").content.decode()


@pytest.mark.parametrize("trace_id", [
    "4BF92F3577B34DA6A3CE929D0E0E4736",  # W3C: lowercase only
    "4bf92f3577b34da6a3ce929d0e0e473g",
    '4bf92f3577b34da6"><script>x</sc>',
    "../../../../admin/?x=4bf92f3577b",
    "0" * 32,
])
def test_the_task_page_links_no_trace_whose_id_is_not_32_lowercase_hex(
    trace_id: str, settings: object
) -> None:
    settings.TRACE_URL = "https://traces.example/trace/{trace_id}"  # type: ignore[attr-defined]

    def shown(trace: str) -> task_reads.TaskView:
        return task_reads.TaskView(Task(
            "task_1", "sess_1", "k", 1, {}, Status.PENDING, "go", {}, 1, 1,
            trace={"traceparent": f"00-{trace}-00f067aa0ba902b7-01"}), None)

    assert len(trace_id) == 32
    assert (shown(trace_id).trace_id, shown(trace_id).trace_url) == (None, None)
    good = "4bf92f3577b34da6a3ce929d0e0e4736"
    assert shown(good).trace_url == f"https://traces.example/trace/{good}"
