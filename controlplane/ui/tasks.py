"""One task's page: its input, checkpoint, result or error, and the commits that moved it."""

from __future__ import annotations

import json

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from controlplane.reads import pages
from controlplane.reads import tasks as task_reads
from controlplane.reads.snapshot import snapshot
from kernel import UnknownRecord

from .access import may_act, viewer_required


@viewer_required
def task(request: HttpRequest, task_id: str) -> HttpResponse:
    with snapshot():
        try:
            shown = task_reads.get(task_id)
        except UnknownRecord as exc:
            raise Http404("no such task") from exc
        return render(request, "ui/task.html", {
            "task": shown,
            # As JSON text, escaped by the template like any other text.
            "as_json": {name: json.dumps(getattr(shown, name), indent=2, ensure_ascii=False,
                                         default=str)
                        for name in ("input", "checkpoint", "outcome")},
            "timeline": pages.timeline(task_id, shown.session_id),
            "seq": pages.head_seq(shown.session_id),
            "can_act": may_act(request),
        })
