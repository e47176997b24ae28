"""Request hygiene that must hold before any view runs, and the answer when the
database cannot serve one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

from django.http import HttpRequest, HttpResponse, JsonResponse

from controlplane.storage.postgres import UNAVAILABLE
from kernel import SessionPoisoned, StorageUnavailable


class RejectUnstorableText:
    """Answer 422 to a path or query string carrying NUL characters or broken Unicode.

    Postgres cannot hold either in text, so a filter built from them would fail
    inside the database (a 500) instead of at the edge.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        query = unquote(request.META.get("QUERY_STRING", ""), errors="surrogateescape")
        raw = query + request.path
        try:
            raw.encode("utf-8")
        except UnicodeEncodeError:
            return JsonResponse({"detail": "the URL is not valid Unicode"}, status=422)
        if "\x00" in raw:
            return JsonResponse({"detail": "the URL may not contain NUL characters"}, status=422)
        return self.get_response(request)


# What a restarting or unreachable Postgres raises: the kernel's own errors (from a
# command's commit) and the drivers' (from a read or a session lookup).
STORAGE_DOWN = (StorageUnavailable, SessionPoisoned, *UNAVAILABLE)
RETRY_AFTER_SECONDS = 2


class AnswerStorageDown:
    """Answer 503 with ``Retry-After`` while the database cannot be reached, not 500.

    A 500 says "the server is broken, do not retry"; a restarting database is a wait.
    Retrying is safe: every command carries its id (``request_id``, ``action_id``), so a
    commit whose outcome was unknown is not applied twice. Views raise; this turns the
    exception into the answer, after ninja has passed on what it does not handle.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exc: Exception) -> HttpResponse | None:
        return storage_down(request, exc) if isinstance(exc, STORAGE_DOWN) else None


def storage_down(request: HttpRequest, exc: Any) -> HttpResponse:
    """The 503 answer; the API registers it too, since with ``DEBUG`` on ninja answers
    unhandled errors itself instead of passing them on to the middleware."""
    detail = "the database is unavailable; try again (a retry with the same id is safe)"
    if request.path.startswith("/api/"):
        response: HttpResponse = JsonResponse({"detail": detail}, status=503)
    else:
        response = HttpResponse(detail, status=503, content_type="text/plain")
    response["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return response
