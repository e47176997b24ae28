"""One task's history on a time axis, from the commit log: a waterfall of its phases.

Every commit that touched the task names it in its summary (status, phase, and, except
in commits older than those fields, the lease holder and epoch it committed through,
what it waits for, its restarts). A phase's row runs from the commit that entered it to the commit
that left it (the task's last commit for the last one, or now while it runs), so the
rows tile the task's span: their durations add up to it. Inside a row, each commit
starts a segment in the status it left the task in (queued, running, waiting on
tasks or a signal, asleep until a time). Operators' actions on the task come from the
session's operations log (who, why), placed on the same axis.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from controlplane import models
from controlplane.process.kernel import process_kernel
from controlplane.reads.snapshot import rows as sql_rows
from kernel.commit import operations_log_id

MAX_COMMITS = 20_000
COMMITS_LISTED = 200
"""The commit list under the waterfall names the last ones; the waterfall covers all."""

LABELS = {"pending": "queued", "running": "running", "completing": "completing",
          "terminal": "ended"}


@dataclass(slots=True)
class Mark:
    """One commit of the task (times in seconds since the epoch: thousands of them are
    laid out, and float arithmetic is what the layout needs)."""

    seq: int
    t: float
    actor: str
    status: str
    phase: str
    outcome: str | None = None
    holder: str | None = None
    epoch: int | None = None
    restarts: int = 0
    waits: str = ""
    label: str = ""
    """What the commit left the task doing: what it waits for, or its status in words."""
    entered: bool = False
    """It moved the task into its phase, recording where it stood (a restart point)."""
    restart_of: int | None = None
    """A restart's commit: the seq of the phase entry it started again from."""
    offset: float = 0.0
    """Seconds since the task's first commit."""

    @property
    def at(self) -> datetime:
        return datetime.fromtimestamp(self.t, UTC)


@dataclass(slots=True)
class Segment:
    status: str
    label: str
    left: float
    width: float
    """Percent of the span."""
    seconds: float


@dataclass
class PhaseRow:
    phase: str
    start: float
    end: float
    """Seconds since the epoch."""
    seconds: float
    left: float
    width: float
    commits: list[Mark] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    holders: list[str] = field(default_factory=list)
    epochs: list[int] = field(default_factory=list)
    restarts: int = 0
    open: bool = False
    """Still under way (the task has not left it)."""
    outcome: str | None = None
    entered_seq: int | None = None
    """The commit that entered the phase, if it recorded where the task stood then: the
    point "start again from here" starts from (:mod:`controlplane.reads.restarts`)."""
    restart_of: int | None = None


@dataclass
class Action:
    """An operator's action on the task, from the operations log."""

    kind: str
    at: datetime
    by: str
    reason: str
    seq: int
    left: float
    detail: Any = None
    seen: Any = None
    """What the operator said they saw (the ``expected_*`` values the action carried)."""


@dataclass
class Timeline:
    start: datetime | None
    end: datetime | None
    seconds: float
    open: bool
    rows: list[PhaseRow]
    commits: list[Mark]
    actions: list[Action]

    @property
    def listed(self) -> list[Mark]:
        """The last :data:`COMMITS_LISTED` commits, for the list under the waterfall."""
        return self.commits[-COMMITS_LISTED:]


MARKS_SQL = """
SELECT c.seq, extract(epoch FROM c.at)::float8, c.actor, i->>'status', i->>'phase',
       i->>'outcome', i->>'holder', (i->>'epoch')::int, coalesce((i->>'restarts')::int, 0),
       i->>'signal', (i->>'deps')::int, i->>'until', i ? 'checkpoint', (i->>'restart_of')::int
FROM kernel_commit c JOIN kernel_session s ON s.id = c.session_id
CROSS JOIN LATERAL jsonb_array_elements(c.summary) i
WHERE c.session_id = %s AND c.seq > s.pruned_seq AND c.summary @> %s::jsonb
  AND i->>'type' = 'task' AND i->>'id' = %s
ORDER BY c.seq LIMIT %s
"""
"""The task's item of each commit that names it, its fields taken out in SQL (no JSON
decoding of whole summaries in Python), after the session's ``pruned_seq``, as the feed
reads the log: a keyed commit a trim kept below it stands alone among commits that are
gone, so it would make a phase (and a restart point) of what is no longer known."""


