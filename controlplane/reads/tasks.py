"""Tasks as the API and the pages show them: found by filters, one by id, as a tree,
counted by shown status, and who holds their leases."""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db.models import Exists, OuterRef, Q, QuerySet

from controlplane import models
from controlplane.errors import Invalid
from controlplane.process.kernel import process_kernel
from controlplane.reads import environments
from controlplane.reads.approvals import TOOL_KIND
from controlplane.reads.snapshot import rows as sql_rows
from controlplane.storage import search, task_blocked
from controlplane.storage.schema import COMMIT, TASK
from kernel import Blocked, Decision, Outcome, Status, Task, UnknownRecord, tracing
from kernel.agent.approval import PHASE as APPROVAL_PHASE
from kernel.records import SHOWN_STATUSES

SHOWN_STATUS_SQL = (
    "CASE WHEN status = 'terminal' THEN coalesce(outcome->>'kind', 'terminal') ELSE status END"
)
""":attr:`kernel.records.Task.shown_status` in SQL, for counting in the database
(``tests/integration/test_reads.py`` checks that both agree)."""


@dataclass(frozen=True)
class TaskFilter:
    """Which tasks: every field that is set must match."""

    session_id: str | None = None
    kind: str | None = None
    status: str | None = None
    outcome: str | None = None
    waiting_for_resolution: bool | None = None
    since: datetime | None = None
    until: datetime | None = None
    parent_id: str | None = None
    """A parent's id, or ``"root"`` for tasks without one."""
    outcome_in: tuple[str, ...] | None = None
    changed_after: int | None = None
    """Changed by a commit after this seq (with ``session_id``)."""
    text: str | None = None
    """Text anywhere in the task's input (its JSON text, case-insensitive)."""
    phase: str | None = None

    def any_set(self) -> bool:
        return any(value is not None and value != "" for value in vars(self).values())


FAILED_OUTCOMES = (str(Outcome.FAILED), str(Outcome.FAULTED))
AWAITING_RESOLUTION = TaskFilter(waiting_for_resolution=True)
"""Uncertain steps: tasks waiting on a signal only an operator's resolution sends."""
FAILED = TaskFilter(status=Status.TERMINAL, outcome_in=FAILED_OUTCOMES)
RETRY_ALL_FAILED = TaskFilter(status=Status.TERMINAL, outcome=str(Outcome.FAILED))
"""What the attention list's "retry all N failed" retries: failed tasks (a faulted one is
looked at and retried on its own)."""
AWAITING_APPROVAL = TaskFilter(kind=TOOL_KIND, status=Status.SLEEPING,
                               phase=APPROVAL_PHASE)
"""Tool calls asleep until an operator approves or denies them (the approval gate)."""
NEEDS_ATTENTION = (AWAITING_RESOLUTION, FAILED, AWAITING_APPROVAL)
"""What needs an operator, as the attention list, its count and its chart read it.
(Blocked tasks, which no definition in this process can run, whose environment a
worker found it does not offer, or which the workers found blocked, are found at read
time, by the registry, the workers' reports and the dispatch rows (:func:`blocked`): the
list shows them, but the count and the chart do not.)"""


def needs_attention_sql(item: str) -> str:
    """:data:`NEEDS_ATTENTION` over a commit summary's task item (the JSON ``item``), which
    names the status, the outcome and, while the task waits on one, the signal
    (``tests/integration/test_reads.py`` checks that both agree)."""
    outcomes = ", ".join(f"'{o}'" for o in FAILED_OUTCOMES)
    return (f"(({item}->>'status' = '{Status.WAITING}' AND {item} ? 'signal') OR "
            f"({item}->>'status' = '{Status.TERMINAL}' AND {item}->>'outcome' IN ({outcomes}))"
            f" OR ({item}->>'kind' = '{TOOL_KIND}' AND {item}->>'status' = "
            f"'{Status.SLEEPING}' AND {item}->>'phase' = '{APPROVAL_PHASE}'))")


