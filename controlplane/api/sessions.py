"""Sessions and what lives in them: conversations, entries, documents, submissions."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Query, Router, Status

from controlplane import commands
from controlplane.api.auth import caller, via
from controlplane.api.schemas import (
    ActionIn,
    ApprovalOut,
    BranchOut,
    ConversationIn,
    ConversationOut,
    DocumentOut,
    EntryOut,
    EntryPage,
    GraphOut,
    GraphTimelineOut,
    ModelOut,
    SessionIn,
    SessionOut,
    SubmissionIn,
    SubmissionOut,
)
from controlplane.api.types import MAX_BIGINT, NO_NUL, PathText, query_text
from controlplane.errors import Invalid
from controlplane.reads import approvals, graphs, models_configured
from controlplane.reads import sessions as reads
from kernel import NotRegistered, UnknownRecord
from kernel.records import Entry

router = Router(tags=["sessions"])
MAX_PAGE = 500
MAX_NAMESPACE = 4000
"""A subgraph's namespace names each enclosing node and task (``node:task id``, joined
by ``|``): nested subgraphs make it longer than an id."""
CURSOR = r"^[0-9]{1,18}\.[0-9]{1,9}$"
"""An entry's position, ``seq.ordinal`` (a bigint and an int)."""


@router.get("/sessions", response=list[SessionOut])
def list_sessions(
    request: HttpRequest,
    after: str | None = query_text("id of the last session of the previous page"),
    limit: int = Query(50, ge=1, le=MAX_PAGE),
) -> Any:
    """Newest first; ids sort by creation time; an empty ``after`` is the first page."""
    return reads.sessions(after or None, limit)


@router.post("/sessions", response={201: SessionOut})
def create_session(request: HttpRequest, body: SessionIn) -> Any:
    """A new session; its first commit records who created it and with what credential
    (an API token or the browser session) in its operations log."""
    return Status(201, commands.create_session(caller(request), body.metadata, via(request)))


@router.get("/sessions/{session_id}", response=SessionOut)
def get_session(request: HttpRequest, session_id: PathText) -> Any:
    return reads.session(session_id)


@router.get("/sessions/{session_id}/graph", response=GraphOut)
def get_graph(request: HttpRequest, session_id: PathText) -> Any:
    """The LangGraph thread a session holds: its checkpoints (a timeline of the graph's
    super-steps, with the branches forks started), the runs that wait on an interrupt,
    and its graph runs. 404 when the session holds no thread."""
    return graphs.required_thread(session_id)


@router.get("/sessions/{session_id}/graph/checkpoints", response=GraphTimelineOut)
def get_graph_checkpoints(
    request: HttpRequest,
    session_id: PathText,
    namespace: str | None = Query(None, pattern=NO_NUL, max_length=MAX_NAMESPACE,
                                  description="a subgraph's namespace "
                                  "(`subgraphs[].namespace`); empty: the graph's own"),
    limit: int = Query(100, ge=1, le=MAX_PAGE),
) -> Any:
    """One namespace's checkpoints on a timeline of their own, the newest `limit`, oldest
    first, each on its branch. 404 when the thread holds none in that namespace."""
    return graphs.timeline(session_id, namespace or graphs.ROOT, limit)


@router.get("/sessions/{session_id}/conversations", response=list[ConversationOut])
def list_conversations(
    request: HttpRequest,
    session_id: PathText,
    after: str | None = query_text("id of the last conversation of the previous page"),
    limit: int = Query(100, ge=1, le=MAX_PAGE),
) -> Any:
    """In creation order, a page at a time; an empty ``after`` is the first page."""
    return reads.conversations(session_id, after or None, limit)


@router.post("/sessions/{session_id}/conversations", response={201: ConversationOut})
def create_conversation(
    request: HttpRequest, session_id: PathText, body: ConversationIn
) -> Any:
    """A new conversation, or a fork of one at one of its entries: send `fork_of` and
    `fork_entry_id` both (one alone is refused with 422 naming the other). Operators
    only."""
    created = commands.create_conversation(
        caller(request), session_id, body.fork_of, body.fork_entry_id
    )
    return Status(201, created)


