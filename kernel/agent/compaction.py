"""Compaction: the older part of a conversation summarized by the model, as a durable
task of its own.

A model request's context is the latest summary entry and the entries after what it
covers (:meth:`kernel.session.Kernel.context`). When a request's context would pass
``threshold`` of its model's window, when the model answers that the context is too
long, or when an operator asks, an ``agent-compaction`` task asks the model to
summarize the oldest entries of the context and commits a :data:`~kernel.records.SUMMARY`
entry naming the first and last entry it covers. The newest entries, worth about
``keep`` of the window, stay as they are. The transcript keeps every entry.

The summary request is tried like a turn's request: an interrupted one is recorded and
sent again, transient errors back off, a background response is polled by its handle,
and its tokens are counted with the conversation's. The summary is written in one commit
with the task's end, so a crash before that commit leaves no summary and a crash after
it leaves exactly one.

The cut never separates a tool call from its result: the entries covered hold every
result of every call they hold. A call with no result yet (its round is under way)
keeps the cut before it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kernel.commit import Draft
from kernel.errors import UnknownRecord
from kernel.records import SUMMARY, Entry
from kernel.registry import Registry
from kernel.run import Run
from kernel.tasks import Transition

from .context import RESPONSE, answers, messages
from .models import (
    ModelProvider,
    ModelRequest,
    ModelResponse,
    Pending,
    PermanentModelError,
    TransientModelError,
)
from .requests import MAX_ATTEMPTS, backoff, record_usage

JSON = Any
COMPACTION = "agent-compaction"
STARTED = "@compaction"
"""The document, one per conversation (keyed by its id), naming the compaction started
on it last, written in the commit that creates that task: a start that expects the
version it read (:func:`start`, and a turn's) is refused when another started since, so
of two asked at once only one runs (a second would summarize the same entries again); a
turn due a compaction while one is under way waits for it (:func:`under_way`)."""
POLL_SECONDS = 1.0
MAX_PASSES = 4
"""Summaries one compaction may commit, one after another, while the context still
passes the threshold (a summary request covers at most ``cover`` of the window)."""
DEFAULT_KEEP_TOKENS = 4_000
"""Kept as they are by a compaction of a model whose window is not configured."""

SUMMARY_PROMPT = (
    "You compact a conversation between a user and an assistant that calls tools. "
    "Write a summary that lets the assistant carry on without the messages it replaces: "
    "the user's goals and instructions, decisions made, facts learned from tool results "
    "(with the identifiers, numbers and names they gave), what was done and what is still "
    "open. If the conversation opens with an earlier summary, fold it in. Answer with "
    "the summary only."
)
SUMMARY_ASK = "Summarize the conversation above as instructed."


def estimate_tokens(value: JSON) -> int:
    """A rough count of tokens in ``value`` (about four characters each): what the
    threshold is measured in. A tokenizer per model would be exact; the margin below the
    window absorbs the difference."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":"))) // 4 + 1


@dataclass(frozen=True)
class Compaction:
    """When a conversation is compacted, per model.

    ``windows``: each model's context window in tokens (a model without one is
    compacted only when it answers that the context is too long, or on request).
    ``threshold``: a request whose context would pass this share of the window is
    preceded by a compaction. ``keep``: the share of the window the newest entries keep
    unsummarized. ``cover``: the most of the window one summary request covers."""

    windows: Mapping[str, int] = field(default_factory=dict)
    threshold: float = 0.8
    keep: float = 0.3
    cover: float = 0.6

    def __post_init__(self) -> None:
        if not 0 < self.keep < self.threshold <= 1 or not 0 < self.cover <= 1:
            raise ValueError("compaction: 0 < keep < threshold <= 1 and 0 < cover <= 1")
        for model, window in self.windows.items():
            if not isinstance(window, int) or window <= 0:
                raise ValueError(f"compaction: the window of {model!r} is a positive integer")

    def due(self, model: str, context: list[JSON], tools: list[JSON]) -> bool:
        window = self.windows.get(model)
        return window is not None and estimate_tokens([context, tools]) > window * self.threshold

    def keep_tokens(self, model: str) -> int:
        window = self.windows.get(model)
        return int(window * self.keep) if window else DEFAULT_KEEP_TOKENS

    def cover_tokens(self, model: str) -> int | None:
        window = self.windows.get(model)
        return int(window * self.cover) if window else None


@dataclass(frozen=True)
class Plan:
    """What one summary request covers: ``covered`` (an earlier summary first, if the
    context opens with one) and the range the new summary names."""

    covered: list[Entry]
    covers: JSON


def ref(entry: Entry) -> JSON:
    return {"id": entry.id, "seq": entry.seq, "ordinal": entry.ordinal}


def plan(context: list[Entry], keep_tokens: int, cover_tokens: int | None = None) -> Plan | None:
    """The oldest part of ``context`` to summarize, leaving the newest entries worth
    about ``keep_tokens`` (always the newest one) and covering at most ``cover_tokens``;
    None when no cut is possible. The cut never falls between a call and its result."""
    earlier = context[0] if context and context[0].kind == SUMMARY else None
    body = context[1:] if earlier is not None else context
    if len(body) < 2:
        return None
    sizes = [estimate_tokens(e.payload) for e in body]
    # body[want:] stays: the newest entry always, and older ones while they fit.
    want, kept = len(body) - 1, sizes[-1]
    while want > 1 and kept + sizes[want - 1] <= keep_tokens:
        want -= 1
        kept += sizes[want]
    if cover_tokens is not None:
        covering = estimate_tokens(earlier.payload) if earlier is not None else 0
        for index in range(want):
            covering += sizes[index]
            if covering > cover_tokens:
                want = max(index, 1)
                break
    cut = _cut_at_or_before(body, want)
    if cut == 0:
        return None
    covered = body[:cut]
    first = earlier.payload["covers"]["first"] if earlier is not None else ref(covered[0])
    return Plan(
        [earlier, *covered] if earlier is not None else covered,
        {"first": first, "last": ref(covered[-1])},
    )


def _cut_at_or_before(body: list[Entry], want: int) -> int:
    """The largest cut ``c <= want`` such that every call in ``body[:c]`` has its result
    there too; a call with no result is open while no later response followed it."""
    result_at = answers(body)
    responses = [i for i, e in enumerate(body) if e.kind == RESPONSE]
    last_response = responses[-1] if responses else -1
    valid, reach = 0, -1
    for cut in range(1, want + 1):
        entry = body[cut - 1]
        if entry.kind == RESPONSE:
            for place, _ in enumerate(entry.payload.get("tool_calls") or []):
                at = result_at.get((entry.id, place))
                if at is None:
                    # Answered never (a lost call: the model was told so) or not yet.
                    at = len(body) if cut - 1 == last_response else -1
                reach = max(reach, at)
        if reach < cut:
            valid = cut
    return valid


def started(draft: Draft, conversation_id: str, task_id: str, reason: str, by: str,
            *, expected_version: int | None = None) -> None:
    """Name ``task_id``, created in ``draft``, as the compaction started on
    ``conversation_id`` last (:data:`STARTED`); with ``expected_version``, the commit is
    refused (``DocumentConflict``) if another started since that version was read."""
    draft.update_document(STARTED, conversation_id, {
        "op": "set", "path": [], "value": {"task": task_id, "reason": reason, "by": by}},
        expected_version=expected_version)


def under_way(run: Run, conversation_id: str) -> tuple[str | None, int]:
    """The compaction of ``conversation_id`` started last, if it has not ended, and the
    version of :data:`STARTED` it was read at (what a start made after this read
    expects)."""
    record, version = run.versioned_document(STARTED, conversation_id)
    task_id = (record or {}).get("task")
    if task_id is None:
        return None, version
    try:
        ended = run.outcomes([task_id])[task_id] is not None
    except UnknownRecord:  # no longer kept: it ended long ago
        ended = True
    return (None if ended else task_id), version


def start(draft: Draft, conversation_id: str, input: JSON, *, expected_version: int) -> str:
    """An ``agent-compaction`` task of ``conversation_id`` created in ``draft`` (``input``
    as :func:`register_compaction` says), refused when a compaction of it started after
    :data:`STARTED` was at ``expected_version`` (0: never written)."""
    task_id = draft.create_task(COMPACTION, {**input, "conversation_id": conversation_id})
    started(draft, conversation_id, task_id, str(input.get("reason", "operator")),
            str(input.get("by", draft.actor)), expected_version=expected_version)
    return task_id


def register_compaction(
    registry: Registry,
    models: Mapping[str, ModelProvider],
    compaction: Compaction,
    default_model: str,
    tools: Callable[[], list[JSON]] = list,
) -> None:
    """Add the ``agent-compaction`` task kind. Its input: ``conversation_id``, and
    ``model`` (the model that summarizes, whose window is measured; the default one
    if absent), ``reason`` (``threshold``, ``overflow``, ``operator``) and ``by``.
    ``tools``: the tool schemas a turn sends with its context, measured with it between
    passes as the turn measures its request: a context that fits only without them is
    still due."""

    registry.document(STARTED)

    @registry.task(COMPACTION, queue="brain")
    class Compact:
        initial = "summarize"
        max_restarts = MAX_ATTEMPTS

        def summarize(self, run: Run) -> Transition:
            conversation = run.input["conversation_id"]
            model = run.input.get("model") or default_model
            provider = models.get(model)
            if provider is None:
                return run.fail(f"unknown model {model!r}")
            checkpoint = run.checkpoint
            if checkpoint.get("in_flight") and checkpoint.get("attempt", 0) >= MAX_ATTEMPTS:
                return run.fail(
                    f"the summary request was interrupted {checkpoint['attempt']} times"
                )
            context = run.context(conversation)
            passes = checkpoint.get("passes", 0)
            if passes and not compaction.due(model, messages(context), tools()):
                return run.succeed(done(checkpoint))
            found = plan(context, compaction.keep_tokens(model), compaction.cover_tokens(model))
            if found is None:
                return run.succeed({**done(checkpoint), "note": "nothing to summarize"})
            attempt = checkpoint.get("attempt", 0) + 1
            # Under way: an interrupted request is found on re-entry and sent again.
            run.commit(checkpoint={"in_flight": attempt, "attempt": attempt,
                                   "covers": found.covers})
            request = ModelRequest(
                model,
                [{"role": "system", "content": SUMMARY_PROMPT}, *messages(found.covered),
                 {"role": "user", "content": SUMMARY_ASK}],
                purpose="compaction",
            )
            try:
                answer = provider.generate(request, lambda text: None)
            except TransientModelError as exc:
                if attempt >= MAX_ATTEMPTS:
                    return run.fail(f"the summary request kept failing: {exc}")
                return run.sleep(backoff(attempt, exc), then="summarize",
                                 checkpoint={"in_flight": None, "last_error": str(exc)})
            except PermanentModelError as exc:
                return run.fail(f"the summary request was refused: {exc}")
            if isinstance(answer, Pending):
                return run.next("poll", {"handle": answer.handle, "in_flight": None,
                                         "polls": 0})
            return summarized(run, answer)

        def poll(self, run: Run) -> Transition:
            model = run.input.get("model") or default_model
            try:
                answer = models[model].poll(run.checkpoint["handle"])
            except TransientModelError as exc:
                errors = run.checkpoint.get("poll_errors", 0) + 1
                if errors >= MAX_ATTEMPTS:
                    return run.fail(f"polling the summary kept failing: {exc}")
                return run.sleep(backoff(errors, exc), then="poll",
                                 checkpoint={"poll_errors": errors, "last_error": str(exc)})
            except PermanentModelError as exc:
                return run.fail(f"the summary request was refused: {exc}")
            if answer is None:
                polls = run.checkpoint.get("polls", 0) + 1
                return run.sleep(POLL_SECONDS, then="poll", checkpoint={"polls": polls})
            return summarized(run, answer)

    def summarized(run: Run, answer: ModelResponse) -> Transition:
        """The summary entry, the request's usage and the next step, in one commit."""
        conversation = run.input["conversation_id"]
        checkpoint = run.checkpoint
        covers = checkpoint["covers"]
        entry = run.append(conversation, SUMMARY, {
            "text": answer.text,
            "covers": covers,
            "task": run.task_id,
            "reason": run.input.get("reason", "operator"),
            "usage": dict(answer.usage),
        })
        record_usage(run, conversation, answer.usage, run.input.get("model") or default_model)
        made = [*checkpoint.get("summaries", []), entry]
        passes = checkpoint.get("passes", 0) + 1
        state = {"summaries": made, "passes": passes, "in_flight": None, "attempt": 0,
                 "handle": None, "covers": None}
        if passes < MAX_PASSES and run.input.get("reason") != "operator":
            return run.next("summarize", state)  # again if the context is still too long
        return run.succeed(done(state))


def done(checkpoint: JSON) -> JSON:
    return {"summaries": checkpoint.get("summaries", [])}
