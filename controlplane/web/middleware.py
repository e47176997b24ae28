"""Request hygiene that must hold before any view runs (storable text, request rates), and
the answer when the database cannot serve one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

import psycopg
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse

from controlplane import access
from controlplane.storage import UNAVAILABLE
from controlplane.web import rates
from controlplane.web.client_address import client_bucket
from kernel import SessionPoisoned, StorageUnavailable


def unstorable_url(path: str, query_string: str) -> str | None:
    """Why a URL (its decoded path, its raw query string) holds text Postgres cannot store
    (NUL, or what is not valid Unicode), or None: what an HTTP request is refused for
    here, and a socket (:mod:`controlplane.sockets.feed`) as it opens."""
    raw = unquote(query_string, errors="surrogateescape") + path
    try:
        raw.encode("utf-8")
    except UnicodeEncodeError:
        return "the URL is not valid Unicode"
    if "\x00" in raw:
        return "the URL may not contain NUL characters"
    return None


class RejectUnstorableText:
    """Answer 422 to a path or query string carrying NUL characters or broken Unicode,
    and to a form (the dashboard's, the login page's) with a field carrying NUL.

    Postgres cannot hold either in text, so a filter or a record built from them would
    fail inside the database (a 500) instead of at the edge. (A form's bytes are decoded
    with replacement characters, so only NUL gets through in one; the API's JSON bodies
    are checked by their schemas.)
    """

    FORMS = ("application/x-www-form-urlencoded", "multipart/form-data")

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        problem = unstorable_url(request.path, request.META.get("QUERY_STRING", ""))
        if problem is not None:
            return JsonResponse({"detail": problem}, status=422)
        if request.method == "POST" and request.content_type in self.FORMS:
            for name, values in request.POST.lists():
                if "\x00" in name or any("\x00" in value for value in values):
                    shown = name.replace("\x00", "\\x00")[:100]
                    return JsonResponse(
                        {"detail": f"{shown}: a form field may not contain NUL characters"},
                        status=422)
        return self.get_response(request)


class LimitRequestRates:
    """Count each request against its client's address and, for a browser's login, its
    account (:mod:`controlplane.web.rates`; an API token's account is counted when the API
    authenticates it); over either rate, or with the account's server time spent,
    answer 429 with ``Retry-After`` before any view runs. A request then waits for its
    account's turn (:mod:`controlplane.web.turns`: 429 if it does not come). Once
    answered, a request charges the server time it took to its account, whichever way it
    authenticated, and gives its turn to the next in line. The
    probes are not counted: an orchestrator's checks must always get through."""

    EXEMPT = ("/healthz", "/readyz")

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path in self.EXEMPT:
            return self.get_response(request)
        user = getattr(request, "user", None)
        try:  # the request's first read (its session and user), before any view
            user_id = user.pk if user is not None and user.is_authenticated else None
        except STORAGE_DOWN as exc:  # AnswerStorageDown sees only what views raise
            return storage_down(request, exc)
        spent = rates.server_time(user_id) if user_id is not None else None
        refused = rates.take(
            rates.address(client_bucket(request.META)),
            rates.account(user_id) if user_id is not None else None,
            spent,
        )
        if refused is not None:
            return too_many_requests(request, refused.detail(), refused.retry_after)
        # An API token's account is admitted on it when the API authenticates the token.
        meter = request.server_time = rates.Meter()  # type: ignore[attr-defined]
        meter.admitted(spent)
        try:
            if user_id is not None and not meter.take_turn(user_id):
                return too_many_requests(request, rates.NO_TURN.detail(),
                                         rates.NO_TURN.retry_after)
            return self.get_response(request)
        finally:
            meter.end()


class NameTheCredential:
    """Let the commands name the credential each action came through (an API token, a
    browser session) in the operations log: :func:`controlplane.access.credential`."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        with access.serving(request):
            return self.get_response(request)


class ContentSecurityPolicy:
    """Every answer says what a page may load: scripts, styles, images and sockets from
    this origin only, no plugin, no framing, forms posted here only. The dashboard has
    no inline script or style (htmx is told to add none); Swagger UI at ``/api/docs``
    sets styles inline, so its page alone allows them. (Django has a CSP of its own
    from 6.0; this stands in for it on 5.2.)"""

    POLICY = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
              "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
              "form-action 'self'; frame-ancestors 'none'")
    DOCS_POLICY = POLICY.replace("style-src 'self'", "style-src 'self' 'unsafe-inline'")

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if "Content-Security-Policy" not in response:
            docs = request.path.startswith("/api/docs")
            response["Content-Security-Policy"] = self.DOCS_POLICY if docs else self.POLICY
        return response


def try_later(request: HttpRequest, status: int, detail: str, retry_after: int) -> HttpResponse:
    """An answer that asks the client to come back in ``retry_after`` seconds: JSON with
    its ``detail`` for the API, plain text for pages."""
    if request.path.startswith("/api/"):
        response: HttpResponse = JsonResponse({"detail": detail}, status=status)
    else:
        response = HttpResponse(detail, status=status, content_type="text/plain")
    response["Retry-After"] = str(retry_after)
    return response


def too_many_requests(request: HttpRequest, detail: str, retry_after: int) -> HttpResponse:
    return try_later(request, 429, detail, retry_after)


# What a restarting or unreachable Postgres raises: the kernel's own errors (from a
# command's commit) and the drivers' (from a read or a session lookup).
STORAGE_DOWN = (StorageUnavailable, SessionPoisoned, *UNAVAILABLE)
RETRY_AFTER_SECONDS = 2


class AnswerStorageDown:
    """Answer 503 with ``Retry-After`` while the database cannot be reached, not 500.

    A 500 says "the server is broken, do not retry"; a restarting database is a wait.
    Retrying is safe: every command carries its id (``request_id``, ``action_id``), so a
    commit whose outcome was unknown is not applied twice. Views raise; this turns the
    exception into the answer, after ninja has passed on what it does not handle. A
    middleware that reads the database before the view (:class:`LimitRequestRates`, for
    the session's user) answers with :func:`storage_down` itself: Django makes what a
    middleware raises a 500 on the spot, and this never sees it.
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
    if isinstance(exc.__cause__, psycopg.errors.QueryCanceled) or isinstance(
            exc, psycopg.errors.QueryCanceled):
        detail = (f"this took longer than WEB_STATEMENT_TIMEOUT_SECONDS "
                  f"({settings.WEB_STATEMENT_TIMEOUT_SECONDS:g} s) and was cancelled: "
                  "narrow the filter, or try again")
    return try_later(request, 503, detail, RETRY_AFTER_SECONDS)
