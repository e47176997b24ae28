"""API tokens: revoking one, or several from the shell."""

from __future__ import annotations

from collections.abc import Sequence

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from controlplane.access import actor, audit
from controlplane.models import ApiToken
from controlplane.reads.tokens import TokenView, token_view
from kernel import UnknownRecord


def revoke_token(user: User | None, token_id: int, by: str | None = None) -> TokenView:
    """Revoke a token from now on (kept, listed as revoked, with who revoked it;
    idempotent: the first revocation is the one kept). ``user`` may revoke only their
    own (another's is "no such token"); None is the shell's authority (``manage.py
    api_token --revoke``, naming itself in ``by``), over every token. Sockets opened with
    it close within ``WEBSOCKET_RECHECK_SECONDS``."""
    found = ApiToken.objects.filter(pk=token_id)
    if user is not None:
        found = found.filter(user=user)
    who = actor(user) if user is not None else (by or "shell")
    revoked = found.filter(revoked_at__isnull=True).update(
        revoked_at=timezone.now(), revoked_by=who)
    token = found.select_related("user").first()
    if token is None:
        raise UnknownRecord(f"no token {token_id} of yours" if user else f"no token {token_id}")
    if revoked:
        audit.info("API token %r (#%s) of %s revoked by %s", token.name, token.pk,
                   token.user.get_username(), who,
                   extra={"token": token.pk, "user": token.user.get_username(), "by": who})
    return token_view(token)


def revoke_tokens(token_ids: Sequence[int], by: str, *, username: str | None = None
                  ) -> list[TokenView]:
    """The shell's revocation of several tokens (``manage.py api_token [USER] --revoke``):
    all of them, or, when one of the ids names no token (of ``username``, when given),
    none (UnknownRecord names the first such), so that a mistyped id does not leave the
    others half done, nor revoke another user's token."""
    with transaction.atomic():
        found = ApiToken.objects.filter(pk__in=token_ids)
        if username is not None:
            found = found.filter(user__username=username)
        known = set(found.values_list("pk", flat=True))
        missing = [i for i in token_ids if i not in known]
        if missing:
            of = f" of {username}" if username is not None else ""
            raise UnknownRecord(f"no token {missing[0]}{of}")
        return [revoke_token(None, token_id, by=by) for token_id in token_ids]
