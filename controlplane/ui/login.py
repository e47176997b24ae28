"""The dashboard's and the admin's login forms, throttled by account and by address.

Too many failed logins (``LOGIN_FAILURES_PER_ACCOUNT`` for one account,
``LOGIN_FAILURES_PER_ADDRESS`` from one address, within ``LOGIN_THROTTLE_SECONDS``)
and the form refuses every login for them, the right password included, saying how long
to wait; the counting is :mod:`controlplane.access`'s (a table, so every web process
sees the same counts). The account is the username as Django authenticates it
(:func:`controlplane.access.login_name`), the address the client's as a trusted proxy
tells it (:mod:`controlplane.web.client_address`).
"""

from __future__ import annotations

import math
from typing import Any

from django import forms
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm

from controlplane import access
from controlplane.web.client_address import client_bucket


def _later(seconds: float) -> str:
    if seconds < 120:
        return f"{math.ceil(seconds)} seconds"
    return f"{math.ceil(seconds / 60)} minutes"


class Throttled:
    """For a Django authentication form: check the throttle before the password, count a
    wrong one after it."""

    data: Any
    request: Any

    def clean(self) -> dict[str, Any]:
        username = str(self.data.get("username") or "")
        address = client_bucket(self.request.META) if self.request is not None else None
        wait = access.login_wait(username, address)
        if wait > 0:
            raise forms.ValidationError(
                "Too many failed logins for this account or from this address: try again "
                f"in {_later(wait)}.",
                code="throttled",
            )
        try:
            cleaned: dict[str, Any] = super().clean()  # type: ignore[misc]
        except forms.ValidationError as refused:
            if getattr(refused, "code", None) == "invalid_login":
                access.login_failed(username, address)
            raise
        access.login_succeeded(username)
        return cleaned


class DashboardLogin(Throttled, AuthenticationForm):
    pass


class AdminLogin(Throttled, AdminAuthenticationForm):
    pass
