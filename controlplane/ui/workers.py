"""The workers page: every worker process the registry knows (live, dead or stopped) with
the leases it holds, and each queue's depth.

Heartbeats and claims are not commits, so no feed announces them: the page asks again
every few seconds instead (an htmx poll of the tables alone, ``?part=table``).
"""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from controlplane.reads import workers as reads
from controlplane.ui.access import viewer_required

REFRESH_SECONDS = 2


@viewer_required
def workers(request: HttpRequest) -> HttpResponse:
    template = "ui/_workers.html" if request.GET.get("part") == "table" else "ui/workers.html"
    found = reads.everyone()
    known = [w for w in found if isinstance(w, reads.WorkerState)]
    consumed = sorted({q for w in known if w.state == "live" for q in w.queues})
    return render(request, template, {
        "workers": known, "queues": reads.queues(consumed=consumed),
        "unregistered": [h for h in found if isinstance(h, reads.LeaseHolder)],
        "every": REFRESH_SECONDS, "dead_after": settings.WORKER_DEAD_SECONDS,
    })
