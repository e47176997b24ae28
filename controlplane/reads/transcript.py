"""A session's conversations as people read them: who said what, which tools the model
called with what and what came back, and what it cost.

Entries are the record (:mod:`kernel.agent.context` names their kinds); the tool tasks
(``agent-tool``) add what an entry does not hold: the replay policy the call was
committed with, how long it took, whether it is still running or waits on an operator.
Usage is per model response (its entry's ``usage``); cost only for models whose prices
are configured (``settings.MODEL_PRICES``, per million tokens).
"""

from __future__ import annotations

import json
import operator
from dataclasses import dataclass, field
from datetime import datetime
from functools import reduce
from typing import Any

from django.conf import settings
from django.db.models import FloatField, Q, Sum
from django.db.models.expressions import RawSQL
from django.db.models.fields.json import KT
from django.db.models.functions import Cast, Coalesce

from controlplane import models
from controlplane.process.kernel import process_kernel
from controlplane.reads import approvals, sessions, tasks
from kernel.agent.compaction import COMPACTION
from kernel.agent.context import INTERRUPTION, RESPONSE, TOOL_RESULT, USER, answers
from kernel.agent.requests import USAGE, conversation_key
from kernel.artifacts import is_reference, is_stand_in
from kernel.commit import replay as replay_document
from kernel.records import SUBMISSION_ID, SUMMARY, TASK_ID, Entry, Status, Submission, id_kind
from kernel.records import Conversation as ConversationRecord

TOOL_KIND = "agent-tool"
TURN_KIND = "agent-turn"
HOSTED_PREFIX = "agent:"
"""A registered framework agent's turn (``agent:<name>``): it runs its tools itself (or
in a task of its own on the hands queue) and records their replay policy and duration in
the result entry; a call cut mid-way makes the turn (or that task) wait on
``resolution:<call id>:<attempt>``."""


def pretty(value: Any) -> str:
    """JSON for people: indented, keys in their order, non-ASCII kept."""
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


@dataclass
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float | None = None
    """In the prices' currency; None when a model without prices took part."""

    def add(self, other: Usage) -> None:
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.cost = None if self.cost is None or other.cost is None else self.cost + other.cost

    @property
    def total(self) -> int:
        return self.input_tokens + self.output_tokens


def usage_of(raw: Any, model: str | None) -> Usage | None:
    if not isinstance(raw, dict) or not raw:
        return None
    found = Usage(int(raw.get("input_tokens") or 0), int(raw.get("output_tokens") or 0))
    prices = settings.MODEL_PRICES.get(model or "")
    if prices:
        found.cost = (found.input_tokens * float(prices.get("input", 0))
                      + found.output_tokens * float(prices.get("output", 0))) / 1_000_000
    return found


@dataclass
class ToolCard:
    """One tool call and what became of it."""

    call_id: str
    name: str
    arguments: str
    """Formatted JSON."""
    state: str = "running"
    """``running``, ``approval`` (waits for an operator's approval), ``succeeded``,
    ``error``, ``interrupted``, ``cancelled`` (with what it had done by then),
    ``uncertain`` (waits on an operator) or ``lost`` (its task ended without a result)."""
    result: str | None = None
    error: str | None = None
    partial: str | None = None
    replay: str | None = None
    seconds: float | None = None
    task_id: str | None = None
    pending: approvals.PendingApproval | None = None
    """The approval it waits for (state ``approval``): what the operator decides on."""
    decided: dict[str, Any] | None = None
    """The decision its gate recorded: who, why, approve/deny/timeout, edited or not."""
    artifact: dict[str, Any] | None = None
    """Its result stored as an artifact: the reference (digest, bytes, excerpt)."""


