"""The dashboard's live pages: what each shows, and the parts its socket re-renders.

A live page is one :class:`LivePage` subclass here plus its templates: the class names
the page (its socket is ``ws/ui/<name>/``), builds its context from the read layer,
and names the partials a live update re-renders (``parts``). The URL routes
(:mod:`controlplane.ui.urls`), the views and the page sockets
(:class:`controlplane.sockets.pages.GlobalPageConsumer`) all take pages from
:data:`GLOBAL_PAGES`, so a new page needs no edit anywhere else.

A socket reads through :meth:`LivePage.update` instead of sending commit frames: however
many commits came after its cursor, one message shows the state at the newest of them,
every element tagged ``data-seq`` (out-of-band htmx swaps). The session page, by its
session's seq, is :class:`SessionLivePage`; the pages over every session go by global
commit id.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, ClassVar
from urllib.parse import quote, urlencode

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.template.loader import get_template, render_to_string
from django.urls import reverse
from django.utils.safestring import SafeString

from controlplane.reads import charts, pages, tasks
from controlplane.reads.replica import prefer_replica
from controlplane.reads.snapshot import snapshot
from controlplane.ui.access import may_act, viewer_required
from controlplane.ui.charts import line_chart
from kernel.records import SHOWN_STATUSES


def _updating(can_act: bool, **more: Any) -> dict[str, Any]:
    """What every live update's partials get: they replace themselves out-of-band."""
    return {"oob": True, "can_act": can_act, "nonce": uuid.uuid4().hex[:12], **more}


class LivePage:
    """A page over every session, updated live by global commit id."""

    name: ClassVar[str]
    """Its URL name, and its socket's: ``ws/ui/<name>/``."""
    path: ClassVar[str]
    """Its URL path under the dashboard's root."""
    template: ClassVar[str]
    """The whole page."""
    parts: ClassVar[tuple[str, ...]]
    """The partials a live update re-renders (each tags itself with ``data-seq``)."""
    params: ClassVar[tuple[str, ...]] = ()
    """Query parameters the page (and its socket, so that updates keep to them) reads."""

    def context(self, can_act: bool, **params: str) -> dict[str, Any]:
        raise NotImplementedError

    def read(self, can_act: bool, params: dict[str, str], at_least: int = 0) -> dict[str, Any]:
        """The page's context in one snapshot: on the replica if there is one, unless it
        has not reached commit ``at_least`` (what the socket has shown)."""
        def read() -> dict[str, Any]:
            with snapshot():
                return self.context(can_act, **params)

        return prefer_replica(read, fresh_enough=lambda ctx: ctx["seq"] >= at_least)

    def page(self, can_act: bool, **params: str) -> dict[str, Any]:
        """The whole page's context, with the socket that keeps it live."""
        ctx = self.read(can_act, params)
        query = urlencode({k: ctx.get(k, "") for k in self.params})
        return {**ctx, "can_act": can_act, "socket": f"/ws/ui/{self.name}/?{query}"}

    def update(self, seq: int, can_act: bool, **params: str) -> str:
        """The live parts at least as new as commit id ``seq``."""
        ctx = _updating(can_act, cursor="commit", **self.read(can_act, params, at_least=seq))
        ctx["seq"] = max(seq, ctx["seq"])
        html = "".join(render_to_string(part, ctx) for part in self.parts)
        return html + render_to_string("ui/_feed_state.html", ctx)

    @staticmethod
    def heartbeat(seq: int) -> str:
        return render_to_string("ui/_feed_state.html", {"seq": seq, "oob": True,
                                                        "cursor": "commit"})


class Overview(LivePage):
    """Sessions (newest first, searched and filtered) with their tasks counted by status."""

    name = "overview"
    path = ""
    template = "ui/overview.html"
    parts = ("ui/_totals.html", "ui/_activity.html")
    params = ("q", "status")

    def context(self, can_act: bool, q: str = "", status: str = "", **_: str) -> dict[str, Any]:
        found = pages.overview(q, status)
        return {**vars(found), "q": found.query, "statuses": SHOWN_STATUSES,
                **activity_charts(charts.recent_activity())}


