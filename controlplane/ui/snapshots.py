"""What a page shows, read from one consistent snapshot and tagged with its position.

Every read of a page (the first render, a page of children, a live update) runs in one
``REPEATABLE READ`` transaction that also reads the session's ``head_seq`` (or the
highest commit id), so that the ``data-seq`` a fragment carries is exactly the state it
shows: a fragment tagged N shows every commit up to N and none after. The browser drops
a fragment older than what it shows (see ``static/ui.js``).

Task rows come from the API's own query and shape (:func:`controlplane.api.tasks.filtered`,
:func:`~controlplane.api.tasks.task_out`); this module only adds what a page needs on top:
status counts by parent, pages of children, and the session's other records.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from django.db import connection, transaction

from controlplane import models
from controlplane.api.tasks import filtered, task_out
from controlplane.execution import runtime
from controlplane.notices.tasks import PLAN
from kernel.agent import turn
from kernel.commit import operations_log_id

CHILD_PAGE = 50
"""Children per page of a collapsed group (an htmx GET loads the next)."""
EXPAND_UP_TO = 50
"""A parent with at most this many children shows them at once, and live; a bigger one
shows its counts and loads its children by page."""
ROOT_PAGE = 200
ENTRY_TAIL = 200
"""The transcript shows the last entries of each conversation."""
PROGRESS = turn.PROGRESS  # the agent turn streams its text into these documents


@contextmanager
def snapshot() -> Iterator[None]:
    """One ``REPEATABLE READ`` transaction: all reads inside see the same commits."""
    outermost = not connection.in_atomic_block
    with transaction.atomic():
        if outermost:  # inside someone else's transaction, its snapshot rules
            with connection.cursor() as cur:
                cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        yield


def _rows(sql: str, params: list[Any]) -> list[Any]:
    with connection.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchall()


SHOWN_STATUS = (
    "CASE WHEN status = 'terminal' THEN coalesce(outcome->>'kind', 'terminal') ELSE status END"
)
ORDER = ["pending", "running", "waiting", "sleeping", "completing",
         "succeeded", "failed", "cancelled", "faulted"]


def ordered(counts: dict[str, int]) -> list[tuple[str, int]]:
    """Counts in lifecycle order, then any other status by name."""
    known = [(s, counts[s]) for s in ORDER if counts.get(s)]
    return known + sorted((s, n) for s, n in counts.items() if s not in ORDER and n)


def status_counts(session_id: str | None = None) -> dict[str, int]:
    """Tasks by shown status (terminal ones by outcome), of a session or of all."""
    where, params = ("WHERE session_id = %s", [session_id]) if session_id else ("", [])
    return dict(_rows(f"SELECT {SHOWN_STATUS}, count(*) FROM kernel_task {where} GROUP BY 1",
                      params))


def child_counts(session_id: str, parent_ids: list[str]) -> dict[str, dict[str, int]]:
    """For each parent, its children by shown status."""
    found: dict[str, dict[str, int]] = defaultdict(dict)
    if parent_ids:
        for parent, status, count in _rows(
            f"SELECT parent_id, {SHOWN_STATUS}, count(*) FROM kernel_task "
            "WHERE session_id = %s AND parent_id = ANY(%s) GROUP BY 1, 2",
            [session_id, parent_ids],
        ):
            found[parent][status] = count
    return found


def shown(row: Any) -> dict[str, Any]:
    """A task as the API shows it, plus what a row needs: its shown status, its attempts,
    what it waits on."""
    out = task_out(row)
    out["shown_status"] = (out["outcome"] or {}).get("kind", "terminal") \
        if out["status"] == "terminal" else out["status"]
    out["attempts"] = (out["checkpoint"] or {}).get("attempts", 0) if isinstance(
        out["checkpoint"], dict) else 0
    wait = out["wait"] or {}
    if "signal" in wait:
        out["waits_on"] = f"signal {wait['signal']} (an operator)"
    elif "deps" in wait:
        out["waits_on"] = f"{len(wait['deps'])} tasks ({wait.get('policy', 'all_settled')})"
    elif out["status"] == "sleeping" and out["wake_at"] and out.get("cancel"):
        # A cancel waits for the phase it interrupted (see kernel.commit's _cancel).
        until = f"{out['wake_at']:%H:%M:%S}"
        out["waits_on"] = f"the interrupted phase to return (at most until {until})"
    elif out["status"] == "sleeping" and out["wake_at"]:
        out["waits_on"] = f"until {out['wake_at']:%H:%M:%S}"
    else:
        out["waits_on"] = ""
    return out


@dataclass
class Node:
    """A task row in the tree, with its children collapsed (counts) or shown (a page)."""

    task: dict[str, Any]
    counts: list[tuple[str, int]] = field(default_factory=list)
    total: int = 0
    children: list[Node] | None = None
    next_page: int | None = None

    @property
    def id(self) -> str:
        return str(self.task["id"])


def nodes(session_id: str, rows: list[Any], depth: int = 0) -> list[Node]:
    """Rows as tree nodes; small groups of children are shown (two levels at most)."""
    counts = child_counts(session_id, [r.id for r in rows])
    found = []
    for row in rows:
        mine = counts.get(row.id, {})
        node = Node(shown(row), ordered(mine), sum(mine.values()))
        if node.total and node.total <= EXPAND_UP_TO and depth < 2:
            node.children = nodes(session_id, list(filtered(session_id, parent_id=row.id)),
                                  depth + 1)
        found.append(node)
    return found


def roots(session_id: str) -> list[Node]:
    return nodes(session_id, list(filtered(session_id, parent_id="root")[:ROOT_PAGE]))


def children_page(session_id: str, parent_id: str, page: int) -> tuple[list[Node], int | None]:
    """One page of a parent's children (1-based) and the number of the next, if any."""
    start = (page - 1) * CHILD_PAGE
    rows = list(filtered(session_id, parent_id=parent_id)[start : start + CHILD_PAGE + 1])
    more = len(rows) > CHILD_PAGE
    return nodes(session_id, rows[:CHILD_PAGE], depth=2), page + 1 if more else None


