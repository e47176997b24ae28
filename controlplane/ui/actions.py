"""The operator actions behind the dashboard's buttons, as thin callers of
:mod:`controlplane.commands`: the same checks, the same commit, the same entry in the
operations log with who and why as the API's. A form carries its ``action_id`` (made
when the page was rendered), so a double submit or a retried request does nothing new.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST

from controlplane import commands
from controlplane.access import require_operator
from controlplane.errors import Invalid, http_status
from controlplane.reads import pages
from controlplane.reads.transcript import pretty

MAX_REASON = 2000

Action = Callable[[HttpRequest, str, str, str], commands.ActionResult]
ACTIONS: dict[str, Action] = {
    "cancel": lambda request, target, action_id, reason: commands.cancel_task(
        request.user, target, action_id, reason,
        _seq(request.POST, "expected_run", "the task's run the page showed")),
    "retry": lambda request, target, action_id, reason: commands.retry_task(
        request.user, target, action_id, reason,
        _seq(request.POST, "expected_seq", "the task's version the page showed")),
    "resolve": lambda request, target, action_id, reason: commands.resolve_task(
        request.user, target, action_id, reason, request.POST.get("decision", ""),
        _step(request)),
    "resubmit": lambda request, target, action_id, reason: commands.resubmit(
        request.user, target, action_id, reason,
        _seq(request.POST, "expected_seq", "the submission's version the page showed")),
    "compact": lambda request, target, action_id, reason: commands.compact_conversation(
        request.user, target, action_id, reason, request.POST.get("last_entry_id", "")),
}


@require_POST
@login_required
def act(request: HttpRequest, target: str, action: str) -> HttpResponse:
    """POST an action on a task (``resubmit``: a submission; ``compact``: a
    conversation): operators only (403
    for anyone else, nothing changed)."""
    try:
        require_operator(request.user)
        reason, action_id = _reason_and_id(request)
        result = ACTIONS[action](request, target, action_id, reason)
    except Exception as exc:
        return _refused(request, exc)
    return _done(request, result)


@require_POST
@login_required
def retry_failed(request: HttpRequest) -> HttpResponse:
    """Retry every failed task at once: the form carries the count and the digest of the
    set the page showed, and another set now is refused (409), so the operator confirms
    what they saw."""
    try:
        require_operator(request.user)
        reason, action_id = _reason_and_id(request)
        count, digest = _expected(request, "the page")
        result = commands.retry_all_failed(request.user, action_id, reason, count, digest)
    except Exception as exc:
        return _refused(request, exc)
    return _answer(request, 200, _bulk_note("retry", result))


@require_POST
@login_required
def decide_call(request: HttpRequest, session_id: str, call_id: str) -> HttpResponse:
    """Approve or deny a tool call waiting for approval (the button pressed says which):
    the form carries the digest of the arguments the page showed, and, to run other
    ones, edited arguments as JSON. Refused (409) when the call no longer waits with
    those arguments."""
    try:
        require_operator(request.user)
        reason, action_id = _reason_and_id(request)
        decision = request.POST.get("decision", "")
        seen = request.POST.get("digest", "")
        if not seen:
            raise Invalid("digest: the digest of the arguments the page showed")
        asked = _required_text(request, "expected_request", "the request the page showed")
        result = commands.decide_call(request.user, session_id, call_id, action_id, reason,
                                      decision, seen, asked, _edited(request, decision))
    except Exception as exc:
        return _refused(request, exc)
    return _done(request, result)


@require_GET
@login_required
def restart_preview(request: HttpRequest, task_id: str) -> HttpResponse:
    """What "start again from here" on a phase row would do (the phases that stay, those
    that run again, the calls made again as new ones), and the form that confirms it with
    the restart point and the task's seq the page showed."""
    try:
        require_operator(request.user)
        found = commands.restart_preview(request.user, task_id, _seq(request.GET, "seq"))
    except Exception as exc:
        return _refused(request, exc)
    page = "ui/_restart_confirm.html" if request.headers.get("HX-Request") else "ui/restart.html"
    return render(request, page, {"found": found, "action_id": uuid.uuid4().hex,
                                  "checkpoint": pretty(found.point.checkpoint),
                                  "back": reverse("task", args=[task_id])})


@require_POST
@login_required
def restart(request: HttpRequest, task_id: str) -> HttpResponse:
    """Start the task again from the previewed phase, if the task is still as the preview
    showed it (409 otherwise, nothing done)."""
    try:
        require_operator(request.user)
        reason, action_id = _reason_and_id(request)
        result = commands.restart_task(request.user, task_id, action_id, reason,
                                       _seq(request.POST, "seq"),
                                       _seq(request.POST, "expected_seq"),
                                       request.POST.get("expected_report", "").strip() or None)
    except Exception as exc:
        return _refused(request, exc)
    return _done(request, result, "restart", repeated="Made again")


