"""Who is calling and what their role allows: the rule every edge applies the same way.

Two roles, as Django groups: ``viewer`` reads, ``operator`` also acts (superusers act
too). An account without either is refused everything, reads included. Programs hold
API tokens, of which only a digest is stored; a token may expire and may be revoked
(docs/security.md), and an open socket re-checks its credential (:func:`recheck`). The
API (:mod:`controlplane.api.auth`), the pages (:mod:`controlplane.ui.access`) and the
sockets (:mod:`controlplane.consumers`) all ask this module.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime
from importlib import import_module
from typing import Any

from django.conf import settings
from django.contrib.auth import HASH_SESSION_KEY, SESSION_KEY
from django.contrib.auth.models import User
from django.db.models import Q
from django.utils import timezone
from django.utils.crypto import constant_time_compare

from controlplane.errors import Forbidden
from controlplane.models import ApiToken

OPERATOR = "operator"
VIEWER = "viewer"


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def issue_token(user: User, name: str, expires_at: datetime | None = None) -> str:
    """Create a token for ``user`` (valid until ``expires_at``, or until revoked if None)
    and return its key; only the digest is kept."""
    key = f"dcp_{secrets.token_urlsafe(32)}"
    ApiToken.objects.create(user=user, name=name, digest=digest(key), expires_at=expires_at)
    return key


def usable_tokens() -> Any:
    """Tokens that authenticate now: neither revoked nor expired."""
    return ApiToken.objects.filter(revoked_at__isnull=True).filter(
        Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now())
    )


def token_user(key: str) -> Any:
    """The active user this API token belongs to (its use noted), or None if the token is
    unknown, revoked or expired."""
    found = usable_tokens().select_related("user").filter(digest=digest(key)).first()
    if found is None or not found.user.is_active:
        return None
    ApiToken.objects.filter(pk=found.pk).update(last_used_at=timezone.now())
    return found.user


@dataclass(frozen=True)
class Credential:
    """What an open socket authenticated with, to check again while it stays open: an API
    token (its digest) or a browser's login session (its key)."""

    user_id: int
    token_digest: str | None = None
    session_key: str | None = None


ENDED = "ended"
""":func:`recheck`: the token was revoked or expired, or the login session ended (logout,
expiry, password change)."""
NO_ROLE = "no-role"
""":func:`recheck`: the account lost its role (or was deactivated)."""


def recheck(credential: Credential) -> str | None:
    """Whether ``credential`` still stands: None if so, else :data:`ENDED` or
    :data:`NO_ROLE`. One or two indexed reads: sockets call it every few seconds."""
    user = User.objects.filter(pk=credential.user_id).first()
    if credential.token_digest is not None:
        if not usable_tokens().filter(digest=credential.token_digest).exists():
            return ENDED
    elif credential.session_key is not None:
        data = import_module(settings.SESSION_ENGINE).SessionStore(credential.session_key).load()
        if (
            user is None
            or data.get(SESSION_KEY) != str(user.pk)
            or not constant_time_compare(
                data.get(HASH_SESSION_KEY, ""), user.get_session_auth_hash()
            )
        ):
            return ENDED
    return None if may_read(user) else NO_ROLE


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
