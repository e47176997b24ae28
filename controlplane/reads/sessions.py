"""Sessions and what lives in them: conversations, transcripts, documents, submissions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import Q

from controlplane import models
from controlplane.runtime import runtime
from controlplane.storage.schema import CONVERSATION, SESSION, SUBMISSION
from kernel import UnknownRecord
from kernel.commit import operations_log_id
from kernel.records import Conversation, Entry, SessionRecord, Submission


def sessions(after: str | None, limit: int) -> list[SessionRecord]:
    """Newest first (ids sort by creation time); ``after`` is the last id of the previous
    page."""
    rows = models.Session.objects.order_by("-id")
    if after:
        rows = rows.filter(id__lt=after)
    return [SESSION.record(v) for v in rows[:limit].values(*SESSION.columns)]


def session(session_id: str) -> SessionRecord:
    found = runtime().kernel.storage.session(session_id)
    if found is None:
        raise UnknownRecord(f"no session {session_id}")
    return found


def conversations(session_id: str) -> list[Conversation]:
    session(session_id)
    rows = models.Conversation.objects.filter(session_id=session_id).order_by("created_seq")
    return [CONVERSATION.record(v) for v in rows.values(*CONVERSATION.columns)]


@dataclass(frozen=True)
class EntryPage:
    entries: list[Entry]
    more: bool


def entries(conversation_id: str, after: tuple[int, int] | None, limit: int) -> EntryPage:
    """A conversation's transcript in order after the ``(seq, ordinal)`` cursor; a fork
    includes its origin up to the fork."""
    found = runtime().kernel.entries(conversation_id)
    if after:
        found = [e for e in found if (e.seq, e.ordinal) > after]
    return EntryPage(found[:limit], len(found) > limit)


@dataclass(frozen=True)
class DocumentView:
    kind: str
    key: str
    version: int
    value: Any


def document(session_id: str, kind: str, key: str, version: int | None) -> DocumentView:
    """A document's value now or at a past version (NotRegistered for an unknown kind)."""
    kernel = runtime().kernel
    session(session_id)
    value = kernel.document(session_id, kind, key, version)
    current = kernel.document_version(session_id, kind, key)
    return DocumentView(kind, key, version or current, value)


def submissions(session_id: str) -> list[Submission]:
    rows = models.Submission.objects.filter(session_id=session_id).order_by("created_seq")
    return [SUBMISSION.record(v) for v in rows.values(*SUBMISSION.columns)]


def submission(submission_id: str) -> Submission:
    found = runtime().kernel.storage.submission(submission_id)
    if found is None:
        raise UnknownRecord(f"no submission {submission_id}")
    return found


def actions_by_id(session_id: str, action_id: str) -> list[tuple[str, str, str]]:
    """What was done in the session under ``action_id``: ``(recorded id, action,
    target)`` for each operator action its operations log holds under that id, or under
    ``action_id:TASK`` (a bulk action records one per task)."""
    prefix = f"{action_id}:"
    rows = models.Entry.objects.filter(
        session_id=session_id, conversation_id=operations_log_id(session_id)
    ).filter(Q(payload__action_id=action_id) | Q(payload__action_id__startswith=prefix))
    return [
        (str(payload["action_id"]), kind, str(payload.get("target", "")))
        for kind, payload in rows.order_by("seq", "ordinal").values_list("kind", "payload")
    ]
