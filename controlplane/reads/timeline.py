"""One task's history on a time axis, from the commit log: a waterfall of its phases.

Every commit that touched the task names it in its summary (status, phase, and since
this read was added, the lease holder and epoch it committed through, what it waits
for, its restarts). A phase's row runs from the commit that entered it to the commit
that left it (the task's last commit for the last one, or now while it runs), so the
rows tile the task's span: their durations add up to it. Inside a row, each commit
starts a segment in the status it left the task in (queued, running, waiting on
tasks or a signal, asleep until a time). Operators' actions on the task come from the
session's operations log (who, why), placed on the same axis.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from controlplane import models
from kernel.commit import operations_log_id

MAX_COMMITS = 20_000

LABELS = {"pending": "queued", "running": "running", "completing": "completing",
          "terminal": "ended"}


@dataclass
class Mark:
    """One commit of the task."""

    seq: int
    at: datetime
    actor: str
    status: str
    phase: str
    outcome: str | None = None
    holder: str | None = None
    epoch: int | None = None
    restarts: int = 0
    waits: str = ""
    offset: float = 0.0
    """Seconds since the task's first commit."""

    @property
    def label(self) -> str:
        return self.waits or LABELS.get(self.status, self.status)


@dataclass
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
    start: datetime
    end: datetime
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


@dataclass
class Timeline:
    start: datetime | None
    end: datetime | None
    seconds: float
    open: bool
    rows: list[PhaseRow]
    commits: list[Mark]
    actions: list[Action]


def _waits(item: dict[str, Any]) -> str:
    if item.get("signal"):
        return f"waits on signal {item['signal']}"
    if item.get("deps") is not None and item.get("status") == "waiting":
        return f"waits on {item['deps']} task{'' if item['deps'] == 1 else 's'}"
    if item.get("until") and item.get("status") == "sleeping":
        try:
            until = datetime.fromisoformat(item["until"]).astimezone(UTC)
        except ValueError:
            return "asleep"
        return f"asleep until {until:%H:%M:%S}"
    if item.get("status") == "waiting":
        return "waiting"
    return ""


def marks(task_id: str, session_id: str) -> list[Mark]:
    """The commits that touched the task, in order."""
    found = []
    for seq, at, actor, summary in models.Commit.objects.filter(
        session_id=session_id, summary__contains=[{"type": "task", "id": task_id}]
    ).order_by("seq").values_list("seq", "at", "actor", "summary")[:MAX_COMMITS]:
        item = next(i for i in summary if i.get("type") == "task" and i.get("id") == task_id)
        found.append(Mark(seq, at, actor, str(item.get("status")), str(item.get("phase")),
                          item.get("outcome"), item.get("holder"), item.get("epoch"),
                          int(item.get("restarts") or 0), _waits(item)))
    return found


def actions(task_id: str, session_id: str) -> list[tuple[int, datetime, str, dict[str, Any]]]:
    """(seq, at, kind, payload) of the operations-log entries that name the task."""
    return list(models.Entry.objects.filter(
        session_id=session_id, conversation_id=operations_log_id(session_id),
        payload__target=task_id,
    ).order_by("seq", "ordinal").values_list("seq", "created_at", "kind", "payload"))


def timeline(task_id: str, session_id: str, terminal: bool,
             now: datetime | None = None) -> Timeline:
    commits = marks(task_id, session_id)
    if not commits:
        return Timeline(None, None, 0.0, not terminal, [], [], [])
    start = commits[0].at
    end = commits[-1].at if terminal else max(now or datetime.now(UTC), commits[-1].at)
    span = (end - start).total_seconds()

    def pct(at: datetime) -> float:
        return 100.0 * (at - start).total_seconds() / span if span > 0 else 0.0

    rows: list[PhaseRow] = []
    for i, mark in enumerate(commits):
        mark.offset = (mark.at - start).total_seconds()
        if i and mark.holder:  # it committed what the previous commit's phase did
            row = rows[-1]
            if mark.holder not in row.holders:
                row.holders.append(mark.holder)
            if mark.epoch is not None and mark.epoch not in row.epochs:
                row.epochs.append(mark.epoch)
        if mark.status == "terminal" and rows:
            rows[-1].outcome = mark.outcome
            rows[-1].commits.append(mark)
            continue  # the last commit closes the last phase
        if not rows or rows[-1].phase != mark.phase:
            rows.append(PhaseRow(mark.phase, mark.at, mark.at, 0.0, 0.0, 0.0))
        rows[-1].commits.append(mark)
        rows[-1].restarts = max(rows[-1].restarts, mark.restarts)
    for i, row in enumerate(rows):
        row.end = rows[i + 1].start if i + 1 < len(rows) else end
        row.open = i + 1 == len(rows) and not terminal
        row.seconds = (row.end - row.start).total_seconds()
        row.left, row.width = pct(row.start), pct(row.end) - pct(row.start)
        inside = [m for m in row.commits if m.status != "terminal"]
        for j, mark in enumerate(inside):
            if j and inside[j - 1].label == mark.label:
                continue  # one segment for commits that left it as it was (say, running)
            k = j + 1
            while k < len(inside) and inside[k].label == mark.label:
                k += 1
            until = inside[k].at if k < len(inside) else row.end
            row.segments.append(Segment(mark.status, mark.label, pct(mark.at),
                                        pct(until) - pct(mark.at),
                                        (until - mark.at).total_seconds()))
    done = [Action(kind, at, str(p.get("by", "")), str(p.get("reason", "")), seq, pct(at),
                   p.get("decision"))
            for seq, at, kind, p in actions(task_id, session_id)]
    return Timeline(start, end, span, not terminal, rows, commits, done)
