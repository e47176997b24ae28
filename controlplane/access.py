"""Who is calling and what their role allows: the rule every edge applies the same way.

Two roles, as Django groups: ``viewer`` reads, ``operator`` also acts (superusers act
too). An account without either is refused everything, reads included. Programs hold
API tokens, of which only a digest is stored; a token may expire and may be revoked
(docs/security.md), and an open socket re-checks its credential (:func:`recheck`). The
API (:mod:`controlplane.api.auth`), the pages (:mod:`controlplane.ui.access`) and the
sockets (:mod:`controlplane.sockets.feed`) all ask this module.
"""

from __future__ import annotations

import getpass
import hashlib
import logging
import os
import secrets
import unicodedata
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime, timedelta
from importlib import import_module
from typing import Any

from django.conf import settings
from django.contrib.auth import HASH_SESSION_KEY, SESSION_KEY
from django.contrib.auth.models import User
from django.db.models import Q
from django.utils import timezone
from django.utils.crypto import constant_time_compare

from controlplane.errors import Forbidden, Invalid
from controlplane.models import ApiToken, LoginFailure

OPERATOR = "operator"
VIEWER = "viewer"
audit = logging.getLogger("controlplane.audit")
"""Who did what to accounts and credentials (tokens issued and revoked, roles given)."""


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


_LINE_BREAKING = {"Cc", "Zl", "Zp"}
"""Unicode categories a token's name may not hold: control characters (a tab, a newline,
an escape) and line or paragraph separators."""


def token_name(name: str) -> str:
    """``name`` if a token may be called so, or Invalid saying why. Tokens are listed one
    a line, their fields between tabs (``manage.py api_token --list``): a blank name shows
    nothing there, and a control character or line separator breaks the line."""
    if not name.strip():
        raise Invalid("a token's name must not be blank: say what the token is for")
    found = next((c for c in name if unicodedata.category(c) in _LINE_BREAKING), None)
    if found is not None:
        raise Invalid(f"a token's name must not hold a control character or line "
                      f"separator: {name[:80]!r} holds {found!r}")
    return name


def listed_name(name: str) -> str:
    """``name`` as a listing of tokens prints it: on one line, without the characters
    :func:`token_name` refuses (a name stored before names were checked may hold them),
    each escaped as Python writes it (``\\t``, ``\\n``, ``\\x1b``, ``\\u2028``), and a
    backslash doubled so that an escape cannot be taken for a name's own text."""
    return "".join(
        "\\\\" if c == "\\" else
        repr(c)[1:-1] if unicodedata.category(c) in _LINE_BREAKING else c
        for c in name
    )


def issue_token(user: User, name: str, expires_at: datetime | None = None, *,
                issued_by: str = "") -> str:
    """Create a token for ``user`` (valid until ``expires_at``, or until revoked if None)
    and return its key; only the digest is kept, with who issued it (``issued_by``, as
    the audit names people: ``shell:root``). A name :func:`token_name` refuses is
    refused (Invalid) before anything is stored."""
    token_name(name)
    key = f"dcp_{secrets.token_urlsafe(32)}"
    token = ApiToken.objects.create(user=user, name=name, digest=digest(key),
                                    expires_at=expires_at, issued_by=issued_by)
    audit.info("API token %r (#%s) of %s issued by %s", name, token.pk, user.get_username(),
               issued_by or "(not recorded)",
               extra={"token": token.pk, "user": user.get_username(), "by": issued_by})
    return key


def shell_actor() -> str:
    """How the audit names whoever runs a management command: the machine's user."""
    try:
        return f"shell:{getpass.getuser()}"
    except (KeyError, OSError):  # no passwd entry for this uid (some containers)
        return f"shell:uid {os.getuid()}"


def usable_tokens() -> Any:
    """Tokens that authenticate now: neither revoked nor expired."""
    return ApiToken.objects.filter(revoked_at__isnull=True).filter(
        Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now())
    )


def usable_token(key: str) -> ApiToken | None:
    """The API token with this key (its use noted) if it authenticates now: neither
    revoked nor expired, and its user active."""
    found = usable_tokens().select_related("user").filter(digest=digest(key)).first()
    if found is None or not found.user.is_active:
        return None
    ApiToken.objects.filter(pk=found.pk).update(last_used_at=timezone.now())
    return found  # type: ignore[no-any-return]


