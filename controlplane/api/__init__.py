"""The control plane's HTTP API (django-ninja), one router per resource.

OpenAPI at ``/api/openapi.json``, docs at ``/api/docs``. Every endpoint needs an
authenticated viewer or operator; actions need an operator (see :mod:`.auth`).
Kernel refusals become 409 (the state does not allow it) or 404 (no such record);
bad input is 422 naming the field, and changes nothing.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from ninja import NinjaAPI

from kernel import CommitRejected, UnknownRecord

from . import actions, sessions, tasks
from .auth import AUTH

api = NinjaAPI(
    title="Durable control plane",
    version="1",
    description="Observe and steer durable agent tasks: sessions, tasks, documents, "
    "submissions, the change feed, and operator actions.",
    auth=AUTH,
    urls_namespace="api",
)
api.add_router("/", sessions.router)
api.add_router("/", tasks.router)
api.add_router("/", actions.router)


@api.exception_handler(UnknownRecord)
def unknown_record(request: HttpRequest, exc: UnknownRecord) -> HttpResponse:
    return api.create_response(request, {"detail": str(exc)}, status=404)


@api.exception_handler(CommitRejected)
def commit_rejected(request: HttpRequest, exc: CommitRejected) -> HttpResponse:
    return api.create_response(request, {"detail": str(exc)}, status=409)