def _waits(status: str, signal: str | None, deps: int | None, until: str | None) -> str:
    if signal:
        return f"waits on signal {signal}"
    if deps is not None and status == "waiting":
        return f"waits on {deps} task{'' if deps == 1 else 's'}"
    if until and status == "sleeping":
        try:
            return f"asleep until {datetime.fromisoformat(until).astimezone(UTC):%H:%M:%S}"
        except ValueError:
            return "asleep"
    return "waiting" if status == "waiting" else ""


def marks(task_id: str, session_id: str) -> list[Mark]:
    """The commits that touched the task, in order."""
    contains = json.dumps([{"type": "task", "id": task_id}])
    found = []
    for seq, t, actor, status, phase, outcome, holder, epoch, restarts, signal, deps, until, \
            entered, restart_of in sql_rows(MARKS_SQL, [session_id, contains, task_id,
                                                        MAX_COMMITS]):
        waits = _waits(status, signal, deps, until)
        found.append(Mark(seq, t, actor, status, phase, outcome, holder, epoch, restarts,
                          waits, waits or LABELS.get(status, status), bool(entered),
                          restart_of))
    return found


def actions(task_id: str, session_id: str) -> list[tuple[int, datetime, str, dict[str, Any]]]:
    """(seq, at, kind, payload) of the operations-log entries that name the task."""
    return list(models.Entry.objects.filter(
        session_id=session_id, conversation_id=operations_log_id(session_id),
        payload__target=task_id,
    ).order_by("seq", "ordinal").values_list("seq", "created_at", "kind", "payload"))


def timeline(task_id: str, session_id: str, terminal: bool,
             now: datetime | None = None) -> Timeline:
    """``now``: where a task not ended runs to; the database's clock unless given, as
    commits are dated by (the web machine's may disagree)."""
    commits = marks(task_id, session_id)
    if not commits:
        return Timeline(None, None, 0.0, not terminal, [], [], [])
    start = commits[0].t
    end = commits[-1].t if terminal else max(
        (now or process_kernel().clock.now()).timestamp(), commits[-1].t)
    span = end - start
    scale = 100.0 / span if span > 0 else 0.0

    rows: list[PhaseRow] = []
    row: PhaseRow | None = None
    for i, mark in enumerate(commits):
        mark.offset = mark.t - start
        if i and mark.holder and row is not None:  # it committed what the phase before did
            if mark.holder not in row.holders:
                row.holders.append(mark.holder)
            if mark.epoch is not None and mark.epoch not in row.epochs:
                row.epochs.append(mark.epoch)
        if mark.status == "terminal" and row is not None:
            row.outcome = mark.outcome
            row.commits.append(mark)
            continue  # the last commit closes the last phase
        if row is None or row.phase != mark.phase or mark.restart_of is not None:
            row = PhaseRow(mark.phase, mark.t, mark.t, 0.0, 0.0, 0.0,
                           entered_seq=mark.seq if mark.entered else None,
                           restart_of=mark.restart_of)
            rows.append(row)
        row.commits.append(mark)
        if mark.restarts > row.restarts:
            row.restarts = mark.restarts
    for i, row in enumerate(rows):
        row.end = rows[i + 1].start if i + 1 < len(rows) else end
        row.open = i + 1 == len(rows) and not terminal
        row.seconds = row.end - row.start
        row.left, row.width = (row.start - start) * scale, row.seconds * scale
        inside = [m for m in row.commits if m.status != "terminal"]
        for j, mark in enumerate(inside):
            if j and inside[j - 1].label == mark.label:
                continue  # one segment for commits that left it as it was (say, running)
            k = j + 1
            while k < len(inside) and inside[k].label == mark.label:
                k += 1
            until = inside[k].t if k < len(inside) else row.end
            row.segments.append(Segment(mark.status, mark.label, (mark.t - start) * scale,
                                        (until - mark.t) * scale, until - mark.t))
    done = [Action(kind, at, str(p.get("by", "")), str(p.get("reason", "")), seq,
                   (at.timestamp() - start) * scale, p.get("decision") or p.get("restart"),
                   p.get("seen"))
            for seq, at, kind, p in actions(task_id, session_id)]
    return Timeline(datetime.fromtimestamp(start, UTC), datetime.fromtimestamp(end, UTC),
                    span, not terminal, rows, commits, done)
