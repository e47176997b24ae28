"""Sessions and what lives in them: conversations, transcripts, documents, submissions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from controlplane import models
from controlplane.runtime import runtime
from controlplane.storage.schema import CONVERSATION, SESSION, SUBMISSION
from kernel import UnknownRecord
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


def committed(session_id: str, key: str) -> bool:
    """Whether the session has a commit with this idempotency key (an action id)."""
    return models.Commit.objects.filter(session_id=session_id, key=key).exists()
