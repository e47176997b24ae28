"""Views of one session: its live page, and a page of a task's children (the tree at
scale). The overview of every session is a live page of :mod:`.live`."""

from __future__ import annotations

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from controlplane.reads import artifacts, charts, pages
from controlplane.reads.snapshot import snapshot
from controlplane.ui.access import may_act, viewer_required
from controlplane.ui.charts import line_chart
from controlplane.ui.live import SESSION_PAGE
from kernel.artifacts import CorruptArtifact
from kernel.errors import UnknownRecord


@viewer_required
def session(request: HttpRequest, session_id: str) -> HttpResponse:
    return render(request, SESSION_PAGE.template, SESSION_PAGE.page(session_id, may_act(request)))


@viewer_required
def artifact(request: HttpRequest, session_id: str, digest: str) -> HttpResponse:
    """Download an artifact an entry of the session references, its hash checked: for
    whoever may read the session. A corrupt one is refused (500, saying so)."""
    try:
        found = artifacts.artifact(session_id, digest)
    except UnknownRecord as exc:
        raise Http404(str(exc)) from exc
    except CorruptArtifact as exc:
        return HttpResponse(f"refused: {exc}", status=500, content_type="text/plain")
    answer = HttpResponse(found.data, content_type=found.media_type)
    name = found.digest.replace(":", "-") + (".json" if "json" in found.media_type else "")
    answer["Content-Disposition"] = f'attachment; filename="{name}"'
    answer["X-Content-Type-Options"] = "nosniff"
    return answer


@viewer_required
def children(request: HttpRequest, session_id: str, task_id: str) -> HttpResponse:
    """One page of a task's children (an htmx GET from a collapsed group)."""
    page = pages.page_number(request.GET.get("page", "1"))
    with snapshot():
        seq = pages.head_seq(session_id)
        if seq is None:
            raise Http404("no such session")
        found, next_page = pages.children_page(session_id, task_id, page)
    return render(request, "ui/_page.html", {
        "seq": seq, "nodes": found, "next_page": next_page, "page": page,
        "session_id": session_id, "parent_id": task_id, "can_act": may_act(request),
    })


@viewer_required
def earlier_entries(request: HttpRequest, session_id: str, conversation_id: str) -> HttpResponse:
    """A page of a conversation's entries before the one named by ``before`` (an htmx GET
    from the transcript's "earlier entries" button), and after the one named by
    ``after`` if given (what a live update's latest page skipped: ``static/ui.js``).
    Entries do not change once written, so a page stays as it was loaded while live
    updates re-render the latest one."""
    with snapshot():
        if pages.head_seq(session_id) is None:
            raise Http404("no such session")
        try:
            found = pages.earlier_entries(session_id, conversation_id,
                                          request.GET.get("before", ""),
                                          request.GET.get("after") or None)
        except UnknownRecord as exc:
            raise Http404(str(exc)) from exc
    return render(request, "ui/_earlier.html", {
        "earlier": found, "session": {"id": session_id}, "conversation_id": conversation_id,
    })


HISTORY_REFRESH_SECONDS = 5


@viewer_required
def history(request: HttpRequest, session_id: str) -> HttpResponse:
    """The session's tasks by status over time, as an SVG chart (loaded after the page,
    and again every few seconds: the page itself stays as quick as it was)."""
    with snapshot():
        if pages.head_seq(session_id) is None:
            raise Http404("no such session")
        found = charts.session_history(session_id)
    chart = None
    if found is not None:
        chart = line_chart(
            "chart-session", "Tasks by status", "tasks", found.start, found.bucket_seconds,
            [(status, f"status-{status}", counts) for status, counts in found.counts.items()],
        )
    return render(request, "ui/_session_history.html", {
        "chart": chart, "session_id": session_id, "every": HISTORY_REFRESH_SECONDS})