@require_POST
@login_required
def migrate(request: HttpRequest, task_id: str) -> HttpResponse:
    """Let a task blocked by its environment continue under the one the reporting worker
    offers, if the task and that worker's report are still as the page showed them (409
    otherwise)."""
    try:
        require_operator(request.user)
        reason, action_id = _reason_and_id(request)
        seen = _required_text(request, "expected_report",
                              "the environment report the page showed")
        result = commands.migrate_environment(request.user, task_id, action_id, reason,
                                              _seq(request.POST, "expected_seq"), seen)
    except Exception as exc:
        return _refused(request, exc)
    return _done(request, result, "migrate")


def _done(request: HttpRequest, result: commands.ActionResult, action: str = "",
          repeated: str = "May repeat") -> HttpResponse:
    """The note an action that was committed answers with: what it did (or that an earlier
    request under the same action id already did it), its commit, and what may run
    again because of it."""
    done = "already done" if result.replayed else "done"
    note = f"{action or result.action} {done}: commit seq {result.seq}."
    if result.task_id:
        note += f" The run is task {result.task_id}."
    if result.may_repeat:
        note += f" {repeated}: " + "; ".join(result.may_repeat)
    return _answer(request, 200, note)


def _seq(values: Any, name: str, what: str = "the commit seq the page showed") -> int:
    """A form's hidden count (a seq, a version): 422 naming it when it is not one."""
    text = str(values.get(name, ""))
    if not (text.isascii() and text.isdigit()) or len(text) > 18:
        raise Invalid(f"{name}: {what}")
    return int(text)


def _edited(request: HttpRequest, decision: str) -> Any:
    """The edited arguments a form sent (JSON), or None to run the call as shown."""
    if not request.POST.get("arguments", "").strip():
        return None
    if decision != "approve":
        raise Invalid("arguments: only an approval runs edited arguments")
    value = _json_field(request, "arguments", required=True)
    if not isinstance(value, dict):
        raise Invalid("arguments: a JSON object")
    return value


@require_POST
@login_required
def resume_graph(request: HttpRequest, task_id: str) -> HttpResponse:
    """Resume a graph run waiting at an interrupt with a JSON value: the form carries the
    checkpoint the page showed it waiting at (409 when it no longer waits there), and a
    value that does not meet the schema the node declared is refused (422)."""
    try:
        require_operator(request.user)
        reason, action_id = _reason_and_id(request)
        checkpoint_id = _required_text(
            request, "checkpoint_id", "the checkpoint the page showed the run waiting at")
        value = _json_field(request, "value", required=True)
        shown = request.POST.getlist("interrupt_ids")  # the interrupts the page showed
        if not shown:
            raise Invalid("interrupt_ids: the interrupts the page showed")
        result = commands.resume_graph(request.user, task_id, action_id, reason,
                                       checkpoint_id, value, shown)
    except Exception as exc:
        return _refused(request, exc)
    return _done(request, result, "resume")


@require_POST
@login_required
def start_graph(request: HttpRequest, session_id: str) -> HttpResponse:
    """Start a run of a graph registered here on the session's thread, with a JSON input,
    if the thread is still as the page showed it (409 otherwise)."""
    try:
        require_operator(request.user)
        reason, action_id = _reason_and_id(request)
        result = commands.start_graph(
            request.user, session_id, action_id, reason,
            _required_text(request, "kind", "the graph to run"),
            _json_field(request, "input", required=True), _thread_version(request))
    except Exception as exc:
        return _refused(request, exc)
    return _done(request, result, "start")


@require_POST
@login_required
def fork_graph(request: HttpRequest, session_id: str) -> HttpResponse:
    """Start a new run of the session's graph from one of its thread's checkpoints,
    optionally updating the state there first (a JSON object)."""
    try:
        require_operator(request.user)
        reason, action_id = _reason_and_id(request)
        checkpoint_id = _required_text(request, "checkpoint_id", "the checkpoint to fork from")
        values = _json_field(request, "values", required=False)
        result = commands.fork_graph(request.user, session_id, action_id, reason,
                                     checkpoint_id, _thread_version(request), values,
                                     request.POST.get("kind", "").strip() or None,
                                     request.POST.get("as_node", "").strip() or None)
    except Exception as exc:
        return _refused(request, exc)
    return _done(request, result, "fork")


def _thread_version(request: HttpRequest) -> int:
    """The version of the graph thread the form showed: what a start or a fork sends back."""
    return _seq(request.POST, "expected_version", "the version of the thread the page showed")


