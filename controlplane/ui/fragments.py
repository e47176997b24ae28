"""The partials a page's websocket sends after commits: re-rendered, tagged, out-of-band.

A page socket (:class:`controlplane.consumers.SessionPageConsumer` and
:class:`~controlplane.consumers.GlobalPageConsumer`) reads through these functions
instead of sending commit frames: whatever the number of commits after the cursor, one
message shows the state at the newest of them, with every element tagged ``data-seq``.
What a message re-renders is decided from the records themselves (``updated_seq``,
``created_seq``), not from the hint that woke the reader, so a lost hint or a replay
after a reconnect sends the same thing.
"""

from __future__ import annotations

import json
import uuid
from typing import Any
from urllib.parse import urlencode

from django.template.loader import render_to_string

from controlplane import models

from . import snapshots
from .snapshots import nodes, snapshot

MAX_ROWS = 500
"""Changed task rows re-rendered in one message; past this a message re-renders the
counts and the shown groups only (collapsed groups are counts anyway)."""


def session_context(session_id: str, can_act: bool) -> dict[str, Any] | None:
    """Everything the session page shows, at one seq; None if there is no such session."""
    with snapshot():
        head = snapshots.head_seq(session_id)
        if head is None:
            return None
        return {
            "session": models.Session.objects.get(id=session_id),
            "seq": head,
            "can_act": can_act,
            "counts": snapshots.ordered(snapshots.status_counts(session_id)),
            "roots": snapshots.roots(session_id),
            "plans": snapshots.plans(session_id),
            "progress": snapshots.progress(session_id),
            "transcript": snapshots.transcript(session_id),
            "submissions": snapshots.submissions(session_id),
        }


def session_update(session_id: str, after: int, can_act: bool) -> tuple[int, str] | None:
    """``(seq, html)``: the session page's parts changed by the commits after ``after``,
    at the newest commit; None when there is none."""
    with snapshot():
        head = snapshots.head_seq(session_id)
        if head is None or head <= after:
            return None
        ctx: dict[str, Any] = {"seq": head, "can_act": can_act, "oob": True,
                               "nonce": uuid.uuid4().hex[:12]}
        parts = [render_to_string("ui/_counts.html", {
            **ctx, "counts": snapshots.ordered(snapshots.status_counts(session_id))})]
        tasks = models.Task.objects.filter(session_id=session_id)
        new_parents = set(
            tasks.filter(created_seq__gt=after).values_list("parent_id", flat=True).distinct()
        )
        if None in new_parents:  # a new root: the root list again
            parts.append(render_to_string("ui/_roots.html", {
                **ctx, "roots": snapshots.roots(session_id)}))
        else:
            regrouped = set()
            for parent in tasks.filter(id__in=new_parents):
                group = nodes(session_id, [parent])[0]
                if group.children is not None:
                    regrouped.add(parent.id)
                    parts.append(render_to_string("ui/_children.html", {**ctx, "node": group}))
            changed = list(tasks.filter(updated_seq__gt=after).order_by("created_seq", "id")
                           [: MAX_ROWS + 1])
            if len(changed) <= MAX_ROWS:
                parents = {t.parent_id for t in changed if t.parent_id} - {t.id for t in changed}
                rows = changed + list(tasks.filter(id__in=parents))
                rows = [r for r in rows if r.parent_id not in regrouped]
                for node in nodes(session_id, rows, depth=2):  # rows only: groups stay
                    parts.append(render_to_string("ui/_row.html", {**ctx, "node": node}))
        if models.Document.objects.filter(session_id=session_id, updated_seq__gt=after,
                                          kind=snapshots.PLAN).exists():
            parts.append(render_to_string("ui/_plans.html", {
                **ctx, "plans": snapshots.plans(session_id)}))
        if models.Document.objects.filter(session_id=session_id, updated_seq__gt=after,
                                          kind=snapshots.PROGRESS).exists():
            parts.append(render_to_string("ui/_progress.html", {
                **ctx, "progress": snapshots.progress(session_id)}))
        if models.Entry.objects.filter(session_id=session_id, seq__gt=after).exists():
            parts.append(render_to_string("ui/_transcript.html", {
                **ctx, "transcript": snapshots.transcript(session_id)}))
        if models.Submission.objects.filter(session_id=session_id,
                                            updated_seq__gt=after).exists():
            parts.append(render_to_string("ui/_submissions.html", {
                **ctx, "submissions": snapshots.submissions(session_id)}))
        parts.append(render_to_string("ui/_feed_state.html", ctx))
        return head, "".join(parts)


