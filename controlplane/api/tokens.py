"""The caller's own API tokens: list them, revoke one (docs/security.md, token life cycle).

Any role may see and revoke its own tokens (revoking a leaked key must never wait for
someone else); nobody sees another account's here (``manage.py api_token --list`` is
the shell's view over all). A key is shown once, when issued, and never again.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.http import HttpRequest
from ninja import Field, Path, Router, Schema

from controlplane import commands
from controlplane.api.auth import caller
from controlplane.reads import tokens as reads

router = Router(tags=["tokens"])


class TokenOut(Schema):
    id: int
    name: str
    created_at: datetime
    last_used_at: datetime | None
    expires_at: datetime | None
    revoked_at: datetime | None
    state: str
    issued_by: str = Field("", description="who issued it (`shell:NAME`; empty: not recorded)")
    revoked_by: str = Field("", description="who revoked it (`user:NAME` or `shell:NAME`)")


@router.get("/tokens", response=list[TokenOut])
def list_tokens(request: HttpRequest) -> Any:
    """Your tokens, newest first: active, expired and revoked."""
    return reads.tokens(user_id=caller(request).pk)


@router.post("/tokens/{token_id}/revoke", response=TokenOut)
def revoke_token(request: HttpRequest, token_id: int = Path(..., ge=1, le=2**63 - 1)) -> Any:
    """Revoke one of your tokens from now on (idempotent); sockets opened with it close
    within seconds. Another account's token answers 404."""
    return commands.revoke_token(caller(request), token_id)
