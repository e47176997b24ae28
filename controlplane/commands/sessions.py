"""Sessions and what lives in them: a session, a conversation, a submission and its
resubmission, a branch of a turn, a compaction; a task started from a trusted shell."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User

from controlplane import model_catalog
from controlplane.access import actor, require_operator
from controlplane.commands.actions import (
    ActionResult,
    commit_action,
    done_before,
    record_action,
    refuse_unless,
)
from controlplane.errors import Conflict, Invalid
from controlplane.reads import sessions as session_reads
from controlplane.reads import transcript
from controlplane.worker.runtime import runtime
from kernel import (
    DocumentConflict,
    Draft,
    DuplicateCommit,
    ReservedConversation,
    StaleStep,
    UnknownRecord,
    agent,
)
from kernel.agent import Submitted, compaction
from kernel.agent import branches as agent_branches
from kernel.commit import operations_log_id
from kernel.records import Conversation, SessionRecord

CREATE_SESSION = "create-session"
"""The operations-log entry of a session's creation: who, and with what (``via``)."""


def _record_creation(draft: Draft, by: str, via: str) -> None:
    draft.record_operation(CREATE_SESSION, {"by": by, "via": via})


def create_session(user: User, metadata: dict[str, Any], via: str) -> SessionRecord:
    """A new session, its creation the first commit: ``user`` named as its actor and in
    the operations log with ``via`` (the credential used, say an API token). Should that
    commit fail, the session is left empty and unattributed (its head at 0)."""
    require_operator(user)
    kernel = runtime().kernel
    handle = kernel.create_session(metadata=metadata)
    draft = Draft(actor=actor(user))
    _record_creation(draft, actor(user), via)
    handle.commit(draft)
    created = kernel.storage.session(handle.id)
    assert created is not None
    return created


def start_task(
    actor_name: str, kind: str, input: Any, session_id: str | None, title: str = ""
) -> tuple[str, str]:
    """Start a task of ``kind`` in a session (a new one titled ``title`` unless given):
    ``(session_id, task_id)``. For trusted callers (a shell), who name themselves."""
    kernel = runtime().kernel
    if session_id is not None and kernel.storage.session(session_id) is None:
        raise UnknownRecord(f"no session {session_id}")
    handle = (
        kernel.open(session_id) if session_id
        else kernel.create_session(metadata={"title": title})
    )
    draft = Draft(actor=actor_name)
    if session_id is None:
        _record_creation(draft, actor_name, "shell")
    task_id = draft.create_task(kind, input)
    handle.commit(draft)
    return handle.id, task_id


def create_conversation(
    user: User, session_id: str, fork_of: str | None, fork_entry_id: str | None
) -> Conversation:
    require_operator(user)
    kernel = runtime().kernel
    if kernel.storage.session(session_id) is None:
        raise UnknownRecord(f"no session {session_id}")
    if (fork_of is None) != (fork_entry_id is None):
        missing = "fork_of" if fork_of is None else "fork_entry_id"
        raise Invalid(f"{missing}: a fork names both the conversation it forks (fork_of) "
                      "and the entry it forks at (fork_entry_id)")
    draft = Draft(actor=actor(user))
    try:
        conversation_id = draft.create_conversation(fork_of=fork_of, fork_entry_id=fork_entry_id)
    except ValueError as exc:
        raise Invalid(str(exc)) from exc
    try:
        kernel.open(session_id).commit(draft)
    except ReservedConversation as exc:
        raise Invalid(f"fork_of: {exc}") from exc
    created = kernel.storage.conversation(conversation_id)
    assert created is not None
    return created


@dataclass(frozen=True)
class BranchResult:
    """A turn branched from a model response: the new conversation and turn, the commit."""

    action_id: str
    session_id: str
    entry_id: str
    conversation_id: str
    turn_id: str
    seq: int
    replayed: bool


def branch_turn(
    user: User, session_id: str, entry_id: str, action_id: str, reason: str
) -> BranchResult:
    """Branch the turn that committed the model response ``entry_id``: a new conversation
    forked at that entry and a new turn on it that starts from the response as committed
    (the model is asked only from there; its tool calls are made anew, under new operation
    ids). One commit naming who and why; the original conversation and turn stay."""
    require_operator(user)
    kernel = runtime().kernel
    conversation_id = session_reads.entry_conversation(session_id, entry_id)
    key = action_id
    try:
        made = agent_branches.branch_turn(
            kernel.open(session_id), conversation_id, entry_id, actor=actor(user), key=key,
            also=lambda d: record_action(d, user, key, "branch", entry_id, reason),
        )
    except DuplicateCommit as exc:
        if not done_before(user, session_id, key, "branch", entry_id):
            raise Conflict(f"action id {key!r} was used by another commit: use a fresh id"
                           ) from exc
        log_id = operations_log_id(session_id)
        made_before = {i.get("type"): i.get("id") for i in exc.existing.summary
                       if i.get("type") in ("conversation", "task") and i.get("id") != log_id}
        return BranchResult(action_id, session_id, entry_id,
                            str(made_before.get("conversation")), str(made_before.get("task")),
                            exc.existing.seq, True)
    return BranchResult(action_id, session_id, entry_id, made.conversation_id, made.turn_id,
                        made.seq, False)


