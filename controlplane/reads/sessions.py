"""Sessions and what lives in them: conversations, transcripts, documents, submissions."""

from __future__ import annotations

import operator
from dataclasses import dataclass
from functools import reduce
from typing import Any

from django.db.models import Q

from controlplane import models
from controlplane.errors import Invalid
from controlplane.process.kernel import process_kernel
from controlplane.storage.schema import CONVERSATION, ENTRY, SESSION, SUBMISSION
from kernel import Status, UnknownRecord
from kernel.agent.compaction import COMPACTION, STARTED
from kernel.agent.context import TOOL_RESULT
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
    found = process_kernel().storage.session(session_id)
    if found is None:
        raise UnknownRecord(f"no session {session_id}")
    return found


def _keyset(rows: Any, model: Any, session_id: str, after: str | None, what: str) -> Any:
    """``rows`` (ordered by ``created_seq``, then id) after the one whose id is ``after``;
    Invalid if the session has no such record."""
    if after is None:
        return rows
    seq = model.objects.filter(session_id=session_id, id=after).values_list(
        "created_seq", flat=True).first()
    if seq is None:
        raise Invalid(f"after: no {what} {after} in session {session_id}")
    return rows.filter(Q(created_seq__gt=seq) | Q(created_seq=seq, id__gt=after))


def conversations(session_id: str, after: str | None = None,
                  limit: int | None = None) -> list[Conversation]:
    """In creation order, ``limit`` of them after the one whose id is ``after``."""
    session(session_id)
    rows = models.Conversation.objects.filter(session_id=session_id).order_by(
        "created_seq", "id")
    rows = _keyset(rows, models.Conversation, session_id, after, "conversation")
    return [CONVERSATION.record(v) for v in rows.values(*CONVERSATION.columns)[:limit]]


def last_conversations(session_id: str, count: int, besides: str
                       ) -> tuple[list[Conversation], int]:
    """``besides`` (if the session has it) and the last ``count`` other conversations, in
    creation order, and how many others there are."""
    rows = models.Conversation.objects.filter(session_id=session_id)
    others = rows.exclude(id=besides)
    last = list(others.order_by("-created_seq", "-id").values(*CONVERSATION.columns)[:count])
    found = [CONVERSATION.record(v) for v in [*reversed(last),
                                              *rows.filter(id=besides).values(
                                                  *CONVERSATION.columns)]]
    return found, len(last) if len(last) < count else others.count()


@dataclass(frozen=True)
class EntryPage:
    entries: list[Entry]
    more: bool


Position = tuple[int, int]
"""An entry's place in a transcript: ``(seq, ordinal)``."""


def _after(position: Position) -> Q:
    seq, ordinal = position
    return Q(seq__gt=seq) | Q(seq=seq, ordinal__gt=ordinal)


def _before(position: Position) -> Q:
    seq, ordinal = position
    return Q(seq__lt=seq) | Q(seq=seq, ordinal__lt=ordinal)


def _upto(position: Position) -> Q:
    seq, ordinal = position
    return Q(seq__lt=seq) | Q(seq=seq, ordinal__lte=ordinal)


def transcript_scope(conversation_id: str, record: Conversation | None = None) -> list[Q]:
    """A conversation's transcript as filters on entries, one per conversation it spans:
    its own entries, and for a fork its origin's up to the fork point (the origin's
    origin's up to the nearer of the two fork points, and so on). A fork's own entries
    come after its fork point, so ``(seq, ordinal)`` orders the whole transcript. A fork
    point retention removed went with every entry before it: nothing more is inherited
    (as :meth:`kernel.session.Kernel.entries` reads it).
    ``record``: the conversation's, if the caller has read it (one read fewer)."""
    if record is not None and record.id == conversation_id:
        found: tuple[str | None, str | None] | None = (record.fork_of, record.fork_entry_id)
    else:
        found = models.Conversation.objects.filter(id=conversation_id).values_list(
            "fork_of", "fork_entry_id").first()
    if found is None:
        raise UnknownRecord(f"no conversation {conversation_id}")
    scope = [Q(conversation_id=conversation_id)]
    bound: Position | None = None
    origin, point = found
    while origin is not None:
        at = models.Entry.objects.filter(id=point).values_list("seq", "ordinal").first()
        if at is None:
            break
        bound = at if bound is None else min(bound, at)
        scope.append(Q(conversation_id=origin) & _upto(bound))
        origin, point = models.Conversation.objects.filter(id=origin).values_list(
            "fork_of", "fork_entry_id").get()
    return scope


