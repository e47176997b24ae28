"""Request hygiene that must hold before any view runs."""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import unquote

from django.http import HttpRequest, HttpResponse, JsonResponse


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
