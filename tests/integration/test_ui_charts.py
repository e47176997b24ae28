"""The dashboard's pictures, read from the commit log in buckets: the overview's last
hour (phases per second, latency, failures, attention) and a session's tasks by status
over time, drawn as server-rendered SVG."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from controlplane import commands
from controlplane.reads import charts
from controlplane.ui.charts import line_chart
from controlplane.worker.runtime import runtime
from kernel import Draft, Scheduler

from .api_kinds import start, with_test_kinds
from .clients import login, user
from .clocks import behind

pytestmark = pytest.mark.django_db(transaction=True)


def failing_batches(n: int) -> tuple[str, list[str]]:
    """``n`` send-batch tasks in one session, each failing in its plan (no such channel),
    run by an in-process worker: ``n`` phase commits, ``n`` failures."""
    kernel = runtime().kernel
    handle = kernel.create_session()
    ids = []
    for _ in range(n):
        draft = Draft(actor="user:test")
        ids.append(draft.create_task("send-batch", {
            "recipients": ["a@example.com"], "subject": "s", "body": "b", "channel": "pigeon"}))
        handle.commit(draft)
    Scheduler(kernel).run_until_idle()
    return handle.id, ids


def test_the_last_hour_in_buckets() -> None:
    failing_batches(3)
    found = charts.activity()
    assert found.buckets == charts.WINDOW_SECONDS // charts.BUCKET_SECONDS
    assert sum(found.phases_per_second) * found.bucket_seconds == pytest.approx(3)
    assert sum(found.failures) == 3
    assert [v for v in found.latency_p50 if v is not None]  # runnable -> worker commit
    assert all(v >= 0 for v in found.latency_p95 if v is not None)
    assert found.attention_now == 3 and found.attention[-1] == 3
    assert found.attention[0] == 0  # they came to need it in the window
    earlier = charts.activity(timezone.now() - timedelta(hours=2))
    assert sum(earlier.failures) == 0 and not any(earlier.phases_per_second)
    assert not any(earlier.attention)  # counted back through the commits since


def test_needing_attention_over_time_counts_a_retry_and_a_resolution_of_older_items(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two tasks failed and a step became uncertain two hours ago (before the window); an
    operator retries one and resolves the step now: the series shows three needing
    attention until then, one after."""
    kernel = with_test_kinds(monkeypatch)
    failed_in, (retried, _) = failing_batches(2)
    uncertain_in, uncertain = start(kernel, "api-step", {"ask": True})
    with connection.cursor() as cur:
        cur.execute("UPDATE kernel_commit SET at = at - interval '2 hours' "
                    "WHERE session_id IN (%s, %s)", [failed_in, uncertain_in])
    olga = user("olga", "operator")
    commands.retry_task(olga, retried, "retry-1", "provider fixed",
                        kernel.task(retried).updated_seq)
    step = commands.Step("resolution-1", kernel.task(uncertain).epoch)
    commands.resolve_task(olga, uncertain, "resolve-1", "checked", "sent", step)
    found = charts.activity()
    assert found.attention_now == 1 and found.attention[-1] == 1
    assert found.attention[0] == 3 and found.attention[-2] == 3
    assert sum(found.failures) == 0  # the failures themselves are older than the hour


def test_a_session_s_tasks_by_status_over_time() -> None:
    session_id, ids = failing_batches(2)
    history = charts.session_history(session_id, buckets=10)
    assert history is not None
    assert history.counts["failed"][-1] == 2
    assert history.counts["pending"][-1] == 0  # each was pending, then failed
    assert max(history.counts["pending"]) >= 1
    assert charts.session_history("sess_nothing") is None


