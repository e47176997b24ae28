"""One task's page: its phases on a time axis (every commit, the waits, the leases, the
operators' actions), and its input, checkpoint and result or error."""

from __future__ import annotations

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from controlplane.reads import artifacts as artifact_reads
from controlplane.reads import pages
from controlplane.reads import restarts as restart_reads
from controlplane.reads import tasks as task_reads
from controlplane.reads.snapshot import snapshot
from controlplane.reads.transcript import pretty
from controlplane.ui.access import may_act, viewer_required
from kernel import UnknownRecord


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
            "as_json": {name: pretty(getattr(shown, name))
                        for name in ("input", "checkpoint", "outcome")},
            "timeline": pages.timeline(task_id, shown.session_id, shown.terminal),
            "pruned_upto": pages.pruned_before(shown.session_id, shown.task.created_seq),
            "seq": pages.head_seq(shown.session_id),
            "can_act": may_act(request),
            "restart_refused": restart_reads.kind_refuses(shown.task),
            "artifacts": artifact_reads.named(shown.session_id, shown.outcome),
        })