def previews(found: list[dict[str, Any]]) -> str:
    """The session page's uncommitted progress (``Preview``), latest per task and path:
    shown as a preview until the task's next commit, which holds the value."""
    shown = [
        {"task_id": p["task_id"], "path": ".".join(p["path"]),
         "text": p["value"] if isinstance(p["value"], str) else json.dumps(p["value"])}
        for p in found
    ]
    return render_to_string("ui/_previews.html", {"previews": shown, "oob": True})


def heartbeat(seq: int) -> str:
    """A quiet socket's heartbeat, as a partial: "caught up to seq N"."""
    return render_to_string("ui/_feed_state.html", {"seq": seq, "oob": True})


def global_heartbeat(seq: int) -> str:
    return render_to_string("ui/_feed_state.html", {"seq": seq, "oob": True, "cursor": "commit"})


# -- pages that span sessions: the overview and needs attention, by global commit id ------


def overview_context(query: str = "", status: str = "") -> dict[str, Any]:
    """Sessions (newest first, searched and filtered) with their live counts. An unknown
    status filters nothing (it comes from a URL)."""
    query = query.strip()[:200]
    status = status if status in snapshots.ORDER else ""
    with snapshot():
        sessions = models.Session.objects.order_by("-id")
        if query:
            sessions = sessions.filter(id__icontains=query) | sessions.filter(
                metadata__title__icontains=query)
        if status:
            having = models.Task.objects.filter(
                status="terminal", outcome__kind=status
            ) if status in ("succeeded", "failed", "cancelled", "faulted") else \
                models.Task.objects.filter(status=status)
            sessions = sessions.filter(id__in=having.values("session_id"))
        shown = list(sessions.order_by("-id")[:100])
        counts: dict[str, dict[str, int]] = {s.id: {} for s in shown}
        for session_id, state, count in snapshots._rows(
            f"SELECT session_id, {snapshots.SHOWN_STATUS}, count(*) FROM kernel_task "
            "WHERE session_id = ANY(%s) GROUP BY 1, 2", [list(counts)]
        ):
            counts[session_id][state] = count
        return {
            "seq": snapshots.last_commit_id(),
            "totals": snapshots.ordered(snapshots.status_counts()),
            "sessions": [{"session": s, "counts": snapshots.ordered(counts[s.id])}
                         for s in shown],
            "query": query,
            "status": status,
            "filter_query": urlencode({"q": query, "status": status}),
            "statuses": snapshots.ORDER,
        }


def attention_context(can_act: bool) -> dict[str, Any]:
    """Tasks an operator should look at: uncertain, blocked, failed (restart-limited
    among them)."""
    from controlplane.api.tasks import filtered

    with snapshot():
        uncertain = [snapshots.shown(t) for t in filtered(waiting_for_resolution=True)[:500]]
        blocked = [
            t for t in (snapshots.shown(r) for r in
                        models.Task.objects.exclude(status="terminal").order_by("id")[:2000])
            if t["blocked"]
        ]
        failed = [snapshots.shown(t) for t in (
            filtered(outcome="failed") | filtered(outcome="faulted"))[:500]]
        return {
            "failed_count": filtered(outcome="failed").count(),
            "seq": snapshots.last_commit_id(),
            "can_act": can_act,
            "uncertain": uncertain,
            "blocked": blocked,
            "failed": failed,
        }


def global_update(page: str, seq: int, can_act: bool, query: str = "", status: str = "") -> str:
    """A global page's live parts at least as new as commit id ``seq`` (the overview's
    searched and filtered as its page was)."""
    ctx: dict[str, Any] = {"oob": True, "can_act": can_act, "nonce": uuid.uuid4().hex[:12],
                           "cursor": "commit"}
    if page == "attention":
        ctx.update(attention_context(can_act))
        ctx["seq"] = max(seq, ctx["seq"])
        html = render_to_string("ui/_attention.html", ctx)
    else:
        ctx.update(overview_context(query, status))
        ctx["seq"] = max(seq, ctx["seq"])
        html = render_to_string("ui/_totals.html", ctx)
    return html + render_to_string("ui/_feed_state.html", ctx)