@dataclass
class Item:
    """One entry of a conversation, shaped for its kind."""

    entry: Entry
    kind: str
    """``user``, ``model``, ``summary``, ``interruption``, ``operation`` or ``other``."""
    text: str = ""
    tools: list[ToolCard] = field(default_factory=list)
    usage: Usage | None = None
    model: str | None = None
    raw: str = ""
    """Formatted JSON of an entry of another kind."""
    apart: list[dict[str, Any]] = field(default_factory=list)
    """The stand-ins of its payload's values stored apart as artifacts (the whole
    payload's, or its fields'): the page links each, and shows their beginnings."""
    target: str | None = None
    """An operation's target: a task, or a submission (what ``resubmit`` acts on)."""

    @property
    def targets_task(self) -> bool:
        return self.target is not None and id_kind(self.target) == TASK_ID

    @property
    def targets_submission(self) -> bool:
        return self.target is not None and id_kind(self.target) == SUBMISSION_ID


@dataclass(frozen=True)
class Conversation:
    id: str
    operations: bool
    fork_of: str | None
    items: list[Item]
    usage: Usage | None
    shown: int
    total: int
    """How many entries its transcript has, counted up to a bound (``more``: past it)."""
    more: bool = False
    newest: str | None = None
    """The id of its newest entry: what an operator's compaction names as seen."""
    oldest: str | None = None
    """The id of the oldest entry shown: the page of earlier entries ends before it."""
    own_history_agent: str | None = None
    """The framework agent that answers it and keeps its own history (no compaction
    here: :func:`controlplane.reads.sessions.own_history_agent`)."""
    pruned_upto: int = 0
    """When it shows no entry and retention removed its session's history from its
    creation on: up to which commit (its entries may have gone with it)."""


def _tool_tasks(session_id: str, asking: list[Entry], viewed: str,
                conversations: set[str]) -> dict[tuple[str, str], Any]:
    """The tool tasks of the calls these responses make, and the approval tasks of
    hosted agents' calls, by the response entry that made the call and its call id.

    Only tasks made in ``conversations`` (the transcript's) count, those of ``viewed``
    first: a branch makes the calls of the response it starts from again, under the same
    ids, in its fork. A call's task is made after the response that asked for it: the
    read is a range of the session's newest tasks, however many calls came before. A
    native tool task names its response; for a task that names none, where a model
    numbers its calls per response (one id in several responses), each call takes the
    earliest task of its id made since its response (and, where both name one, by its
    turn) and before the next response that makes a call of that id."""
    calls = sorted({str(c.get("id")) for e in asking for c in _calls(e.payload)})
    ids = models.Task.objects.filter(
        session_id=session_id, created_seq__gte=min(e.seq for e in asking),
        kind__in=approvals.KINDS, input__call__id__in=calls,
        input__conversation_id__in=sorted(conversations)).values_list("id", flat=True)
    by_call: dict[str, list[Any]] = {}
    for task in sorted(tasks.find_ids(list(ids)), key=lambda t: (
            (t.input or {}).get("conversation_id") != viewed, t.created_seq, t.id)):
        call = (task.input or {}).get("call") or {}
        if call.get("id"):
            by_call.setdefault(str(call["id"]), []).append(task)
    asked: dict[str, list[Entry]] = {}
    for entry in asking:
        for call_id in dict.fromkeys(str(c.get("id")) for c in _calls(entry.payload)):
            asked.setdefault(call_id, []).append(entry)
    found: dict[tuple[str, str], Any] = {}
    for call_id, entries in asked.items():
        left = by_call.get(call_id, [])
        for n, entry in enumerate(entries):
            turn = entry.payload.get("turn")
            until = entries[n + 1].seq if n + 1 < len(entries) else None
            for i, task in enumerate(left):
                named = (task.input or {}).get("response")
                mine = named == entry.id if named else task.created_seq >= entry.seq and (
                    until is None or task.created_seq < until or until == entry.seq)
                if mine and (turn is None or task.parent_id in (None, turn)):
                    found[(entry.id, call_id)] = left.pop(i)
                    break
    return found


