"""Who is calling and what their role allows: the rule every edge applies the same way.

Two roles, as Django groups: ``viewer`` reads, ``operator`` also acts (superusers act
too). An account without either is refused everything, reads included. Programs hold
API tokens, of which only a digest is stored. The API (:mod:`controlplane.api.auth`),
the pages (:mod:`controlplane.ui.access`) and the sockets (:mod:`controlplane.consumers`)
all ask this module.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

from django.contrib.auth.models import User
from django.utils import timezone

from controlplane.errors import Forbidden
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


def token_user(key: str) -> Any:
    """The active user this API token belongs to (its use noted), or None."""
    found = ApiToken.objects.select_related("user").filter(digest=digest(key)).first()
    if found is None or not found.user.is_active:
        return None
    ApiToken.objects.filter(pk=found.pk).update(last_used_at=timezone.now())
    return found.user


def role_of(user: Any) -> str | None:
    if user is None or not user.is_authenticated or not user.is_active:
        return None
    if user.is_superuser:
        return OPERATOR
    names = set(user.groups.values_list("name", flat=True))
    if OPERATOR in names:
        return OPERATOR
    return VIEWER if VIEWER in names else None


def may_read(user: Any) -> bool:
    return role_of(user) is not None


def may_act(user: Any) -> bool:
    return role_of(user) == OPERATOR


def require_role(user: Any) -> Any:
    """``user`` if it has a role at all; Forbidden otherwise."""
    if user is not None and role_of(user) is None:
        raise Forbidden("this account has no role: ask for viewer or operator")
    return user


def require_operator(user: Any) -> User:
    """``user`` if it may act; Forbidden otherwise (every command checks this first)."""
    if not may_act(user):
        raise Forbidden("operators only: viewers can read but not act")
    return user


def actor(user: User) -> str:
    """How a commit and the operations log name the person who acted."""
    return f"user:{user.get_username()}"