def test_a_session_s_chart_ends_now_by_the_database_s_clock_not_the_web_machine_s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A session quiet for half an hour, drawn by a web machine whose clock runs an hour
    behind: the chart still runs to the present, as commits are dated."""
    session_id, _ = failing_batches(1)
    with connection.cursor() as cur:
        cur.execute("UPDATE kernel_commit SET at = at - interval '30 minutes' "
                    "WHERE session_id = %s", [session_id])
    client = login("viewer")
    monkeypatch.setattr(timezone, "datetime", behind(minutes=60))  # the web machine's
    clock = runtime().kernel.clock
    before = clock.now()
    drawn = client.get(f"/sessions/{session_id}/history").content.decode()
    after = clock.now()
    [end] = re.findall(r'aria-label="Tasks by status from \d\d:\d\d to (\d\d:\d\d) UTC', drawn)
    assert end in {f"{before:%H:%M}", f"{after:%H:%M}"}


def test_a_task_s_timeline_runs_to_now_by_the_database_s_clock_not_the_web_machine_s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A task queued for half an hour, shown by a web machine whose clock runs an hour
    behind: its page says it has been running for that half hour, as commits are dated."""
    from controlplane.reads import timeline

    kernel = runtime().kernel
    handle = kernel.create_session()
    draft = Draft(actor="user:test")
    task_id = draft.create_task("send-batch", {"recipients": ["a@example.com"],
                                               "subject": "s", "body": "b"})
    handle.commit(draft)
    with connection.cursor() as cur:
        cur.execute("UPDATE kernel_commit SET at = at - interval '30 minutes' "
                    "WHERE session_id = %s", [handle.id])
    client = login("viewer")
    monkeypatch.setattr(timeline, "datetime", behind(minutes=60))  # the web machine's
    page = client.get(f"/tasks/{task_id}/").content.decode()
    [seconds] = re.findall(r'class="span-seconds" data-seconds="([\d.]+)"', page)
    assert 30 * 60 <= float(seconds) < 31 * 60


def test_the_overview_and_the_session_page_draw_them() -> None:
    session_id, _ = failing_batches(2)
    charts.forget()  # the overview reads its activity at most every FRESH_SECONDS
    client = login("viewer")
    page = client.get("/").content.decode()
    points = dict(re.findall(r'id="(chart-\w+)" data-points="(\d+)"', page))
    assert set(points) == {"chart-phases", "chart-latency", "chart-failures"}
    assert int(points["chart-phases"]) >= 1 and int(points["chart-failures"]) >= 1
    assert re.search(r'class="series series-attention">.*?<circle', page, re.S)
    alone = client.get("/activity").content.decode()  # fetched again every bucket
    assert alone.startswith('<section id="activity"') and 'hx-trigger="every 10s"' in alone
    assert "2 need attention" in alone and 'id="chart-failures"' in alone
    assert "<svg" in page and "2 need attention" in page
    assert 'hx-get="/sessions/' in client.get(f"/sessions/{session_id}/").content.decode()
    drawn = client.get(f"/sessions/{session_id}/history").content.decode()
    assert 'id="chart-session"' in drawn and "status-failed" in drawn
    assert client.get("/sessions/sess_nothing/history").status_code == 404


def test_a_chart_breaks_at_gaps_and_labels_its_points() -> None:
    start = timezone.now().replace(microsecond=0)
    chart = line_chart("c", "T", "s", start, 10, [("p50", "x", [None, 1.0, 2.0, None, 0.5])])
    [line] = chart.lines
    assert len(line.segments) == 2 and chart.points == 3 and chart.top == 2
    assert line.dots[0].label.startswith("p50 1 s at ")
    empty = line_chart("e", "T", "s", start, 10, [("n", "x", [0, 0])])
    assert empty.points == 0 and empty.top == 1


def test_the_last_hour_ends_at_the_database_clock_whatever_the_web_servers_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    failing_batches(2)
    monkeypatch.setattr(charts, "datetime", behind(minutes=2))  # the web machine's clock
    found = charts.activity()
    assert sum(found.failures) == 2
    assert sum(found.phases_per_second) * found.bucket_seconds == pytest.approx(2)


def test_a_session_s_chart_leaves_out_the_keyed_commits_a_trim_kept() -> None:
    """An operator's retry is a keyed commit: a trim up to the head keeps its row (its
    key is refused again), not the commits after it, so it would draw the retried task
    pending for good. The chart reads the log after ``pruned_seq``, as the feed does:
    here, nothing."""
    session_id, (retried, _) = failing_batches(2)
    kernel = runtime().kernel
    commands.retry_task(user("olga", "operator"), retried, "retry-1", "provider fixed",
                        kernel.task(retried).updated_seq)
    Scheduler(kernel).run_until_idle()
    assert kernel.task(retried).outcome["kind"] == "failed"
    kernel.trim(session_id, kernel.storage.session(session_id).head_seq)
    assert charts.session_history(session_id) is None