def _commit_times(session_id: str, seqs: set[int]) -> dict[int, datetime]:
    if not seqs:
        return {}
    return dict(models.Commit.objects.filter(session_id=session_id, seq__in=seqs)
                .values_list("seq", "at"))


def _turn_models(session_id: str, task_ids: set[str]) -> dict[str, str]:
    """The model of each of these turns and compaction tasks."""
    found = models.Task.objects.filter(
        session_id=session_id, id__in=sorted(task_ids), kind__in=[TURN_KIND, COMPACTION]
    ).values_list("id", "checkpoint", "input")
    return {task_id: _model(checkpoint, input) or "" for task_id, checkpoint, input in found}


def _model(checkpoint: Any, input: Any) -> str | None:
    """The model a turn or compaction task asks: the one it settled on once started, else
    the one its input names (none: the default one)."""
    return (checkpoint or {}).get("model") or (input or {}).get("model") or None


def conversation_model(session_id: str, conversation_id: str) -> str | None:
    """The model the conversation's latest turn asks (None: it has no turn naming one, so
    the default one): what a compaction of it measures against and summarizes with."""
    found = models.Task.objects.filter(
        session_id=session_id, kind=TURN_KIND, input__conversation_id=conversation_id,
    ).order_by("-created_seq", "-id").values_list("checkpoint", "input").first()
    return None if found is None else _model(*found)


def _uncertain_calls(turn_ids: set[str]) -> set[str]:
    """The calls that hosted turns, or the tasks that run their calls on the hands queue
    (named in the turn's checkpoint under ``hands``), wait on an operator for, by call id."""
    found = set()
    handed: list[str] = []
    for turn in tasks.find_ids(sorted(turn_ids)):
        handed += [str(call.get("task")) for call in
                   ((turn.task.checkpoint or {}).get("hands") or {}).values()]
        found |= _resolving(turn)
    for task in tasks.find_ids(handed):
        found |= _resolving(task)
    return found


def _resolving(found: Any) -> set[str]:
    """The call a task waits on an operator's resolution for (``resolution:<call id>:...``)."""
    signal = found.task.waits_on.signal if found.task.status is Status.WAITING else None
    if not signal or not signal.startswith("resolution:"):
        return set()
    # ``<call id>#<n>``: the n-th call of a turn under an id its responses reuse; its
    # card is the one of that id with no result yet.
    return {signal.split(":")[1].split("#")[0]}


def _card(call: dict[str, Any], result: dict[str, Any] | None, task: Any | None,
          times: dict[int, datetime], waiting: set[str]) -> ToolCard:
    card = ToolCard(str(call.get("id", "")), str(call.get("name", "")),
                    pretty(call.get("arguments")))
    if result is not None:  # a hosted turn's own calls record these in their result
        card.replay = result.get("replay")
        card.seconds = result.get("seconds")
    if card.call_id in waiting:
        card.state = "uncertain"
    if task is not None:
        card.task_id = task.id
        intent = (task.checkpoint or {}).get("intent") or {}
        card.replay = intent.get("replay")
        if task.status is Status.TERMINAL and task.created_seq in times \
                and task.updated_seq in times:
            card.seconds = (times[task.updated_seq] - times[task.created_seq]).total_seconds()
        child = (task.checkpoint or {}).get("child")
        if task.id in waiting or child in waiting:
            card.state = "uncertain"
        card.pending = approvals.shown(task)
        if card.pending is not None:
            card.state = "approval"
        card.decided = (task.checkpoint or {}).get("approved")
        if task.kind == approvals.TASK_KIND and task.status is Status.TERMINAL:
            card.decided = task.outcome.get("result") if task.outcome else None
    # A call that runs as a task of its own kind commits no intent: its tool's policy.
    card.replay = card.replay or process_kernel().registry.tool_replay.get(card.name)
    if result is not None:
        card.decided = result.get("approval") or card.decided
        if result.get("cancelled"):
            card.state = "cancelled"
            card.error = f"cancelled by {result.get('by')}: {result.get('reason')}"
            card.partial = None if result.get("partial") is None else pretty(result["partial"])
        elif result.get("interrupted"):
            card.state = "interrupted"
            card.partial = None if result.get("partial") is None else str(result["partial"])
            if result.get("error"):
                card.error = str(result["error"])
        elif "error" in result:
            card.state = "error"
            card.error = str(result["error"])
            if result.get("result") is not None:
                card.result = pretty(result["result"])
        else:
            card.state = "succeeded"
            card.result = pretty(result.get("result"))
            if is_reference(result.get("result")):
                card.artifact = result["result"]
                card.result = str(result["result"].get("excerpt", ""))
    elif task is not None and task.status is Status.TERMINAL \
            and task.kind != approvals.TASK_KIND:  # decided: the turn goes on with it
        card.state = "lost"
    return card


