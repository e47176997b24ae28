"""Views of sessions: the overview (live counts, search, filters), one session's page, and
a page of a task's children (the tree at scale)."""

from __future__ import annotations

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from . import fragments, snapshots
from .access import may_act, viewer_required


@viewer_required
def overview(request: HttpRequest) -> HttpResponse:
    context = fragments.overview_context(request.GET.get("q", ""), request.GET.get("status", ""))
    return render(request, "ui/overview.html", context)


@viewer_required
def session(request: HttpRequest, session_id: str) -> HttpResponse:
    context = fragments.session_context(session_id, may_act(request))
    if context is None:
        raise Http404("no such session")
    return render(request, "ui/session.html", context)


@viewer_required
def children(request: HttpRequest, session_id: str, task_id: str) -> HttpResponse:
    """One page of a task's children (an htmx GET from a collapsed group)."""
    try:
        page = max(1, int(request.GET.get("page", "1")))
    except ValueError:
        page = 1
    with snapshots.snapshot():
        seq = snapshots.head_seq(session_id)
        if seq is None:
            raise Http404("no such session")
        found, next_page = snapshots.children_page(session_id, task_id, page)
    return render(request, "ui/_page.html", {
        "seq": seq, "nodes": found, "next_page": next_page, "page": page,
        "session_id": session_id, "parent_id": task_id, "can_act": may_act(request),
    })
