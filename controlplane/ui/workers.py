"""The workers page: who holds which leases, and their last heartbeat (the API's read)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from controlplane.api.tasks import workers as lease_holders

from .access import viewer_required


@viewer_required
def workers(request: HttpRequest) -> HttpResponse:
    return render(request, "ui/workers.html", {"workers": lease_holders()})
