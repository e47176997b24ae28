"""What the dashboard's charts show, bucketed in SQL from the commit log.

Commit summaries carry each task's status change (``{"type": "task", "id", "status",
"phase", "outcome"}``) and every commit its time ``at``, so activity over time needs no
other record. Each read scans one time window of ``kernel_commit`` (its BRIN index on
``at``) or one session's commits, and returns one row per bucket: the cost is bounded by
the window, the answer by the number of buckets.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from controlplane.process.kernel import process_kernel
from controlplane.reads import tasks
from controlplane.reads.snapshot import rows as sql_rows
from kernel.records import SHOWN_STATUSES

WINDOW_SECONDS = 3600
BUCKET_SECONDS = 10
FRESH_SECONDS = 2.0
"""The overview's activity is read at most this often per process, however many commits
ask a live page to re-render (a chart need not move on every commit)."""


@dataclass(frozen=True)
class Activity:
    """The last hour, bucket by bucket (``None`` where a bucket had no such event)."""

    start: datetime
    end: datetime
    bucket_seconds: int
    phases_per_second: list[float]
    """Phase commits (a leased task's own commits, actor ``task:ID``) per second."""
    latency_p50: list[float | None]
    latency_p95: list[float | None]
    """Seconds from the commit that made a task runnable to its worker's next commit: the
    wait for a worker plus the phase's own run (claims are not commits)."""
    failures: list[int]
    """Tasks that ended failed or faulted."""
    attention: list[int]
    """Tasks needing attention (:data:`tasks.NEEDS_ATTENTION`) at the end of the bucket."""
    attention_now: int
    """Tasks needing attention at the window's end, now: its last bucket (at most
    :data:`tasks.COUNT` counted: past it, the series is counted back from that many, so
    each bucket shows at most as many as there were)."""

    @property
    def buckets(self) -> int:
        return len(self.failures)


ACTIVITY_SQL = """
WITH items AS (
    SELECT c.at, c.actor, c.session_id, c.seq, i->>'id' AS task, i->>'status' AS status,
           i->>'outcome' AS outcome
    FROM kernel_commit c CROSS JOIN LATERAL jsonb_array_elements(c.summary) AS i
    WHERE c.at >= %(start)s AND c.at < %(end)s AND i->>'type' = 'task'
), steps AS (
    SELECT at, actor, outcome, lag(at) OVER w AS prev_at, lag(status) OVER w AS prev_status
    FROM items WINDOW w AS (PARTITION BY task ORDER BY session_id, seq)
), waits AS (
    SELECT floor(extract(epoch FROM at - %(start)s) / %(bucket)s)::int AS b, outcome,
           CASE WHEN actor LIKE 'task:%%' AND prev_status = 'pending'
                THEN extract(epoch FROM at - prev_at) END AS wait
    FROM steps
)
SELECT b, percentile_cont(0.5) WITHIN GROUP (ORDER BY wait),
       percentile_cont(0.95) WITHIN GROUP (ORDER BY wait),
       count(*) FILTER (WHERE outcome = ANY(%(failed)s))
FROM waits WHERE wait IS NOT NULL OR outcome = ANY(%(failed)s)
GROUP BY b
"""

LEAVES_ATTENTION = ("retry", "resolve:%", "approve", "deny")
"""Operators' actions (``LIKE`` patterns of their operations-log kinds, ``retry``,
``resolve:<decision>``, ``approve`` and ``deny``, see :mod:`controlplane.commands`) that
only a task needing attention accepts: a retry needs a failed or faulted task, a
resolution a step waiting on its signal, a decision a call waiting for approval. Such an
action is how a task that came to need attention before the window leaves it inside the
window."""

ATTENTION_SQL = f"""
WITH items AS (
    SELECT c.at, c.session_id, c.seq, c.actor, i->>'id' AS task,
           coalesce({tasks.needs_attention_sql("i")}, false) AS needs
    FROM kernel_commit c CROSS JOIN LATERAL jsonb_array_elements(c.summary) AS i
    WHERE c.at >= %(start)s AND c.at < %(end)s AND i->>'type' = 'task'
), steps AS (
    SELECT at, session_id, seq, actor, task, needs,
           lag(needs) OVER (PARTITION BY task ORDER BY session_id, seq) AS before
    FROM items
), changes AS (
    SELECT at, needs::int - (CASE
        WHEN before IS NOT NULL THEN before
        WHEN actor LIKE 'task:%%' THEN false
        ELSE EXISTS (SELECT 1 FROM kernel_entry e
                     WHERE e.session_id = steps.session_id AND e.seq = steps.seq
                       AND e.kind LIKE ANY(%(leaves)s) AND e.payload->>'target' = steps.task)
    END)::int AS d
    FROM steps
)
SELECT floor(extract(epoch FROM at - %(start)s) / %(bucket)s)::int AS b, sum(d)
FROM changes WHERE d <> 0 GROUP BY b
"""
"""Per bucket, tasks that came to need attention less those that stopped. A task's
change is its item's state against its previous item in the window; before its first,
it needed none unless that commit is one of :data:`LEAVES_ATTENTION` on it (a task's
own commit never is: a task needing attention holds no lease)."""

PHASES_SQL = """
SELECT floor(extract(epoch FROM at - %(start)s) / %(bucket)s)::int AS b, count(*)
FROM kernel_commit WHERE at >= %(start)s AND at < %(end)s AND actor LIKE 'task:%%'
GROUP BY b
"""


def activity(now: datetime | None = None, window: int = WINDOW_SECONDS,
             bucket: int = BUCKET_SECONDS) -> Activity:
    """Phases per second, runnable-to-next-commit latency, failures and tasks needing
    attention over the last ``window`` seconds, in buckets of ``bucket`` seconds. (With
    ``now`` in the past, "needing attention" is counted back from the present through
    the commits since.)"""
    # The database's clock, as commits are dated by: the web machine's may disagree.
    present = process_kernel().clock.now()
    now = now or present
    end = now.replace(microsecond=0) + timedelta(seconds=1)
    start = end - timedelta(seconds=window)
    n = -(-window // bucket)
    params = {"start": start, "end": end, "bucket": bucket,
              "failed": list(tasks.FAILED_OUTCOMES), "leaves": list(LEAVES_ATTENTION)}
    phases, p50, p95, failures = [0.0] * n, [None] * n, [None] * n, [0] * n
    for b, count in sql_rows(PHASES_SQL, params):
        if 0 <= b < n:
            phases[b] = count / bucket
    latency_p50: list[float | None] = list(p50)
    latency_p95: list[float | None] = list(p95)
    for b, mid, high, failed in sql_rows(ACTIVITY_SQL, params):
        if 0 <= b < n:
            latency_p50[b] = None if mid is None else float(mid)
            latency_p95[b] = None if high is None else float(high)
            failures[b] = int(failed)
    needing = min(sum(tasks.count(f, up_to=tasks.COUNT) for f in tasks.NEEDS_ATTENTION),
                  tasks.COUNT)
    since = {**params, "end": max(end, present + timedelta(seconds=1))}
    attention = _counted_back(needing, n, sql_rows(ATTENTION_SQL, since))
    return Activity(start, end, bucket, phases, latency_p50, latency_p95, failures, attention,
                    attention[-1])


def _counted_back(now: int, buckets: int, changes: list[tuple[int, int]]) -> list[int]:
    """How many at the end of each bucket, from how many now and each bucket's net
    change (buckets past the last: changes since): a bucket's count is the next one's
    less the next one's change."""
    net = [0] * buckets
    running = now
    for b, change in changes:
        if b >= buckets:
            running -= int(change)
        elif b >= 0:
            net[b] += int(change)
    counts = [0] * buckets
    for b in range(buckets - 1, -1, -1):
        counts[b] = max(running, 0)
        running -= net[b]
    return counts


@dataclass
class _Fresh:
    lock: threading.Lock = field(default_factory=threading.Lock)
    at: float = 0.0
    value: Activity | None = None


_fresh = _Fresh()


def recent_activity() -> Activity:
    """:func:`activity`, read again once it is :data:`FRESH_SECONDS` old."""
    with _fresh.lock:
        if _fresh.value is None or time.monotonic() - _fresh.at > FRESH_SECONDS:
            _fresh.value, _fresh.at = activity(), time.monotonic()
        return _fresh.value


def forget() -> None:
    """Read the activity afresh next time (a test that just committed wants to see it)."""
    with _fresh.lock:
        _fresh.value = None


# -- one session: its tasks by status over time ------------------------------------------

SESSION_SQL = """
WITH items AS (
    SELECT c.at, c.seq, i->>'id' AS task,
           coalesce(i->>'outcome', i->>'status') AS status
    FROM kernel_commit c JOIN kernel_session s ON s.id = c.session_id
    CROSS JOIN LATERAL jsonb_array_elements(c.summary) AS i
    WHERE c.session_id = %(session)s AND c.seq > s.pruned_seq AND i->>'type' = 'task'
), changes AS (
    SELECT at, status, lag(status) OVER (PARTITION BY task ORDER BY seq) AS prev FROM items
), deltas AS (
    SELECT at, status, 1 AS n FROM changes WHERE prev IS DISTINCT FROM status
    UNION ALL
    SELECT at, prev, -1 FROM changes WHERE prev IS NOT NULL AND prev <> status
)
SELECT least(floor(extract(epoch FROM at - %(start)s) / %(bucket)s)::int, %(last)s) AS b,
       status, sum(n)
FROM deltas GROUP BY 1, 2
"""


SPAN_SQL = (
    "SELECT min(c.at), max(c.at) FROM kernel_commit c JOIN kernel_session s "
    "ON s.id = c.session_id WHERE c.session_id = %s AND c.seq > s.pruned_seq"
)
"""The session's log as the feed reads it, after ``pruned_seq``: a keyed commit a trim
kept below it stands alone among commits that are gone (a retry would draw its task
pending for good)."""


@dataclass(frozen=True)
class SessionHistory:
    """A session's tasks by shown status at the end of each bucket, from its first commit
    to now (or its last, if later)."""

    start: datetime
    end: datetime
    bucket_seconds: float
    counts: dict[str, list[int]]
    """By shown status, in lifecycle order: the count at the end of each bucket."""


def session_history(session_id: str, buckets: int = 60,
                    now: datetime | None = None) -> SessionHistory | None:
    """None for a session without commits. Each task's status changes become +1/-1 per
    status and bucket in SQL; the running sums here are buckets x statuses. ``now``: the
    database's clock unless given, as commits are dated by (the web machine's may
    disagree)."""
    span = sql_rows(SPAN_SQL, [session_id])
    if not span or span[0][0] is None:
        return None
    start, last = span[0]
    end = max(last, now or process_kernel().clock.now())
    width = max((end - start).total_seconds() / buckets, 0.001)
    deltas: dict[str, list[int]] = {}
    for b, status, n in sql_rows(SESSION_SQL, {"session": session_id, "start": start,
                                               "bucket": width, "last": buckets - 1}):
        deltas.setdefault(status, [0] * buckets)[max(0, b)] += int(n)
    order = [s for s in SHOWN_STATUSES if s in deltas] + sorted(set(deltas) - set(SHOWN_STATUSES))
    counts = {}
    for status in order:
        running, series = 0, []
        for n in deltas[status]:
            running += n
            series.append(running)
        if any(series):
            counts[status] = series
    return SessionHistory(start, end, width, counts)