def _summed(session_id: str, scope: list[Q]) -> Usage | None:
    """The usage of every model response and summary the scope holds, summed in SQL per
    turn or compaction task (a turn's model sets the prices). None when none reported
    usage. Reads every response in the scope: for what no running total covers."""
    per_turn = (
        models.Entry.objects.filter(reduce(operator.or_, scope), kind__in=[RESPONSE, SUMMARY])
        .alias(shape=RawSQL("jsonb_typeof(payload -> 'usage')", ()))
        .filter(shape="object").exclude(payload__usage={})
        .values(turn=Coalesce(KT("payload__turn"), KT("payload__task")))
        .annotate(input=Sum(Cast(KT("payload__usage__input_tokens"), FloatField())),
                  output=Sum(Cast(KT("payload__usage__output_tokens"), FloatField())))
    )
    rows = list(per_turn)
    turn_models = _turn_models(session_id, {str(row["turn"]) for row in rows})
    total: Usage | None = None
    for row in rows:
        used = usage_of({"input_tokens": int(row["input"] or 0),
                         "output_tokens": int(row["output"] or 0)},
                        turn_models.get(str(row["turn"])))
        assert used is not None
        if total is None:
            total = Usage(cost=0.0)
        total.add(used)
    return total


def _per_model(session_id: str, conversation_id: str) -> dict[str, Any] | None:
    """The conversation's own running totals per model (the ``agent-usage`` document its
    requests add to): one read, however long the conversation. None when it has no such
    document (nothing was counted there)."""
    found = process_kernel().storage.document_now(
        session_id, USAGE, conversation_key(conversation_id))
    if found is None:
        return None
    return dict((replay_document(found[1]) or {}).get("models") or {})


def usage_total(session_id: str, conversation_id: str,
                scope: list[Q] | None = None) -> Usage | None:
    """The usage of every model response and summary in the conversation's transcript:
    its own from its running totals, and for a fork its origin's up to the fork point
    summed from those entries (bounded by the fork point, not by the origin's growth
    since). None when no response reported usage. ``scope``: the transcript's
    :func:`~.sessions.transcript_scope`, if the caller has read it already."""
    scope = sessions.transcript_scope(conversation_id) if scope is None else scope
    per_model = _per_model(session_id, conversation_id)
    if per_model is None:  # written before running totals were kept, or no usage yet
        return _summed(session_id, scope)
    total = _summed(session_id, scope[1:]) if len(scope) > 1 else None
    for model, counts in sorted(per_model.items()):
        used = usage_of(counts, model or None)
        if used is None:
            continue
        if total is None:
            total = Usage(cost=0.0)
        total.add(used)
    return total