OVERVIEW_CHART = 420
"""The overview's charts' width in SVG units (three side by side on a wide screen)."""


def activity_charts(found: charts.Activity) -> dict[str, Any]:
    """The overview's pictures of the last hour, and how often they are fetched again."""
    at, width = found.start, found.bucket_seconds
    return {"activity": found, "every": width, "charts": [
        line_chart("chart-phases", "Phases per second", "phases/s", at, width,
                   [("phases", "series-phases", found.phases_per_second)], width=OVERVIEW_CHART),
        line_chart("chart-latency", "Runnable to next commit", "seconds", at, width,
                   [("p50", "series-p50", found.latency_p50),
                    ("p95", "series-p95", found.latency_p95)], width=OVERVIEW_CHART),
        line_chart("chart-failures", "Failures and attention", "tasks", at, width,
                   [("failed", "series-failures", found.failures),
                    ("attention", "series-attention", found.attention)],
                   width=OVERVIEW_CHART),
    ]}


@viewer_required
def activity(request: HttpRequest) -> HttpResponse:
    """The overview's pictures alone, fetched again every bucket: commits push them too,
    but a quiet hour still slides, and the last of a run of commits may have found
    them read (at most every :data:`charts.FRESH_SECONDS`) just before it was committed."""
    with snapshot():
        found = charts.recent_activity()
    return render(request, "ui/_activity.html", activity_charts(found))


class Attention(LivePage):
    """Tasks an operator should look at: uncertain, blocked, failed."""

    name = "attention"
    path = "attention/"
    template = "ui/attention.html"
    parts = ("ui/_attention.html",)

    def context(self, can_act: bool, **_: str) -> dict[str, Any]:
        return vars(pages.attention())


class Tasks(LivePage):
    """Tasks across sessions, found by kind, status, session, time and input text;
    sorted, paged, its filter in the URL. Operators act on the filter's result in bulk
    (a preview count, then a confirmation: :mod:`controlplane.ui.actions`)."""

    name = "tasks"
    path = "tasks/"
    template = "ui/tasks.html"
    parts = ("ui/_task_results.html",)
    params = pages.SEARCHED

    def context(self, can_act: bool, **params: str) -> dict[str, Any]:
        found = pages.tasks_page(pages.task_search(**params))
        search = found.search
        # Plain values: a template looks each up many times per row, and a dict is the
        # quickest thing for it to read (a page is many rows of them).
        task_url, session_url = (reverse(name, args=["~"]) for name in ("task", "session"))
        shown = [{
            "id": t.id, "kind": t.kind, "status": t.shown_status, "session_id": t.session_id,
            "phase": t.phase, "seq": t.updated_seq, **_when(t.changed_at),
            "input": _preview(t.input_start), "url": task_url.replace("~", t.id),
            "session_url": session_url.replace("~", quote(t.session_id, safe="")),
        } for t in found.rows]
        for row in shown:
            row["html"] = task_row(tuple(row.items()))
        return {
            **vars(found), **vars(search), "found": shown, "statuses": SHOWN_STATUSES,
            "min_word": pages.MIN_WORD,
            "filtered": search.filtered, "query": search.query(),
            "sorted_by": {key: _sort_link(search, key) for key in ("created", "kind", "status")},
            "previous": search.query(page=search.page - 1) if search.page > 1 else None,
            "next": search.query(page=search.page + 1) if search.page < found.pages else None,
        }


def _sort_link(search: pages.TaskSearch, key: str) -> dict[str, str]:
    """A column header's link (sorting by it, the other way if it is the sort already)
    and its ``aria-sort``."""
    flipped = f"-{key}" if search.sort == key else key
    if key == "created" and search.sort != "-created":
        flipped = "-created"
    state = ("ascending" if search.sort == key else
             "descending" if search.sort == f"-{key}" else "none")
    return {"query": search.query(sort=flipped, page=1), "aria": state}


