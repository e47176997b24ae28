"""API tokens as their owners (and the shell) see them: never the key, which is shown once."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.utils import timezone

from controlplane.models import ApiToken


@dataclass(frozen=True)
class TokenView:
    id: int
    user: str
    name: str
    created_at: datetime
    last_used_at: datetime | None
    expires_at: datetime | None
    revoked_at: datetime | None
    state: str  # "active", "expired" or "revoked"
    issued_by: str = ""
    revoked_by: str = ""


def token_view(token: ApiToken) -> TokenView:
    if token.revoked_at is not None:
        state = "revoked"
    elif token.expires_at is not None and token.expires_at <= timezone.now():
        state = "expired"
    else:
        state = "active"
    return TokenView(
        id=token.pk, user=token.user.get_username(), name=token.name,
        created_at=token.created_at, last_used_at=token.last_used_at,
        expires_at=token.expires_at, revoked_at=token.revoked_at, state=state,
        issued_by=token.issued_by, revoked_by=token.revoked_by,
    )


def tokens(user_id: int | None = None, username: str | None = None) -> list[TokenView]:
    """Tokens, newest first: one account's (by id or name), or everyone's."""
    found = ApiToken.objects.select_related("user").order_by("-created_at", "-id")
    if user_id is not None:
        found = found.filter(user_id=user_id)
    if username is not None:
        found = found.filter(user__username=username)
    return [token_view(token) for token in found]
