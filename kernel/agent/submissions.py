"""Accepting input for a conversation: once per request id, and never two turns at once.

Whether a conversation is busy is read from its state document and written back
with the version it was read at, so two submissions racing for an idle
conversation cannot both start a turn: one commit wins, the other re-reads and
sees the conversation busy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from kernel import tracing
from kernel.commit import Draft, DuplicateRequest
from kernel.errors import DocumentConflict
from kernel.records import Submission, SubmissionStatus
from kernel.session import SessionHandle

from .context import USER
from .models import check_model, check_options
from .turn import CONVERSATION, turn_kind

JSON = Any
RACE_RETRIES = 5
MAX_TEXT = 100_000
"""The most characters a submission's text may have: enough for a pasted document, and
a bound on what every model request of its turn carries and every tool parses."""


class WhenBusy(StrEnum):
    STEER = "steer"  # join the running turn: its next model request sees the input
    FOLLOW_UP = "follow_up"  # queue it: a turn of its own starts when this one ends
    REJECT = "reject"  # refuse it and write nothing


@dataclass(frozen=True)
class Submitted:
    submission: Submission | None
    outcome: str  # placed, steered, queued, rejected, duplicate
    reason: str | None = None


def submit(
    handle: SessionHandle,
    conversation_id: str,
    input: JSON,
    request_id: str,
    when_busy: WhenBusy = WhenBusy.FOLLOW_UP,
    actor: str = "system",
    *,
    resubmit_of: str | None = None,
    also: Callable[[Draft], None] | None = None,
    expected_seq: int | None = None,
) -> Submitted:
    """Accept ``input`` once per ``request_id``: start a turn on an idle conversation, or
    do what ``when_busy`` says. ``resubmit_of`` links a retry of an earlier submission,
    refused (:class:`~kernel.errors.StaleStep`) when that submission changed after
    ``expected_seq`` (when given: its ``updated_seq`` as the caller saw it); ``also``
    adds writes to the same commit (an operator action records itself so).

    In a span of its own (``submit``): the turn it starts is created in it, so the turn's
    phases, its model requests and its tools are in the submission's trace."""
    with tracing.span("submit", {
        "kernel.session.id": handle.id, "kernel.conversation.id": conversation_id,
        "kernel.submission.request_id": request_id, "kernel.submission.when_busy": when_busy,
        "kernel.actor": actor,
    }) as span:
        submitted = _submit(handle, conversation_id, input, request_id, when_busy, actor,
                            resubmit_of, also, expected_seq)
        span.set({"kernel.submission.outcome": submitted.outcome,
                  "kernel.submission.id": submitted.submission.id
                  if submitted.submission is not None else None})
        return submitted


def _submit(
    handle: SessionHandle,
    conversation_id: str,
    input: JSON,
    request_id: str,
    when_busy: WhenBusy,
    actor: str,
    resubmit_of: str | None,
    also: Callable[[Draft], None] | None,
    expected_seq: int | None = None,
) -> Submitted:
    if not isinstance(input, dict) or not isinstance(input.get("text"), str):
        raise ValueError("input must be an object with a `text` string")
    if len(input["text"]) > MAX_TEXT:
        raise ValueError(f"text: at most {MAX_TEXT} characters, not {len(input['text'])}")
    if "model" in input:
        check_model(input["model"])
    if "options" in input:
        check_options(input["options"])
    kernel = handle.kernel
    kind = turn_kind(input)
    if "agent" in input and kind not in kernel.registry.kinds():
        agents = sorted(k.removeprefix("agent:") for k in kernel.registry.kinds()
                        if k.startswith("agent:"))
        raise ValueError(f"agent: no agent {str(input['agent'])[:100]!r} is registered "
                         f"(registered: {', '.join(agents) or 'none'})")
    for _ in range(RACE_RETRIES):
        existing = kernel.storage.submission_by_request(handle.id, request_id)
        if existing is not None:
            return Submitted(existing, "duplicate")
        state, version = kernel.versioned_document(handle.id, CONVERSATION, conversation_id)
        active = state.get("active")
        if active and when_busy is WhenBusy.REJECT:
            return Submitted(None, "rejected", f"conversation is busy with turn {active}")
        if active and when_busy is WhenBusy.STEER and (
            kind != "agent-turn" or kernel.task(active).kind != "agent-turn"
        ):
            # A hosted agent's run takes its input when it starts: steered text would
            # never reach its model.
            raise ValueError("when_busy: steer joins only a native turn; this conversation "
                             "runs a registered agent (follow_up queues the input)")
        draft = Draft(actor=actor)
        submission_id = draft.submit(conversation_id, request_id, input, resubmit_of=resubmit_of,
                                     expected_seq=expected_seq)
        if also is not None:
            also(draft)
        if not active:
            draft.append(
                conversation_id, USER, {"text": input["text"], "submission": submission_id}
            )
            draft.update_submission(submission_id, SubmissionStatus.PLACED)
            turn = draft.create_task(
                kind,
                {
                    "conversation_id": conversation_id,
                    "submissions": [submission_id],
                    "model": input.get("model"),
                    "options": input.get("options", {}),
                },
            )
            state = {"active": turn, "queue": [], "steering": []}
            outcome = "placed"
        elif when_busy is WhenBusy.STEER:
            draft.append(
                conversation_id, USER, {"text": input["text"], "submission": submission_id}
            )
            draft.update_submission(submission_id, SubmissionStatus.PLACED)
            state = {**state, "steering": [*state.get("steering", []), submission_id]}
            outcome = "steered"
        else:
            state = {**state, "queue": [*state.get("queue", []), submission_id]}
            outcome = "queued"
        draft.update_document(
            CONVERSATION,
            conversation_id,
            {"op": "set", "path": [], "value": state},
            expected_version=version,
        )
        try:
            written = handle.commit(draft)
        except DuplicateRequest as exc:
            return Submitted(exc.existing, "duplicate")
        except DocumentConflict:
            continue
        stored = next(s for s in [*written.new_submissions] if s.id == submission_id)
        return Submitted(stored, outcome)
    raise DocumentConflict(f"conversation {conversation_id} kept changing; submit again")