@router.post("/sessions/{session_id}/entries/{entry_id}/branch", response=BranchOut)
def branch_turn(
    request: HttpRequest, session_id: PathText, entry_id: PathText, body: ActionIn
) -> Any:
    """Branch the turn that committed the model response `entry_id`: a new conversation
    forked at that entry, and a new turn on it that starts from the response as committed.
    The model is asked only from there on; the response's tool calls are made anew, as new
    calls under new operation ids. The original conversation and turn stay as they are.
    Operators only; one commit naming who and why."""
    return commands.branch_turn(caller(request), session_id, entry_id, body.action_id,
                                body.reason)


def _entry_out(entry: Entry) -> dict[str, Any]:
    fields = {f: getattr(entry, f) for f in EntryOut.model_fields if f != "cursor"}
    return {**fields, "cursor": f"{entry.seq}.{entry.ordinal}"}


def _cursor(value: str) -> tuple[int, int]:
    try:
        seq, ordinal = value.split(".")
        return int(seq), int(ordinal)
    except ValueError as exc:
        raise Invalid("after: expected a cursor like '12.0' from a previous page") from exc


@router.get("/conversations/{conversation_id}/entries", response=EntryPage)
def list_entries(
    request: HttpRequest,
    conversation_id: PathText,
    after: str | None = Query(None, pattern=CURSOR,
                              description="cursor of the last entry already read"),
    limit: int = Query(100, ge=1, le=MAX_PAGE),
) -> Any:
    """A conversation's transcript in order; a fork includes its origin up to the fork."""
    page = reads.entries(conversation_id, _cursor(after) if after else None, limit)
    last = page.entries[-1] if page.entries else None
    return {
        "entries": [_entry_out(e) for e in page.entries],
        "next": f"{last.seq}.{last.ordinal}" if page.more and last else None,
    }


@router.get("/sessions/{session_id}/documents/{kind}/{key}", response=DocumentOut)
def get_document(
    request: HttpRequest,
    session_id: PathText,
    kind: PathText,
    key: PathText,
    version: int | None = Query(None, ge=1, le=MAX_BIGINT,
                                description="a past version; default: current"),
) -> Any:
    try:
        return reads.document(session_id, kind, key, version)
    except NotRegistered as exc:
        raise UnknownRecord(str(exc)) from exc


@router.get("/sessions/{session_id}/submissions", response=list[SubmissionOut])
def list_submissions(
    request: HttpRequest,
    session_id: PathText,
    after: str | None = query_text("id of the last submission of the previous page"),
    limit: int = Query(100, ge=1, le=MAX_PAGE),
) -> Any:
    """In creation order, a page at a time; an empty ``after`` is the first page."""
    reads.session(session_id)
    return reads.submissions(session_id, after or None, limit)


@router.post(
    "/sessions/{session_id}/submissions", response={200: SubmissionOut, 201: SubmissionOut}
)
def submit(request: HttpRequest, session_id: PathText, body: SubmissionIn) -> Any:
    """Accept input for a conversation once per ``request_id``: a repeat answers 200 with
    the original, whatever its body says. An idle conversation starts a turn; a busy one
    does what ``when_busy`` says (``reject``: 409 saying why, nothing written)."""
    submitted = commands.submit(
        caller(request), session_id, body.conversation_id, body.input, body.request_id,
        body.when_busy,
    )
    assert submitted.submission is not None
    created = 200 if submitted.outcome == "duplicate" else 201
    return Status(created, reads.submission(submitted.submission.id))


@router.get("/models", response=list[ModelOut])
def list_models(request: HttpRequest) -> Any:
    """The models a submission may name in `input.model` (configured by name: MODELS)."""
    return models_configured.configured()


@router.get("/sessions/{session_id}/approvals", response=list[ApprovalOut])
def list_approvals(request: HttpRequest, session_id: PathText) -> Any:
    """The session's tool calls waiting for an operator's approval, oldest first: decide
    each with `POST /sessions/{id}/calls/{call_id}/approve` or `deny`."""
    return approvals.pending_in(session_id)


@router.get("/submissions/{submission_id}", response=SubmissionOut)
def get_submission(request: HttpRequest, submission_id: PathText) -> Any:
    return reads.submission(submission_id)