def _calls(payload: Any) -> list[Any]:
    """A response's tool calls (none when they were stored apart: its link shows them)."""
    calls = payload.get("tool_calls") if isinstance(payload, dict) else None
    return [c for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []


def _apart(payload: Any) -> tuple[Any, list[dict[str, Any]]]:
    """``payload`` as shown, each field stored apart (kernel.large_values) shown by its
    beginning, and the stand-ins of what was stored apart."""
    if not isinstance(payload, dict) or not payload:
        return payload, []
    if is_stand_in(payload):
        return payload, [payload]
    apart = [v for v in payload.values() if is_stand_in(v)]
    if not apart:
        return payload, []
    return {k: v["excerpt"] if is_stand_in(v) else v for k, v in payload.items()}, apart


def _results(shown: list[Entry], later: list[Entry]) -> dict[tuple[str, str], Any]:
    """Each shown call's result, by the response entry that made the call and its call
    id, paired as the model's context pairs them (:func:`kernel.agent.context.answers`)."""
    entries = [*shown, *later]
    return {(response, str(entries[index].payload.get("call_id"))): entries[index].payload
            for (response, _), index in answers(entries).items()}


def _items(session_id: str, conversation_id: str, shown: list[Entry], operations: bool,
           later: list[Entry]) -> list[Item]:
    """``shown`` entries of ``conversation_id``'s transcript as items; a call's result is
    looked for among them and among ``later`` (the results of the calls a page ends with,
    which come after it)."""
    # A tool's result comes after its call: a shown call's result is shown too.
    results = _results(shown, later)
    asking = [e for e in shown if e.kind == RESPONSE and _calls(e.payload)]
    made_in = {conversation_id, *(e.conversation_id for e in shown)}
    tool_tasks = _tool_tasks(session_id, asking, conversation_id, made_in) if asking else {}
    waiting = set()
    if tool_tasks:
        related = [t.id for t in tool_tasks.values()] + [
            (t.checkpoint or {}).get("child") for t in tool_tasks.values()
            if (t.checkpoint or {}).get("child")]
        waiting = {t.id for t in tasks.find_ids(related) if t.waits_on.startswith("signal")}
    times = _commit_times(session_id, {s for t in tool_tasks.values()
                                       for s in (t.created_seq, t.updated_seq)})
    hosted = {str(e.payload.get("turn")) for e in shown if e.kind == RESPONSE
              and "unit" in e.payload and e.payload.get("tool_calls")}
    if hosted:
        waiting |= _uncertain_calls(hosted)
    turn_models = _turn_models(session_id, {
        str(e.payload.get("turn")) for e in shown if e.kind == RESPONSE
        and isinstance(e.payload, dict)}) if not operations else {}
    items = []
    for entry in shown:
        payload, apart = _apart(entry.payload)
        if apart and apart[0] is entry.payload:  # stored apart whole: its beginning
            if entry.kind != TOOL_RESULT:
                items.append(Item(entry, "other", raw=str(payload["excerpt"]), apart=apart))
            continue
        payload = payload if isinstance(payload, dict) else {}
        if operations:
            target = payload.get("target")
            items.append(Item(entry, "operation", raw=pretty(payload),
                              target=str(target) if target else None))
        elif entry.kind == USER:
            items.append(Item(entry, "user", text=str(payload.get("text", ""))))
        elif entry.kind == RESPONSE:
            model = turn_models.get(str(payload.get("turn")))
            items.append(Item(
                entry, "model", text=str(payload.get("text") or ""), model=model,
                usage=usage_of(payload.get("usage"), model),
                tools=[_card(c, results.get((entry.id, str(c.get("id")))),
                             tool_tasks.get((entry.id, str(c.get("id")))), times, waiting)
                       for c in _calls(entry.payload)],
            ))
        elif entry.kind == INTERRUPTION:
            items.append(Item(entry, "interruption", text=str(payload.get("reason", ""))))
        elif entry.kind == SUMMARY and not operations:
            items.append(Item(entry, "summary", text=str(payload.get("text") or ""),
                              usage=usage_of(payload.get("usage"), None)))
        elif entry.kind == TOOL_RESULT:
            continue  # shown on its call's card
        else:
            items.append(Item(entry, "other", raw=pretty(entry.payload)))
        items[-1].apart = apart
    return items


def conversation(session_id: str, record: ConversationRecord, operations: bool, tail: int,
                 counted: int, own_history_agent: str | None = None) -> Conversation:
    """A conversation's last ``tail`` entries as items, how many it has (up to
    ``counted``); its usage over all entries. ``own_history_agent``: the agent that
    keeps its history, read for all the page's conversations at once
    (:func:`controlplane.reads.sessions.own_history_agents`)."""
    conversation_id, fork_of = record.id, record.fork_of
    scope = sessions.transcript_scope(conversation_id, record)
    found = sessions.last_entries(conversation_id, tail, counted, scope)
    shown = found.entries
    total = usage_total(session_id, conversation_id, scope) if not operations else None
    return Conversation(conversation_id, operations, fork_of,
                        _items(session_id, conversation_id, shown, operations, []), total,
                        len(shown),
                        found.total, found.more,
                        shown[-1].id if shown else None, shown[0].id if shown else None,
                        None if operations else own_history_agent)


@dataclass(frozen=True)
class Earlier:
    """A page of a conversation's transcript before an entry the page shows (and after
    one, when it fills the gap between what the page showed and its latest entries)."""

    items: list[Item]
    oldest: str | None
    """The id of its first entry: where the page before it ends."""
    more: bool
    """There are entries before it (after ``after``)."""
    after: str | None = None
    """The entry it starts after, if any: the page before it starts after it too."""


def earlier(session_id: str, conversation_id: str, operations: bool, before: str,
            limit: int, after: str | None = None) -> Earlier:
    """The ``limit`` entries of the conversation's transcript before entry ``before``
    (and after entry ``after``), as items (UnknownRecord if the transcript has no such
    entry). The calls it ends with show their results, which may come after it."""
    page = sessions.entries_before(conversation_id, before, limit, after)
    shown = page.entries
    answered = _results(shown, [])  # by response and call: a call id may be reused
    unanswered = [c for e in shown if e.kind == RESPONSE for c in _calls(e.payload)
                  if (e.id, str(c.get("id"))) not in answered]
    later = sessions.results_after(conversation_id, (shown[-1].seq, shown[-1].ordinal),
                                   len(unanswered)) if unanswered else []
    return Earlier(_items(session_id, conversation_id, shown, operations, later),
                   shown[0].id if shown else None, page.more, after)


@dataclass(frozen=True)
class SubmissionView:
    """A submission as read: its text, where it stands, and the turn that took it."""

    submission: Submission
    text: str
    options: str
    turn_id: str | None
    answer_seq: int | None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.submission, name)


def submissions(session_id: str, found: list[Submission]) -> list[SubmissionView]:
    if not found:
        return []
    turns: dict[str, str] = {}
    for task_id, input in models.Task.objects.filter(  # the turns that took these only
        Q(kind=TURN_KIND) | Q(kind__startswith=HOSTED_PREFIX), session_id=session_id,
        input__submissions__has_any_keys=[s.id for s in found],
    ).order_by("created_seq").values_list("id", "input"):
        for submission_id in (input or {}).get("submissions") or []:
            turns[submission_id] = task_id
    answers = {entry_id: (seq, turn) for entry_id, seq, turn in models.Entry.objects.filter(
        id__in=[s.answer_entry_id for s in found if s.answer_entry_id]
    ).values_list("id", "seq", "payload__turn")}
    views = []
    for s in found:
        given = s.input if isinstance(s.input, dict) else {"text": s.input}
        rest = {k: v for k, v in given.items() if k != "text"}
        seq, turn = answers.get(s.answer_entry_id or "", (None, None))
        views.append(SubmissionView(s, str(given.get("text", "")), pretty(rest) if rest else "",
                                    turn or turns.get(s.id), seq))
    return views