@dataclass(frozen=True)
class TaskView:
    """A task record with what is shown beside it: why no definition can run it, what
    it waits on, how many attempts its phase has made. Attribute reads fall through to
    the record (templates say ``task.kind``)."""

    task: Task
    blocked: str | None = None
    environment: dict[str, Any] | None = None
    """A worker's current report that it does not offer the run's environment
    (:mod:`controlplane.reads.environments`): read for one task's page, not for lists."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self.task, name)

    @property
    def environment_report(self) -> str | None:
        """The identity of :attr:`environment` that a migrate or a restart carries."""
        return None if self.environment is None else environments.identity(self.environment)

    @property
    def shown_status(self) -> str:
        return self.task.shown_status

    @property
    def waits_on(self) -> str:
        return self.task.waits_on.describe()

    @property
    def decisions(self) -> tuple[Decision, ...]:
        """What an operator may answer it now (its definition's, while it waits on a
        signal)."""
        return process_kernel().registry.decisions(self.task)

    @property
    def step(self) -> dict[str, Any] | None:
        """The uncertain step an operator may resolve now (what ``resolve`` names), or
        None: the signal it waits on and its epoch, which no later step shares."""
        signal = self.task.waits_on.signal
        if signal is None or not self.decisions:
            return None
        return {"signal": signal, "epoch": self.task.epoch}

    @property
    def trace_id(self) -> str | None:
        """The trace its phases' spans are in (OpenTelemetry), when it was created in one."""
        return tracing.trace_id(self.task.trace)

    @property
    def trace_url(self) -> str | None:
        """Where the trace is shown (``settings.TRACE_URL`` with ``{trace_id}``), if set:
        the id goes into the URL as it is, so only a valid W3C one is taken
        (:func:`kernel.tracing.trace_id` gives no other)."""
        found = self.trace_id
        if found is None or not settings.TRACE_URL:
            return None
        return settings.TRACE_URL.replace("{trace_id}", found)

    @property
    def attempts(self) -> int:
        checkpoint = self.task.checkpoint
        return int(checkpoint.get("attempts", 0)) if isinstance(checkpoint, dict) else 0


def view(task: Task) -> TaskView:
    blocked = None
    if not task.terminal:
        resolved = process_kernel().registry.resolve(task)
        blocked = resolved.reason if isinstance(resolved, Blocked) else None
    return TaskView(task, blocked)


ORDERS: dict[str, tuple[str, ...]] = {
    "tree": ("session_id", "created_seq", "id"),
    "created": ("id",),
    "-created": ("-id",),
    "kind": ("kind", "-id"),
    "-kind": ("-kind", "-id"),
    "status": ("status", "outcome__kind", "-id"),
    "-status": ("-status", "-outcome__kind", "-id"),
}
"""How a list of tasks may be sorted: ``tree``, a session's creation order (the tree's);
``created``, by id, which is creation time across sessions (``new_id`` puts the time
first), on the primary key's index; by kind; by status."""


def in_utc(moment: datetime) -> datetime:
    """``moment`` in UTC, as a filter compares it: Postgres refuses offsets beyond ±16 h,
    which Python and RFC 3339 allow. A moment the calendar ends before once in UTC (year
    9999 behind UTC, year 1 ahead of it: what a URL or a form may give) is that end."""
    try:
        return moment.astimezone(UTC)
    except OverflowError:
        return (datetime.min if moment.year == 1 else datetime.max).replace(tzinfo=UTC)


def _query(found: TaskFilter, order: str = "tree") -> QuerySet[models.Task]:
    rows = models.Task.objects.all()
    if found.session_id:
        rows = rows.filter(session_id=found.session_id)
    if found.kind:
        rows = rows.filter(kind=found.kind)
    if found.status:
        rows = rows.filter(status=found.status)
    if found.phase:
        rows = rows.filter(phase=found.phase)
    if found.outcome:
        rows = rows.filter(status=Status.TERMINAL, outcome__kind=found.outcome)
    if found.outcome_in:
        rows = rows.filter(status=Status.TERMINAL, outcome__kind__in=found.outcome_in)
    if found.changed_after is not None:
        rows = rows.filter(updated_seq__gt=found.changed_after)
    if found.text:
        where, params = search.input_contains(found.text)
        rows = rows.extra(where=[where], params=params)
    if found.waiting_for_resolution is not None:
        waits = Q(status=Status.WAITING, wait__has_key="signal")
        rows = rows.filter(waits) if found.waiting_for_resolution else rows.exclude(waits)
    if found.since or found.until:
        since, until = (in_utc(t) if t else None for t in (found.since, found.until))
        last_change = models.Commit.objects.filter(
            session_id=OuterRef("session_id"), seq=OuterRef("updated_seq")
        )
        if since:
            last_change = last_change.filter(at__gte=since)
        if until:
            last_change = last_change.filter(at__lt=until)
        rows = rows.filter(Exists(last_change))
    if found.parent_id == "root":
        rows = rows.filter(parent_id__isnull=True)
    elif found.parent_id:
        rows = rows.filter(parent_id=found.parent_id)
    return rows.order_by(*ORDERS[order])


