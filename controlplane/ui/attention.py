"""Needs attention (uncertain operations, blocked and failed tasks) and the operator
actions behind its buttons.

The actions are the API's own functions (:mod:`controlplane.api.actions`): the same
checks, the same commit, the same entry in the operations log with who and why. A form
carries its ``action_id`` (made when the page was rendered), so a double submit or a
retried request does nothing new.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST
from ninja.errors import HttpError

from controlplane.api.actions import (
    bulk_act,
    cancel_task,
    resolve_task,
    resubmit_submission,
    retry_task,
)
from controlplane.api.auth import require_operator
from controlplane.api.schemas import BulkIn
from kernel import CommitRejected, UnknownRecord

from . import fragments
from .access import may_act, viewer_required

MAX_REASON = 2000


@viewer_required
def attention(request: HttpRequest) -> HttpResponse:
    return render(request, "ui/attention.html", fragments.attention_context(may_act(request)))


def _resolve(user: Any, task_id: str, action_id: str, reason: str, form: Any) -> dict[str, Any]:
    return resolve_task(user, task_id, action_id, reason, form.get("decision", ""))


ACTIONS: dict[str, Callable[..., dict[str, Any]]] = {
    "cancel": lambda user, task_id, action_id, reason, form: cancel_task(
        user, task_id, action_id, reason),
    "retry": lambda user, task_id, action_id, reason, form: retry_task(
        user, task_id, action_id, reason),
    "resolve": _resolve,
    "resubmit": lambda user, submission_id, action_id, reason, form: resubmit_submission(
        user, submission_id, action_id, reason),
}


@require_POST
@login_required
def act(request: HttpRequest, target: str, action: str) -> HttpResponse:
    """POST an action on a task (or, for ``resubmit``, a submission): operators only (403
    for anyone else, nothing changed)."""
    try:
        require_operator(request.user)
        reason, action_id = _reason_and_id(request)
        result = ACTIONS[action](request.user, target, action_id, reason, request.POST)
    except HttpError as exc:
        return _answer(request, exc.status_code, str(exc))
    except UnknownRecord as exc:
        return _answer(request, 404, str(exc))
    except CommitRejected as exc:
        return _answer(request, 409, str(exc))
    done = "already done" if result["replayed"] else "done"
    note = f"{result['action']} {done}: commit seq {result['seq']}."
    if result["may_repeat"]:
        note += " May repeat: " + "; ".join(result["may_repeat"])
    return _answer(request, 200, note)


@require_POST
@login_required
def retry_failed(request: HttpRequest) -> HttpResponse:
    """Retry every failed task at once: the form carries the count the page showed, and a
    different count now is refused (409), so the operator confirms what they saw."""
    try:
        require_operator(request.user)
        reason, action_id = _reason_and_id(request)
        expected = request.POST.get("expected_count", "")
        if not expected.isdigit():
            raise HttpError(422, "expected_count: the count the page showed")
        body = BulkIn(action="retry", status="terminal", outcome="failed", reason=reason,
                      action_id=action_id, expected_count=int(expected))
        result = bulk_act(request.user, body)
    except HttpError as exc:
        return _answer(request, exc.status_code, str(exc))
    done = [r for r in result["results"] if r["ok"]]
    failed = [f"{r['task_id']}: {r['detail']}" for r in result["results"] if not r["ok"]]
    note = f"retry: {len(done)} of {result['count']} done."
    if failed:
        note += " Not done: " + "; ".join(failed)
    return _answer(request, 200, note)


def _reason_and_id(request: HttpRequest) -> tuple[str, str]:
    """An action form's reason (required, as the API wants it) and its action id."""
    reason = request.POST.get("reason", "").strip()
    if not reason or len(reason) > MAX_REASON or "\x00" in reason:
        raise HttpError(422, f"give a reason (at most {MAX_REASON} characters)")
    return reason, request.POST.get("action_id", "").strip()[:200] or uuid.uuid4().hex


def _answer(request: HttpRequest, status: int, message: str) -> HttpResponse:
    """htmx gets a status fragment (shown in place, errors too); a plain form post gets
    redirected back with the message (or the error page for a refusal)."""
    if request.headers.get("HX-Request"):
        return render(request, "ui/_action_result.html",
                      {"ok": status == 200, "message": message}, status=status)
    back = request.POST.get("next", "")
    if status == 200 and url_has_allowed_host_and_scheme(back, {request.get_host()}):
        messages.success(request, message)
        return HttpResponseRedirect(back)
    return HttpResponse(message, status=status, content_type="text/plain; charset=utf-8")