def submit(
    user: User,
    session_id: str,
    conversation_id: str,
    input: Any,
    request_id: str,
    when_busy: agent.WhenBusy,
) -> Submitted:
    """Accept input for a conversation once per ``request_id`` (a repeat returns the
    original); an idle conversation starts a turn, a busy one does what ``when_busy``
    says, ``reject`` refusing with Conflict and writing nothing."""
    require_operator(user)
    kernel = runtime().kernel
    if kernel.storage.session(session_id) is None:
        raise UnknownRecord(f"no session {session_id}")
    try:
        model_catalog.check_choice(settings.MODELS, input)
        submitted = agent.submit(
            kernel.open(session_id), conversation_id, input, request_id, when_busy,
            actor=actor(user),
        )
    except ValueError as exc:
        raise Invalid(f"input: {exc}") from exc
    except ReservedConversation as exc:
        raise Invalid(f"conversation_id: {exc}") from exc
    if submitted.outcome == "rejected":
        raise Conflict(
            f"{submitted.reason}; when_busy is reject, so nothing was written "
            "(steer or follow_up would add the input to it)"
        )
    return submitted


def resubmit(
    user: User, submission_id: str, action_id: str, reason: str, expected_seq: int
) -> ActionResult:
    """Submit the same input again as a new submission linked to the original, as any
    submission: it starts a turn, or follows the one the conversation is busy with.
    ``expected_seq`` is the original's ``updated_seq`` as the operator saw it: one that
    changed since (resubmitted by someone else: each resubmission counts itself in the
    original, in its own commit) is refused by the commit (``StaleStep``, under the
    session's lock) rather than run the same input twice."""
    require_operator(user)
    kernel = runtime().kernel
    original = kernel.storage.submission(submission_id)
    if original is None:
        raise UnknownRecord(f"no submission {submission_id}")
    if not done_before(user, original.session_id, action_id, "resubmit", submission_id):
        # The resubmission this id made is kept when its session's operations log is
        # pruned: a repeat is answered with it (as a duplicate request), not refused.
        taken = kernel.storage.submission_by_request(original.session_id, action_id)
        refuse_unless(
            taken is None or taken.resubmit_of == submission_id,
            f"action id {action_id!r} is the request id of submission "
            f"{taken.id if taken else ''}: send a fresh one",
        )
    try:
        submitted = agent.submit(
            kernel.open(original.session_id),
            original.conversation_id,
            original.input,
            action_id,
            agent.WhenBusy.FOLLOW_UP,
            actor=actor(user),
            resubmit_of=original.id,
            also=lambda draft: record_action(draft, user, action_id, "resubmit", submission_id,
                                             reason, seen={"expected_seq": expected_seq}),
            expected_seq=expected_seq,
        )
    except ValueError as exc:
        raise Invalid(f"the original submission cannot run again: {exc}") from exc
    assert submitted.submission is not None
    return ActionResult(
        action_id, "resubmit", submission_id, original.session_id,
        submitted.submission.created_seq, submitted.outcome == "duplicate",
        ["the whole request runs again: its model and tool calls may repeat"],
    )


def compact_conversation(
    user: User, conversation_id: str, action_id: str, reason: str, last_entry_id: str
) -> ActionResult:
    """Summarize the older part of a conversation now (an ``agent-compaction`` task,
    :mod:`kernel.agent.compaction`) with the model its latest turn asks: later model
    requests see the summary in place of the entries it covers; the transcript keeps
    them. ``last_entry_id``: the newest entry the operator saw; a conversation that has
    moved on since, or whose compaction (the operator's or a turn's) has not ended, is
    refused (Conflict)."""
    require_operator(user)
    kernel = runtime().kernel
    conversation = kernel.storage.conversation(conversation_id)
    if conversation is None:
        raise UnknownRecord(f"no conversation {conversation_id}")
    if conversation_id == operations_log_id(conversation.session_id):
        raise Invalid("conversation: the operations log is not a model's conversation")
    hosted = session_reads.own_history_agent(conversation_id)
    if hosted is not None:
        raise Invalid(f"conversation: agent {hosted!r} answers it and keeps its own message "
                      "history, which a summary here would not shorten (its framework's "
                      "history processors do)")
    session_id = conversation.session_id
    # Read first: a compaction started after it refuses the commit (see below), whether or
    # not the read of those under way saw it.
    starts_seen = session_reads.compactions_started(session_id, conversation_id)
    if not done_before(user, session_id, action_id, "compact", conversation_id):
        # Its summary is the entry a compaction adds, and only once it is written: until
        # then a second one would summarize the same entries again.
        under_way = session_reads.compaction_under_way(session_id, conversation_id)
        refuse_unless(
            under_way is None,
            f"a compaction of {conversation_id} is under way (task {under_way}): look "
            "again once it has ended",
        )
    task_input = {"reason": "operator", "by": actor(user)}
    # The window its turns are measured against and the model they ask, not the default;
    # one the catalogue no longer holds cannot summarize, and the default one does.
    model = transcript.conversation_model(session_id, conversation_id)
    if model is not None and model in settings.MODELS:
        task_input["model"] = model

    def build(draft: Draft) -> None:
        # The entries it will summarize are the ones the operator saw: checked by the
        # commit, so that an entry appended after any read of ours refuses it too.
        draft.expect_newest_entry(conversation_id, last_entry_id)
        compaction.start(draft, conversation_id, task_input, expected_version=starts_seen)

    try:
        seq, replayed = commit_action(user, session_id, action_id, "compact", conversation_id,
                                      reason, build, seen={"last_entry_id": last_entry_id})
    except StaleStep as exc:
        raise Conflict(f"{exc}: look again") from exc
    except DocumentConflict as exc:
        raise Conflict(f"another compaction of {conversation_id} started while yours was "
                       "asked: look again once it has ended") from exc
    return ActionResult(action_id, "compact", conversation_id, session_id, seq, replayed, [])