def _records(rows: QuerySet[models.Task]) -> list[Task]:
    return [TASK.record(values) for values in rows.values(*TASK.columns)]


def find(
    found: TaskFilter, offset: int = 0, limit: int = 200, order: str = "tree",
    blocked: bool | None = None,
) -> list[TaskView]:
    """Matching tasks in creation order (or another of :data:`ORDERS`), one page; with
    ``blocked``, only those no definition here can run (or only the others), picked
    before the page is cut."""
    rows = _query(found, order)
    if blocked is not None:
        stopped = blocked_ids(found)
        rows = rows.filter(id__in=stopped) if blocked else rows.exclude(id__in=stopped)
    return [view(t) for t in _records(rows[offset : offset + limit])]


MAX_JUDGED = 10_000
"""The most tasks :func:`blocked_ids` asks the registry about (one call each)."""


def blocked_ids(found: TaskFilter) -> list[str]:
    """The ids of the tasks ``found`` matches that no definition here can run (what a
    task's ``blocked`` says). Only a task not ended, stored at a kind and version no
    definition is registered under as such, can be: those are the ones the registry is
    asked about, :data:`MAX_JUDGED` at most (Invalid past them)."""
    registry = process_kernel().registry
    rows = _query(found).exclude(status=Status.TERMINAL)
    for kind, version in registry.versions():
        rows = rows.exclude(kind=kind, version=version)
    judged = _records(rows[: MAX_JUDGED + 1])
    if len(judged) > MAX_JUDGED:
        raise Invalid(f"blocked: more than {MAX_JUDGED} tasks await a definition to judge; "
                      "narrow the filter (session_id, kind)")
    return [t.id for t in judged if isinstance(registry.resolve(t), Blocked)]


def find_ids(task_ids: list[str]) -> list[TaskView]:
    """These tasks (those that exist), in creation order."""
    if not task_ids:
        return []
    rows = models.Task.objects.filter(id__in=task_ids).order_by("session_id", "created_seq", "id")
    return [view(t) for t in _records(rows)]


def ids(found: TaskFilter, limit: int, order: str = "tree") -> list[str]:
    """The ids of the first ``limit`` matching tasks (a bulk action's target set; the
    tasks page's count and pages, from one read of the matches)."""
    # The ORM's statement, its rows read plainly: a thousand ids through the queryset's
    # iterator cost more than the statement itself.
    statement, params = _query(found, order).values_list("id")[:limit].query.sql_with_params()
    return [task_id for (task_id,) in sql_rows(statement, params)]


@dataclass(frozen=True)
class Row:
    """What a list of tasks shows of one task (a row of the tasks page), read without
    the rest of its record: a page of rows is one statement, with no checkpoint, wait or
    lease to read and decode, and no definition to look up."""

    id: str
    kind: str
    shown_status: str
    session_id: str
    phase: str
    updated_seq: int
    input_start: str
    """The start of its input as JSON text (the database's), at most
    :data:`INPUT_SHOWN` characters and one more where there are more: a task's input may
    be large, and a page of rows reads and sends only what it shows."""
    changed_at: datetime | None
    """When it last changed: the time of the commit of its ``updated_seq``."""


INPUT_SHOWN = 160
"""Characters of a task's input a row shows."""
ROWS = (
    "SELECT t.id, t.kind, t.shown, t.session_id, t.phase, t.updated_seq, t.input_start, c.at "
    f"FROM (SELECT id, kind, {SHOWN_STATUS_SQL} AS shown, session_id, phase, updated_seq, "
    f"left(input::text, {INPUT_SHOWN + 1}) AS input_start FROM {TASK.name} "
    "WHERE id = ANY(%s::text[])) t "
    f"LEFT JOIN {COMMIT.name} c ON c.session_id = t.session_id AND c.seq = t.updated_seq"
)


def rows(task_ids: list[str]) -> list[Row]:
    """These tasks' rows (those that exist), in the order given."""
    if not task_ids:
        return []
    found = {row[0]: Row(*row) for row in sql_rows(ROWS, [task_ids], prepared=True)}
    return [found[i] for i in task_ids if i in found]


NAMED_BY = {"retry": "updated_seq", "cancel": "run"}
"""What a bulk action's set names each task by beside its id, as its preview found it:
a retry its last change (it acts on the failure the operator saw, not on a later one), a
cancel its run (it stops the run the operator saw, whatever phase that run has reached
since, and not a run started again since)."""


