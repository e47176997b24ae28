"""Who is calling, and may they act.

Browsers authenticate with the Django session (CSRF enforced on unsafe methods by
ninja's SessionAuth); programs send ``Authorization: Bearer <token>``. Two roles,
as Django groups: ``viewer`` reads, ``operator`` also acts. Superusers act too.
Reading never starts scheduling: read endpoints only read.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

from django.contrib.auth.models import User
from django.http import HttpRequest
from django.utils import timezone
from ninja.errors import HttpError
from ninja.security import HttpBearer, SessionAuth

from controlplane.models import ApiToken

OPERATOR = "operator"
VIEWER = "viewer"


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def issue_token(user: User, name: str) -> str:
    """Create a token for ``user`` and return its key; only the digest is kept."""
    key = f"dcp_{secrets.token_urlsafe(32)}"
    ApiToken.objects.create(user=user, name=name, digest=digest(key))
    return key


def with_role(user: Any) -> Any:
    """Authenticated but without a role is refused outright (403), reads included."""
    if user is not None and role_of(user) is None:
        raise HttpError(403, "this account has no role: ask for viewer or operator")
    return user


class TokenAuth(HttpBearer):
    def authenticate(self, request: HttpRequest, token: str) -> Any:
        found = ApiToken.objects.select_related("user").filter(digest=digest(token)).first()
        if found is None or not found.user.is_active:
            return None
        ApiToken.objects.filter(pk=found.pk).update(last_used_at=timezone.now())
        request.user = found.user
        return with_role(found.user)


class RoleSessionAuth(SessionAuth):
    def authenticate(self, request: HttpRequest, key: str | None) -> Any:
        return with_role(super().authenticate(request, key))


def role_of(user: Any) -> str | None:
    if user is None or not user.is_authenticated or not user.is_active:
        return None
    if user.is_superuser:
        return OPERATOR
    names = set(user.groups.values_list("name", flat=True))
    if OPERATOR in names:
        return OPERATOR
    return VIEWER if VIEWER in names else None


def operator(request: HttpRequest) -> User:
    """The caller, if it may act (403 for viewers)."""
    return require_operator(request.auth)  # type: ignore[attr-defined]


def require_operator(user: Any) -> User:
    """``user`` if it may act; 403 otherwise. Shared by the API and the browser pages, so
    that both refuse a viewer in the same way."""
    if role_of(user) != OPERATOR:
        raise HttpError(403, "operators only: viewers can read but not act")
    return user


def actor(user: User) -> str:
    return f"user:{user.get_username()}"


AUTH = [TokenAuth(), RoleSessionAuth()]