TASK_ROWS_KEPT = 4096
"""Rendered rows of the tasks page a process keeps (a few MB)."""


@lru_cache(maxsize=TASK_ROWS_KEPT)
def task_row(row: tuple[tuple[str, Any], ...]) -> SafeString:
    """One row of the tasks page, made once for what it shows. Between two commits a
    page's rows are mostly the same, and the rows' markup is a large part of a render's
    work; keyed by everything the row shows, a kept row is never stale."""
    return SafeString(get_template("ui/_task_row.html").render({"row": dict(row)}))


def _when(at: datetime | None) -> dict[str, str]:
    """A time as the page shows it (UTC), formatted here: a template filter per row
    costs more than the rest of the row."""
    if at is None:
        return {}
    at = at.astimezone(UTC)
    return {"at": at.isoformat(), "at_text": at.strftime("%Y-%m-%d %H:%M:%S")}


def _preview(start: str) -> str:
    """A task's input as a row shows it: cut, with an ellipsis, past what it shows."""
    limit = tasks.INPUT_SHOWN
    return start if len(start) <= limit else start[: limit - 1] + "…"

GLOBAL_PAGES: dict[str, LivePage] = {
    page.name: page for page in (Overview(), Attention(), Tasks())
}


class SessionLivePage:
    """One session's page, updated live by the session's seq."""

    template = "ui/session.html"

    def page(self, session_id: str, can_act: bool) -> dict[str, Any]:
        found = pages.shown_session_page(session_id)
        if found is None:
            raise Http404("no such session")
        # Escaped: a program may name a session with what a URL must escape (``?``, ``#``).
        return {**vars(found), "can_act": can_act,
                "socket": f"/ws/ui/sessions/{quote(session_id, safe='')}/"}

    def update(self, session_id: str, after: int, can_act: bool) -> tuple[int, str] | None:
        """``(seq, html)``: the parts changed by the commits after ``after``, at the
        newest commit; None when there is none."""
        found = pages.live_session_changes(session_id, after)
        if found is None:
            return None
        ctx = _updating(can_act, seq=found.seq, session={"id": session_id})
        parts = [render_to_string("ui/_counts.html", {**ctx, "counts": found.counts})]
        if found.roots is not None:
            parts.append(render_to_string("ui/_roots.html", {**ctx, "roots": found.roots}))
        parts += [render_to_string("ui/_children.html", {**ctx, "node": group})
                  for group in found.groups]
        parts += [render_to_string("ui/_row.html", {**ctx, "node": node})
                  for node in found.rows]
        for name in ("plans", "progress", "transcript", "submissions", "graph"):
            if getattr(found, name) is not None:
                parts.append(render_to_string(f"ui/_{name}.html",
                                              {**ctx, name: getattr(found, name)}))
        parts.append(render_to_string("ui/_feed_state.html", ctx))
        return found.seq, "".join(parts)

    @staticmethod
    def heartbeat(seq: int) -> str:
        """A quiet socket's heartbeat, as a partial: "caught up to seq N"."""
        return render_to_string("ui/_feed_state.html", {"seq": seq, "oob": True})

    @staticmethod
    def previews(found: list[dict[str, Any]]) -> str:
        """Uncommitted progress (``Preview``), latest per task and path: shown as a
        preview until the task's next commit, which holds the value."""
        shown = [
            {"task_id": p["task_id"], "path": ".".join(p["path"]),
             "text": p["value"] if isinstance(p["value"], str) else json.dumps(p["value"])}
            for p in found
        ]
        return render_to_string("ui/_previews.html", {"previews": shown, "oob": True})


SESSION_PAGE = SessionLivePage()


def global_view(page: LivePage) -> Any:
    """The page's view: the whole page, live from its socket."""

    @viewer_required
    def view(request: HttpRequest) -> HttpResponse:
        params = {k: request.GET.get(k, "") for k in page.params}
        return render(request, page.template, page.page(may_act(request), **params))

    view.__name__ = page.name
    return view