def token_user(key: str) -> Any:
    """The active user this API token belongs to, or None (see :func:`usable_token`)."""
    found = usable_token(key)
    return None if found is None else found.user


def token_named(token: ApiToken) -> str:
    """How the audit names a token someone acted with: its name and id, never its key."""
    return f"API token {token.name!r} (#{token.pk})"


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
    :data:`NO_ROLE`. A few indexed reads: sockets call it every few seconds."""
    found = standing(credential)
    return found if found in (ENDED, NO_ROLE) else None


def standing(credential: Credential) -> str:
    """:data:`ENDED`, :data:`NO_ROLE`, or the role ``credential`` holds now
    (:data:`OPERATOR`, :data:`VIEWER`): a live page re-renders its forms by it."""
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
    return role_of(user) or NO_ROLE


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


BROWSER = "browser session"
_request: ContextVar[Any] = ContextVar("controlplane.access.request", default=None)


@contextmanager
def serving(request: Any) -> Iterator[None]:
    """While a request is served: :func:`credential` names what it authenticated with."""
    token = _request.set(request)
    try:
        yield
    finally:
        _request.reset(token)


def credential() -> str | None:
    """What the request being served authenticated with, as the audit names it: an API
    token (its name and id, set by the API's authentication) or the browser's login
    session; None outside a request (the shell, a worker)."""
    request = _request.get()
    if request is None:
        return None
    return str(getattr(request, "via", BROWSER))


# -- login throttling ----------------------------------------------------------------------


def login_name(username: str) -> str:
    """The account a login names, as the failure count keys it: NFKC-normalised, as
    Django's login form and ``createsuperuser`` normalise a username (so ``ｏｌｇａ``,
    ``𝐨𝐥𝐠𝐚`` and ``𝕠𝕝𝕘𝕒`` all log in as ``olga``), stripped, and in any case (one
    budget for ``olga`` and ``OLGA``, whichever of them exists)."""
    folded = unicodedata.normalize("NFKC", username).strip().casefold()
    return unicodedata.normalize("NFKC", folded)


def _login_keys(username: str, address: str | None) -> dict[str, int]:
    keys = {f"user:{login_name(username)[:150]}": settings.LOGIN_FAILURES_PER_ACCOUNT}
    if address:
        keys[f"addr:{address[:64]}"] = settings.LOGIN_FAILURES_PER_ADDRESS
    return keys


def login_wait(username: str, address: str | None) -> float:
    """Seconds before a login for ``username`` from ``address`` (a
    :func:`controlplane.web.client_address.bucket`) may be tried again: 0 if now, else until
    the oldest counted failure of the account or the address (whichever is over its
    limit) leaves the ``LOGIN_THROTTLE_SECONDS`` window."""
    now = timezone.now()
    window = timedelta(seconds=settings.LOGIN_THROTTLE_SECONDS)
    wait = 0.0
    for key, limit in _login_keys(username, address).items():
        recent = LoginFailure.objects.filter(key=key, at__gt=now - window).order_by("-at")
        times = list(recent.values_list("at", flat=True)[:limit])
        if len(times) >= limit:
            wait = max(wait, (times[-1] + window - now).total_seconds())
    return wait


def login_failed(username: str, address: str | None) -> None:
    """Count a failed login against the account and the address, and forget every
    failure that left the window (so the table holds one window's failures, at most
    ``LOGIN_FAILURES_PER_ADDRESS`` per address)."""
    now = timezone.now()
    keys = _login_keys(username, address)
    LoginFailure.objects.bulk_create([LoginFailure(key=key, at=now) for key in keys])
    window = timedelta(seconds=settings.LOGIN_THROTTLE_SECONDS)
    LoginFailure.objects.filter(at__lte=now - window).delete()


def login_succeeded(username: str) -> None:
    """The account's failures are forgiven (its address's are not)."""
    LoginFailure.objects.filter(key__in=list(_login_keys(username, None))).delete()
