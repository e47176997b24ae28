"""Sessions and what lives in them: conversations, entries, documents, submissions."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Query, Router, Status
from ninja.errors import HttpError

from controlplane import models
from controlplane.execution import runtime
from kernel import Draft, NotRegistered, UnknownRecord, agent
from kernel.errors import DocumentConflict
from kernel.records import Entry, Submission

from .auth import actor, operator
from .schemas import (
    ConversationIn,
    ConversationOut,
    DocumentOut,
    EntryOut,
    EntryPage,
    SessionIn,
    SessionOut,
    SubmissionIn,
    SubmissionOut,
)

router = Router(tags=["sessions"])
MAX_PAGE = 500


def _session(session_id: str) -> Any:
    record = runtime().kernel.storage.session(session_id)
    if record is None:
        raise UnknownRecord(f"no session {session_id}")
    return record


@router.get("/sessions", response=list[SessionOut])
def list_sessions(
    request: HttpRequest,
    after: str | None = Query(None, description="id of the last session of the previous page"),
    limit: int = Query(50, ge=1, le=MAX_PAGE),
) -> Any:
    """Newest first; ids sort by creation time."""
    rows = models.Session.objects.order_by("-id")
    if after:
        rows = rows.filter(id__lt=after)
    return list(rows[:limit])


@router.post("/sessions", response={201: SessionOut})
def create_session(request: HttpRequest, body: SessionIn) -> Any:
    operator(request)
    handle = runtime().kernel.create_session(metadata=body.metadata)
    return Status(201, _session(handle.id))


@router.get("/sessions/{session_id}", response=SessionOut)
def get_session(request: HttpRequest, session_id: str) -> Any:
    return _session(session_id)


@router.get("/sessions/{session_id}/conversations", response=list[ConversationOut])
def list_conversations(request: HttpRequest, session_id: str) -> Any:
    _session(session_id)
    return list(models.Conversation.objects.filter(session_id=session_id).order_by("created_seq"))


@router.post("/sessions/{session_id}/conversations", response={201: ConversationOut})
def create_conversation(request: HttpRequest, session_id: str, body: ConversationIn) -> Any:
    user = operator(request)
    draft = Draft(actor=actor(user))
    try:
        conversation_id = draft.create_conversation(
            fork_of=body.fork_of, fork_entry_id=body.fork_entry_id
        )
    except ValueError as exc:
        raise HttpError(422, str(exc)) from exc
    runtime().kernel.open(_session(session_id).id).commit(draft)
    return Status(201, runtime().kernel.storage.conversation(conversation_id))


def _entry_out(entry: Entry) -> dict[str, Any]:
    fields = {f: getattr(entry, f) for f in EntryOut.model_fields if f != "cursor"}
    return {**fields, "cursor": f"{entry.seq}.{entry.ordinal}"}


def _cursor(value: str) -> tuple[int, int]:
    try:
        seq, ordinal = value.split(".")
        return int(seq), int(ordinal)
    except ValueError as exc:
        raise HttpError(422, "after: expected a cursor like '12.0' from a previous page") from exc


@router.get("/conversations/{conversation_id}/entries", response=EntryPage)
def list_entries(
    request: HttpRequest,
    conversation_id: str,
    after: str | None = Query(None, description="cursor of the last entry already read"),
    limit: int = Query(100, ge=1, le=MAX_PAGE),
) -> Any:
    """A conversation's transcript in order; a fork includes its origin up to the fork."""
    entries = runtime().kernel.entries(conversation_id)
    if after:
        position = _cursor(after)
        entries = [e for e in entries if (e.seq, e.ordinal) > position]
    page = entries[:limit]
    more = len(entries) > limit
    return {
        "entries": [_entry_out(e) for e in page],
        "next": f"{page[-1].seq}.{page[-1].ordinal}" if more else None,
    }


@router.get("/sessions/{session_id}/documents/{kind}/{key}", response=DocumentOut)
def get_document(
    request: HttpRequest,
    session_id: str,
    kind: str,
    key: str,
    version: int | None = Query(None, ge=1, description="a past version; default: current"),
) -> Any:
    kernel = runtime().kernel
    _session(session_id)
    try:
        value = kernel.document(session_id, kind, key, version)
    except NotRegistered as exc:
        raise HttpError(404, str(exc)) from exc
    current = kernel.document_version(session_id, kind, key)
    return {"kind": kind, "key": key, "version": version or current, "value": value}


@router.get("/sessions/{session_id}/submissions", response=list[SubmissionOut])
def list_submissions(request: HttpRequest, session_id: str) -> Any:
    _session(session_id)
    return list(models.Submission.objects.filter(session_id=session_id).order_by("created_seq"))


@router.post(
    "/sessions/{session_id}/submissions", response={200: SubmissionOut, 201: SubmissionOut}
)
def submit(request: HttpRequest, session_id: str, body: SubmissionIn) -> Any:
    """Accept input for a conversation once per ``request_id``: a repeat answers 200 with
    the original, whatever its body says. An idle conversation starts a turn; a busy one
    does what ``when_busy`` says (``reject``: 409 saying why, nothing written)."""
    user = operator(request)
    handle = runtime().kernel.open(_session(session_id).id)
    try:
        submitted = agent.submit(
            handle,
            body.conversation_id,
            body.input,
            body.request_id,
            body.when_busy,
            actor=actor(user),
        )
    except ValueError as exc:
        raise HttpError(422, f"input: {exc}") from exc
    except DocumentConflict as exc:
        raise HttpError(409, str(exc)) from exc
    if submitted.outcome == "rejected":
        raise HttpError(
            409,
            f"{submitted.reason}; when_busy is reject, so nothing was written "
            "(steer or follow_up would add the input to it)",
        )
    assert submitted.submission is not None
    return Status(
        200 if submitted.outcome == "duplicate" else 201, _submission(submitted.submission.id)
    )


@router.get("/submissions/{submission_id}", response=SubmissionOut)
def get_submission(request: HttpRequest, submission_id: str) -> Any:
    return _submission(submission_id)


def _submission(submission_id: str) -> Submission:
    found = runtime().kernel.storage.submission(submission_id)
    if found is None:
        raise UnknownRecord(f"no submission {submission_id}")
    return found