def _ordered(scope: list[Q], where: Q, limit: int, last: bool) -> list[Entry]:
    """The first (or, with ``last``, the last) ``limit`` entries of the scope matching
    ``where``, in transcript order: a query per conversation, each an index range
    (conversation, seq, ordinal) read in order and cut at ``limit`` in SQL."""
    order = ("-seq", "-ordinal") if last else ("seq", "ordinal")
    rows = [row for part in scope for row in models.Entry.objects.filter(part, where)
            .order_by(*order).values(*ENTRY.columns)[:limit]]
    rows.sort(key=lambda row: (row["seq"], row["ordinal"]), reverse=last)
    found = [ENTRY.record(row) for row in rows[:limit]]
    return found[::-1] if last else found


def entries(conversation_id: str, after: Position | None, limit: int) -> EntryPage:
    """A conversation's transcript in order after the ``(seq, ordinal)`` cursor; a fork
    includes its origin up to the fork. Paged in SQL: a page reads ``limit`` + 1
    entries per conversation it spans, however long the transcript."""
    found = _ordered(transcript_scope(conversation_id), _after(after) if after else Q(),
                     limit + 1, last=False)
    return EntryPage(found[:limit], len(found) > limit)


def _position(scope: list[Q], conversation_id: str, entry_id: str) -> Position:
    """Where entry ``entry_id`` is in the transcript (UnknownRecord if not in it)."""
    at = models.Entry.objects.filter(reduce(operator.or_, scope), id=entry_id).values_list(
        "seq", "ordinal").first()
    if at is None:
        raise UnknownRecord(f"no entry {entry_id} in the transcript of {conversation_id}")
    return at


def entries_before(conversation_id: str, before: str, limit: int,
                   after: str | None = None) -> EntryPage:
    """The ``limit`` entries of a conversation's transcript just before the entry
    ``before`` (and, with ``after``, after that entry), in order; ``more`` when there
    are earlier ones (after ``after``). UnknownRecord if the transcript has no such
    entry. Each read an index range cut at ``limit`` + 1 in SQL, however far back the
    page is."""
    scope = transcript_scope(conversation_id)
    where = _before(_position(scope, conversation_id, before))
    if after is not None:
        where &= _after(_position(scope, conversation_id, after))
    found = _ordered(scope, where, limit + 1, last=True)
    return EntryPage(found[-limit:] if limit else [], len(found) > limit)


def results_after(conversation_id: str, position: Position, count: int) -> list[Entry]:
    """The next ``count`` tool results of a transcript after ``position``: those of the
    calls a page ends with (a result comes after its call, maybe on the next page)."""
    if count <= 0:
        return []
    return _ordered(transcript_scope(conversation_id), _after(position) & Q(kind=TOOL_RESULT),
                    count, last=False)


@dataclass(frozen=True)
class Tail:
    """A conversation's last entries, and how many it has, counted up to a bound."""

    entries: list[Entry]
    total: int
    """How many entries the transcript has, or the bound when it has more."""
    more: bool
    """It has more than ``total`` entries (not counted: a count would read them all)."""


def last_entries(conversation_id: str, count: int, counted: int,
                 scope: list[Q] | None = None) -> Tail:
    """A conversation's last ``count`` entries, in order, and how many it has, counting
    at most ``counted``: each read is an index range cut by a LIMIT in SQL, so a page
    of a long conversation costs what a page of a short one does. ``scope``: its
    :func:`transcript_scope`, if the caller has read it already."""
    scope = transcript_scope(conversation_id) if scope is None else scope
    total = sum(models.Entry.objects.filter(part).order_by().values("seq")[:counted + 1].count()
                for part in scope)
    return Tail(_ordered(scope, Q(), count, last=True), min(total, counted), total > counted)


@dataclass(frozen=True)
class DocumentView:
    kind: str
    key: str
    version: int
    value: Any


def document(session_id: str, kind: str, key: str, version: int | None) -> DocumentView:
    """A document's value now or at a past version (NotRegistered for an unknown kind)."""
    kernel = process_kernel()
    session(session_id)
    if version is None:
        value, current = kernel.versioned_document(session_id, kind, key)
        return DocumentView(kind, key, current, value)
    return DocumentView(kind, key, version, kernel.document(session_id, kind, key, version))


