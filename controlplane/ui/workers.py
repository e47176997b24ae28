"""The workers page: who holds which leases, and their last heartbeat.

Claims and heartbeats are not commits, so no feed announces them: the page asks again
every few seconds instead (an htmx poll of the table alone, ``?part=table``).
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from controlplane.reads.workers import lease_holders

from .access import viewer_required

REFRESH_SECONDS = 2


@viewer_required
def workers(request: HttpRequest) -> HttpResponse:
    template = "ui/_workers.html" if request.GET.get("part") == "table" else "ui/workers.html"
    return render(request, template, {"workers": lease_holders(), "every": REFRESH_SECONDS})
