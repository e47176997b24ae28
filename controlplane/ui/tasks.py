"""One task's page: its input, checkpoint, result or error, and the commits that moved it."""

from __future__ import annotations

import json

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from controlplane import models

from . import snapshots
from .access import may_act, viewer_required


@viewer_required
def task(request: HttpRequest, task_id: str) -> HttpResponse:
    with snapshots.snapshot():
        row = models.Task.objects.filter(id=task_id).first()
        if row is None:
            raise Http404("no such task")
        shown = snapshots.shown(row)
        return render(request, "ui/task.html", {
            "task": shown,
            # As JSON text, escaped by the template like any other text.
            "as_json": {name: json.dumps(shown[name], indent=2, ensure_ascii=False, default=str)
                        for name in ("input", "checkpoint", "outcome")},
            "timeline": snapshots.timeline(task_id, row.session_id),
            "seq": snapshots.head_seq(row.session_id),
            "can_act": may_act(request),
        })