@dataclass(frozen=True)
class TaskSet:
    """Tasks a filter found, named: their ids (a session's creation order), each one's
    ``named_by`` field as found (``seen``, in the same order), and the digest of both,
    which an operator's confirmation carries back so that a bulk action acts on exactly
    the tasks its preview showed, as it showed them."""

    task_ids: list[str]
    seen: list[int]
    named_by: str

    @property
    def count(self) -> int:
        return len(self.task_ids)

    @property
    def digest(self) -> str:
        return digest(zip(self.task_ids, self.seen, strict=True))


def digest(named: Iterable[tuple[str, int]]) -> str:
    """SHA-256 (hex) of the tasks, one a line as ``<id> <seen>``, sorted: the same tasks
    as they were, the same digest."""
    return hashlib.sha256(
        "\n".join(sorted(f"{task_id} {seen}" for task_id, seen in named)).encode()
    ).hexdigest()


def task_set(found: TaskFilter, limit: int, named_by: str) -> TaskSet:
    """The first ``limit`` matching tasks, as a set named by their field ``named_by``
    (one of :data:`NAMED_BY`'s)."""
    if named_by not in NAMED_BY.values():
        raise ValueError(f"named_by: one of {sorted(NAMED_BY.values())}")
    statement, params = _query(found).values_list("id", named_by)[:limit].query.sql_with_params()
    rows = sql_rows(statement, params)
    return TaskSet([task_id for task_id, _ in rows], [int(seen) for _, seen in rows], named_by)


COUNT = 1000
"""Where a shown count stops ("more than"): a bulk action's most, too."""


def count(found: TaskFilter, up_to: int | None = None) -> int:
    """How many tasks match; with ``up_to``, counting stops past it (a page says "more
    than N" instead of reading every match of a wide filter)."""
    rows = _query(found).order_by()
    return rows.count() if up_to is None else rows[: up_to + 1].count()


def get(task_id: str) -> TaskView:
    found = _records(models.Task.objects.filter(id=task_id))
    if not found:
        raise UnknownRecord(f"no task {task_id}")
    shown = view(found[0])
    report = environments.report(found[0])
    if report is not None:
        return TaskView(shown.task, shown.blocked or environments.reason(report), report)
    if shown.blocked is None and not shown.terminal and _rows_blocked([task_id]):
        return TaskView(shown.task, WORKERS_FOUND_BLOCKED)
    return shown


def record(task_id: str) -> Task:
    """The task record alone (what a command checks before it acts)."""
    found = process_kernel().storage.task(task_id)
    if found is None:
        raise UnknownRecord(f"no task {task_id}")
    return found


def not_terminal(limit: int) -> list[TaskView]:
    return [view(t) for t in _records(models.Task.objects.exclude(status=Status.TERMINAL)
                                      .order_by("id")[:limit])]


WORKERS_FOUND_BLOCKED = ("the workers that took it have no definition that runs it "
                         "(this web server's has one): it waits for a deploy of workers")
"""Why a task is blocked that this process's registry could run: the workers' could not."""


def blocked(limit: int) -> list[TaskView]:
    """Of the first ``limit`` tasks not ended, those no worker can run: no definition
    here can (the registry says why), a worker found it does not offer the environment
    the run was started under (its current report says why), or the workers found it
    blocked (its dispatch rows say so, as the queue depths count it:
    :func:`controlplane.storage.statements.task_blocked`)."""
    scanned = not_terminal(limit)
    reports = environments.current(t.task for t in scanned if not t.blocked)
    rows_blocked = _rows_blocked([t.id for t in scanned if not t.blocked
                                  and t.id not in reports])
    found = []
    for shown in scanned:
        if shown.blocked:
            found.append(shown)
        elif shown.id in reports:
            found.append(TaskView(shown.task, environments.reason(reports[shown.id]),
                                  reports[shown.id]))
        elif shown.id in rows_blocked:
            found.append(TaskView(shown.task, WORKERS_FOUND_BLOCKED))
    return found


def _rows_blocked(task_ids: list[str]) -> set[str]:
    """Which of these tasks the workers found blocked (their dispatch rows say so)."""
    if not task_ids:
        return set()
    return {task_id for (task_id,) in sql_rows(
        f"SELECT t.id FROM {TASK.name} t WHERE t.id = ANY(%s) AND {task_blocked('t')}",
        [task_ids])}