def _required_text(request: HttpRequest, name: str, what: str) -> str:
    """A form's text field that must be given: 422 naming it and what it is otherwise."""
    text = request.POST.get(name, "").strip()
    if not text:
        raise Invalid(f"{name}: {what}")
    return text


def _json_field(request: HttpRequest, name: str, *, required: bool) -> Any:
    """A form's JSON field, parsed (None when empty and not required)."""
    text = request.POST.get(name, "").strip()
    if not text:
        if required:
            raise Invalid(f"{name}: a JSON value")
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise Invalid(f"{name}: not JSON ({exc})") from exc
    except RecursionError as exc:  # the parser recurses once per level
        raise Invalid(f"{name}: JSON nested too deeply") from exc


def _search(values: dict[str, str]) -> pages.TaskSearch:
    return pages.task_search(**{k: values.get(k, "") for k in pages.SEARCHED})


def _bulk_action(values: dict[str, str]) -> str:
    action = values.get("action", "")
    if action not in tuple(commands.BulkAction):
        raise Invalid(f"action: one of {[str(a) for a in commands.BulkAction]}")
    return action


@require_GET
@login_required
def bulk_preview(request: HttpRequest) -> HttpResponse:
    """Which tasks the tasks page's filter finds now, and the form that confirms a bulk
    cancel or retry of exactly those (their count and digest, a fresh action id)."""
    try:
        require_operator(request.user)
        action = _bulk_action(request.GET.dict())
        search = _search(request.GET.dict())
        found = commands.bulk_preview(request.user, search.filter(), action)
    except Exception as exc:
        return _refused(request, exc)
    return render(request, "ui/_bulk_confirm.html", {
        "action": action, "found": found, "count": found.count, "search": vars(search),
        "action_id": uuid.uuid4().hex,
    })


@require_POST
@login_required
def bulk_act(request: HttpRequest) -> HttpResponse:
    """Cancel or retry the tasks of the filter, if they are still the previewed ones (409
    otherwise, nothing done): one commit per task, each in its session's log."""
    try:
        require_operator(request.user)
        action = _bulk_action(request.POST.dict())
        reason, action_id = _reason_and_id(request)
        count, digest = _expected(request, "the preview")
        result = commands.bulk_act(request.user, action, _search(request.POST.dict()).filter(),
                                   action_id, reason, count, digest)
    except Exception as exc:
        return _refused(request, exc)
    return _answer(request, 200, _bulk_note(action, result))


def _expected(request: HttpRequest, shown: str) -> tuple[int, str]:
    """A bulk form's hidden ``expected_count`` and ``expected_digest``: the set it showed."""
    count = _seq(request.POST, "expected_count", f"the count {shown} showed")
    digest = request.POST.get("expected_digest", "")
    if not digest:
        raise Invalid(f"expected_digest: the digest of the tasks {shown} showed")
    return count, digest


def _bulk_note(action: str, result: commands.BulkResult) -> str:
    done = [r for r in result.results if r.ok and not r.replayed]
    replayed = [r for r in result.results if r.ok and r.replayed]
    failed = [f"{r.task_id}: {r.detail}" for r in result.results if not r.ok]
    note = f"{action}: {len(done)} of {result.count} done."
    if replayed:
        note += (f" {len(replayed)} already done earlier by this action id: "
                 "nothing ran again.")
    if failed:
        note += " Not done: " + "; ".join(failed)
    return note


def _step(request: HttpRequest) -> commands.Step:
    """The step a resolve form was rendered for (hidden fields of the form)."""
    signal = request.POST.get("signal", "")
    if not signal:
        raise Invalid("signal, epoch: the step the page showed")
    return commands.Step(signal, _seq(request.POST, "epoch", "the step the page showed"))


def _reason_and_id(request: HttpRequest) -> tuple[str, str]:
    """An action form's reason (required, as the API wants it) and its action id, the
    operator's own: live parts are rendered once per commit for every operator watching
    (controlplane.sockets.pages), so the ids in their forms are the same, and one operator's
    action must not answer another's "already done" when nothing ran for them."""
    reason = request.POST.get("reason", "").strip()
    if not reason or len(reason) > MAX_REASON or "\x00" in reason:
        raise Invalid(f"give a reason (at most {MAX_REASON} characters)")
    form_id = request.POST.get("action_id", "").strip()[:180] or uuid.uuid4().hex
    return reason, f"u{request.user.pk}-{form_id}"


def _refused(request: HttpRequest, exc: Exception) -> HttpResponse:
    """A command's refusal, said as the API says it; anything else is a real error."""
    status = http_status(exc)
    if status is None:
        raise exc
    return _answer(request, status, str(exc))


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
