"""Who may see the dashboard and who may act in it: the roles of :mod:`controlplane.access`."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseForbidden

from controlplane import access

View = Callable[..., HttpResponse]


def viewer_required(view: View) -> View:
    """Logged in (else to the login page) with a role (else 403): the API's rule for reads."""

    @wraps(view)
    def checked(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not access.may_read(request.user):
            return HttpResponseForbidden("this account has no role: ask for viewer or operator")
        return view(request, *args, **kwargs)

    return login_required(checked)


def may_act(request: HttpRequest) -> bool:
    """Whether the page shows action buttons; the action views check again on POST."""
    return access.may_act(request.user)


def role(request: HttpRequest) -> dict[str, Any]:
    """Context processor: whether to show actions, and a fresh prefix for the action ids
    of the forms on this page (a double submit of one form repeats its action id)."""
    return {"can_act": may_act(request), "nonce": uuid.uuid4().hex[:12]}
