"""How API callers authenticate: the Django session (browsers) or a bearer token (programs).

Browsers authenticate with the Django session (CSRF enforced on unsafe methods by
ninja's SessionAuth); programs send ``Authorization: Bearer <token>``. Either way the
caller needs a role (:mod:`controlplane.access`); each command checks whether it may act.
Reading never starts scheduling: read endpoints only read.
"""

from __future__ import annotations

from functools import wraps
from typing import Any

from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.http import HttpRequest, HttpResponseForbidden
from ninja.openapi.views import openapi_json
from ninja.security import HttpBearer, SessionAuth

from controlplane.access import BROWSER, may_read, require_role, token_named, usable_token
from controlplane.errors import TooBusy
from controlplane.web import rates


class TokenAuth(HttpBearer):
    def authenticate(self, request: HttpRequest, token: str) -> Any:
        found = usable_token(token)
        if found is None:
            return None
        refused = rates.admit_token(request, found.user.pk)
        if refused is not None:
            raise TooBusy(refused.detail(), refused.retry_after)
        request.user = found.user
        request.via = token_named(found)  # type: ignore[attr-defined]
        return require_role(found.user)


class RoleSessionAuth(SessionAuth):
    def authenticate(self, request: HttpRequest, key: str | None) -> Any:
        return require_role(super().authenticate(request, key))


def caller(request: HttpRequest) -> User:
    """The authenticated caller (commands check what its role allows)."""
    return request.auth  # type: ignore[attr-defined,no-any-return]


def via(request: HttpRequest) -> str:
    """What the caller authenticated with, for the audit: a named API token, or the
    browser's login session."""
    return getattr(request, "via", BROWSER)


AUTH = [TokenAuth(), RoleSessionAuth()]


def docs_for_readers(view: Any) -> Any:
    """``/api/docs``: for logged-in accounts with a role (anonymous: to the login page).
    ninja passes ``/api/openapi.json`` through here too: the schema stays public (it
    holds no data; API clients and the schema tests read it without a login)."""
    if getattr(view, "func", None) is openapi_json:
        return view

    @wraps(view)
    def checked(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        if not may_read(request.user):
            return HttpResponseForbidden("this account has no role: ask for viewer or operator")
        return view(request, *args, **kwargs)

    return login_required(checked)