def head_seq(session_id: str) -> int | None:
    found = _rows("SELECT head_seq FROM kernel_session WHERE id = %s", [session_id])
    return int(found[0][0]) if found else None


def last_commit_id() -> int:
    return int(_rows("SELECT coalesce(max(id), 0) FROM kernel_commit", [])[0][0])


def plans(session_id: str) -> list[dict[str, Any]]:
    """The session's email plans: each recipient with its receipt state."""
    kernel = runtime().kernel
    found = []
    for doc in models.Document.objects.filter(session_id=session_id, kind=PLAN).order_by("id"):
        value = kernel.document(session_id, PLAN, doc.key) or {}
        recipients = [
            {"to": to, **entry} for to, entry in (value.get("recipients") or {}).items()
        ]
        found.append({"task_id": doc.key, "subject": value.get("subject", ""),
                      "channel": value.get("channel", ""), "recipients": recipients,
                      "version": doc.version})
    return found


def progress(session_id: str) -> list[dict[str, Any]]:
    """Streamed text and tool output still being produced (progress documents)."""
    kernel = runtime().kernel
    found = []
    for doc in models.Document.objects.filter(session_id=session_id, kind=PROGRESS).order_by(
        "-updated_seq"
    )[:5]:
        value = kernel.document(session_id, PROGRESS, doc.key) or {}
        found.append({"task_id": doc.key, "text": value.get("text", ""),
                      "output": value.get("output", "")})
    return found


def transcript(session_id: str) -> list[dict[str, Any]]:
    """Each conversation (the operations log last) with its last entries."""
    kernel = runtime().kernel
    ops = operations_log_id(session_id)
    conversations = sorted(
        models.Conversation.objects.filter(session_id=session_id),
        key=lambda c: (c.id == ops, c.created_seq),
    )
    return [
        {"id": c.id, "operations": c.id == ops, "fork_of": c.fork_of,
         "entries": kernel.entries(c.id)[-ENTRY_TAIL:]}
        for c in conversations
    ]


def submissions(session_id: str) -> list[models.Submission]:
    return list(models.Submission.objects.filter(session_id=session_id).order_by("created_seq"))


def timeline(task_id: str, session_id: str) -> list[dict[str, Any]]:
    """The commits that touched a task, in order, with what each did to it."""
    found = []
    for commit in models.Commit.objects.filter(
        session_id=session_id, summary__contains=[{"type": "task", "id": task_id}]
    ).order_by("seq")[:1000]:
        item = next(i for i in commit.summary if i.get("type") == "task" and i["id"] == task_id)
        found.append({"seq": commit.seq, "at": commit.at, "actor": commit.actor,
                      "status": item.get("outcome") or item.get("status"),
                      "phase": item.get("phase")})
    return found