def own_history_agent(conversation_id: str) -> str | None:
    """The framework agent that answers this conversation (a submission to it names
    one), if any. Such an agent keeps its own message history (a hosted Pydantic AI
    agent's ``message_history``), which the kernel's summaries do not replace."""
    return own_history_agents([conversation_id]).get(conversation_id)


def own_history_agents(conversation_ids: list[str]) -> dict[str, str]:
    """:func:`own_history_agent` of each of these conversations that has one, in one
    query (a page shows several conversations)."""
    found = models.Submission.objects.filter(
        conversation_id__in=conversation_ids, input__has_key="agent",
    ).order_by("conversation_id", "created_seq", "id").distinct(
        "conversation_id").values_list("conversation_id", "input__agent")
    return {conversation: str(agent) for conversation, agent in found}


def compactions_started(session_id: str, conversation_id: str) -> int:
    """The version of the conversation's record of compactions started
    (:data:`kernel.agent.compaction.STARTED`; 0: none yet): read before
    :func:`compaction_under_way`, a start expecting it is refused if another started
    after that read, which the under-way read may have missed."""
    head = process_kernel().storage.document_head(session_id, STARTED, conversation_id)
    return head.version if head is not None else 0


def compaction_under_way(session_id: str, conversation_id: str) -> str | None:
    """The compaction task of the conversation that has not ended, if there is one."""
    found = models.Task.objects.filter(
        session_id=session_id, kind=COMPACTION, input__conversation_id=conversation_id,
    ).exclude(status=Status.TERMINAL).values_list("id", flat=True).first()
    return None if found is None else str(found)


def submissions(session_id: str, after: str | None = None,
                limit: int | None = None) -> list[Submission]:
    """In creation order, ``limit`` of them after the one whose id is ``after``."""
    rows = models.Submission.objects.filter(session_id=session_id).order_by(
        "created_seq", "id")
    rows = _keyset(rows, models.Submission, session_id, after, "submission")
    return [SUBMISSION.record(v) for v in rows.values(*SUBMISSION.columns)[:limit]]


def last_submissions(session_id: str, count: int) -> tuple[list[Submission], int]:
    """The session's last ``count`` submissions, in creation order, and how many it has."""
    rows = models.Submission.objects.filter(session_id=session_id)
    last = rows.order_by("-created_seq", "-id").values(*SUBMISSION.columns)[:count]
    return [SUBMISSION.record(v) for v in reversed(last)], rows.count()


def submission(submission_id: str) -> Submission:
    found = process_kernel().storage.submission(submission_id)
    if found is None:
        raise UnknownRecord(f"no submission {submission_id}")
    return found


def actions_by_id(session_id: str, action_id: str) -> list[tuple[str, str, str, str]]:
    """What was done in the session under ``action_id``: ``(recorded id, action,
    target, by)`` for each operator action its operations log holds under that id, or
    under ``action_id:TASK`` (a bulk action records one per task)."""
    prefix = f"{action_id}:"
    rows = models.Entry.objects.filter(
        session_id=session_id, conversation_id=operations_log_id(session_id)
    ).filter(Q(payload__action_id=action_id) | Q(payload__action_id__startswith=prefix))
    return [
        (str(payload["action_id"]), kind, str(payload.get("target", "")),
         str(payload.get("by", "")))
        for kind, payload in rows.order_by("seq", "ordinal").values_list("kind", "payload")
    ]


def tasks_committed(session_id: str, seq: int) -> list[str]:
    """The tasks commit ``seq`` of the session created or changed, those it created
    first (none when retention has removed that commit)."""
    return [item["id"] for commit in process_kernel().commits_after(session_id, seq - 1, 1)
            if commit.seq == seq for item in commit.summary if item.get("type") == "task"]


def entry_conversation(session_id: str, entry_id: str) -> str:
    """The conversation that ``entry_id`` of ``session_id`` was appended to."""
    found = models.Entry.objects.filter(session_id=session_id, id=entry_id).values_list(
        "conversation_id", flat=True).first()
    if found is None:
        raise UnknownRecord(f"no entry {entry_id} in session {session_id}")
    return str(found)