def stuck(now: datetime, cutoff: datetime,
          blocked_scan: int = 2000) -> list[tuple[TaskView, str]]:
    """Tasks an operator should look at from a shell, each with why: an expired lease, a
    sleep overdue since before ``cutoff``, a wait for an operator, a dispatch not picked
    up since before ``cutoff``; and, whatever their age, the tasks :func:`blocked` finds
    among the first ``blocked_scan`` not ended (as the dashboard's attention list does:
    waiting longer does not unblock them)."""
    stopped = {shown.id: shown for shown in blocked(blocked_scan)}
    rows = models.Task.objects.filter(
        Q(status=Status.RUNNING, lease_until__lt=now)
        | Q(status=Status.SLEEPING, wake_at__lt=cutoff)
        | Q(status=Status.WAITING, wait__has_key="signal")
        | Q(status=Status.PENDING, id__in=models.Dispatch.objects.filter(
            not_before__lt=cutoff).values("task_id"))
    ).order_by("session_id", "created_seq")
    found = []
    for shown in (view(t) for t in _records(rows)):
        shown = stopped.pop(shown.id, shown)
        task = shown.task
        why = {
            Status.RUNNING: f"lease of {task.lease_owner} expired {task.lease_until:%H:%M:%S}",
            Status.SLEEPING: f"overdue since {task.wake_at:%H:%M:%S}" if task.wake_at else "",
            Status.WAITING: f"waiting for {(task.wait or {}).get('signal')}",
            Status.PENDING: "not picked up",
        }.get(task.status, "")
        found.append((shown, f"blocked: {shown.blocked}" if shown.blocked else why))
    found.extend((shown, f"blocked: {shown.blocked}") for shown in stopped.values())
    return found


@dataclass(frozen=True)
class TreeNode:
    task: TaskView
    children: list[TreeNode]


def tree(session_id: str, limit: int) -> list[TreeNode] | None:
    """Every task of the session nested under its parent (roots first); None when the
    session has more than ``limit`` tasks. UnknownRecord if there is no such session."""
    found = _records(_query(TaskFilter(session_id=session_id))[: limit + 1])
    if len(found) > limit:
        return None
    if not found and process_kernel().storage.session(session_id) is None:
        raise UnknownRecord(f"no session {session_id}")
    children: dict[str | None, list[Task]] = defaultdict(list)
    for task in found:
        children[task.parent_id].append(task)

    def node(task: Task) -> TreeNode:
        return TreeNode(view(task), [node(c) for c in children[task.id]])

    known = {t.id for t in found}
    return [node(t) for t in found if t.parent_id is None or t.parent_id not in known]


# -- counts by shown status -------------------------------------------------------------


def ordered(counts: dict[str, int]) -> list[tuple[str, int]]:
    """Counts in lifecycle order, then any other status by name."""
    known = [(s, counts[s]) for s in SHOWN_STATUSES if counts.get(s)]
    return known + sorted((s, n) for s, n in counts.items() if s not in SHOWN_STATUSES and n)


def status_counts(session_id: str | None = None) -> dict[str, int]:
    """Tasks by shown status (terminal ones by outcome), of a session or of all."""
    where, params = ("WHERE session_id = %s", [session_id]) if session_id else ("", [])
    return dict(sql_rows(
        f"SELECT {SHOWN_STATUS_SQL}, count(*) FROM kernel_task {where} GROUP BY 1", params
    ))


def counts_by_session(session_ids: Iterable[str]) -> dict[str, dict[str, int]]:
    """For each session, its tasks by shown status."""
    found: dict[str, dict[str, int]] = {s: {} for s in session_ids}
    for session_id, status, n in sql_rows(
        f"SELECT session_id, {SHOWN_STATUS_SQL}, count(*) FROM kernel_task "
        "WHERE session_id = ANY(%s) GROUP BY 1, 2", [list(found)]
    ):
        found[session_id][status] = n
    return found


def child_counts(session_id: str, parent_ids: list[str]) -> dict[str, dict[str, int]]:
    """For each parent, its children by shown status."""
    found: dict[str, dict[str, int]] = defaultdict(dict)
    if parent_ids:
        for parent, status, n in sql_rows(
            f"SELECT parent_id, {SHOWN_STATUS_SQL}, count(*) FROM kernel_task "
            "WHERE session_id = %s AND parent_id = ANY(%s) GROUP BY 1, 2",
            [session_id, parent_ids],
        ):
            found[parent][status] = n
    return found


def sessions_having(shown_status: str) -> QuerySet[models.Task]:
    """The session ids with a task in this shown status (a subquery for a session filter)."""
    if shown_status in tuple(Outcome):
        having = models.Task.objects.filter(status=Status.TERMINAL, outcome__kind=shown_status)
    else:
        having = models.Task.objects.filter(status=shown_status)
    return having.values("session_id")
