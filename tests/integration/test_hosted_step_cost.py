"""What a step of a hosted Pydantic AI agent costs on Postgres, counted: the statements
and pipelines of a turn of 4 steps and of one of 8, the same agent (a model that calls
a no-op tool until its last step, then answers); their difference is 4 steps' cost. A
step's commits are each one statement (``CommitKind.NEXT_WRITING``): the response with
the unsafe call's intent, then its result; with the tool safe, the response with the
previous call's result. Nothing is read between them."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from controlplane.storage import PostgresStorage
from kernel import (
    Draft,
    Kernel,
    ManualClock,
    Registry,
    Scheduler,
    SessionHandle,
    SubmissionStatus,
)
from kernel.agent import submit
from kernel.hosts.pydantic_ai import SAFE, KernelDurability, register_agent

from .round_trips import counting_pipelines, log_is_whole

pytestmark = pytest.mark.django_db(transaction=True)


def agent_of(steps: int, safe: bool,
             during: Callable[[], None] | None = None) -> Agent[None, str]:
    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        prompted = max(i for i, m in enumerate(messages) if m.kind == "request" and any(
            p.part_kind == "user-prompt" for p in m.parts))  # this turn's own steps
        step = sum(1 for m in messages[prompted:] if m.kind == "response")
        if step < steps - 1:
            return ModelResponse(parts=[ToolCallPart("noop", {}, tool_call_id=f"c{step}")])
        return ModelResponse(parts=[TextPart("done")])

    agent = Agent(FunctionModel(respond), name="steps", capabilities=[KernelDurability()])

    @agent.tool_plain(metadata=SAFE if safe else None)
    def noop() -> str:
        if during is not None:
            during()
        return "ok"

    return agent


def a_conversation(registry: Registry) -> tuple[Kernel, SessionHandle, str]:
    """A kernel on Postgres with ``registry``, a session and a conversation in it."""
    kernel = Kernel(PostgresStorage(), registry, ManualClock())
    handle = kernel.create_session()
    draft = Draft()
    conversation = draft.create_conversation()
    handle.commit(draft)
    return kernel, handle, conversation


def turn_cost(steps: int, safe: bool) -> tuple[int, int]:
    """The statements and pipelines of a worker running one turn of ``steps`` steps."""
    registry = Registry()
    register_agent(registry, "steps", agent_of(steps, safe))
    kernel, handle, conversation = a_conversation(registry)
    submitted = submit(handle, conversation, {"text": "go", "agent": "steps"}, "r1")
    assert submitted.submission is not None
    with counting_pipelines() as pipelines, CaptureQueriesContext(connection) as captured:
        Scheduler(kernel, "w").run_until_idle()
    stored = kernel.storage.submission(submitted.submission.id)
    assert stored is not None and stored.status is SubmissionStatus.ANSWERED
    log_is_whole(kernel, handle.id)
    responses = [e for e in kernel.entries(conversation) if e.kind == "model_response"]
    assert len(responses) == steps
    return len(captured), pipelines[0]


@pytest.mark.parametrize(("safe", "statements"), [(False, 2), (True, 1)])
def test_a_step_is_one_statement_per_commit_and_reads_nothing(
    safe: bool, statements: int,
) -> None:
    short_statements, short_pipelines = turn_cost(4, safe)
    long_statements, long_pipelines = turn_cost(8, safe)
    assert (long_statements - short_statements) == 4 * statements, (
        short_statements, long_statements)
    assert long_pipelines == short_pipelines, (short_pipelines, long_pipelines)


def test_a_document_moved_by_another_commit_is_read_again() -> None:
    """The turn's copy of its usage document is stale once another commit writes it:
    the next step's commit is built from what the database holds, and counts right."""
    registry = Registry()
    kernel, handle, conversation = a_conversation(registry)
    key = f"conversation:{conversation}"

    def meddle() -> None:  # another writer of the same document, between two steps
        other = Draft(actor="user:other")
        other.update_document("agent-usage", key,
                              {"op": "incr", "path": ["models", "x", "input_tokens"],
                               "value": 1})
        kernel.open(handle.id).commit(other)
        kernel.storage.thread_exit()  # the tool's thread's connection

    register_agent(registry, "steps", agent_of(4, True, meddle))
    submitted = submit(handle, conversation, {"text": "go", "agent": "steps"}, "r1")
    assert submitted.submission is not None
    Scheduler(kernel, "w").run_until_idle()
    stored = kernel.storage.submission(submitted.submission.id)
    assert stored is not None and stored.status is SubmissionStatus.ANSWERED
    usage = kernel.document(handle.id, "agent-usage", key)
    responses = [e for e in kernel.entries(conversation) if e.kind == "model_response"]
    counted = sum(e.payload["usage"]["input_tokens"] for e in responses)
    assert usage["models"][""]["input_tokens"] == counted
    assert usage["models"]["x"]["input_tokens"] == 3  # one per tool call
    log_is_whole(kernel, handle.id)


def general_commits(kernel: Kernel, fn: Callable[[], object]) -> int:
    """How many commits ``fn`` sent the general way (two round trips, read under lock)."""
    storage = kernel.storage
    assert isinstance(storage, PostgresStorage)
    general = storage.commit
    counted = 0

    def counting(*args: object, **kwargs: object) -> object:
        nonlocal counted
        counted += 1
        return general(*args, **kwargs)  # type: ignore[arg-type]

    storage.commit = counting  # type: ignore[assignment,method-assign]
    try:
        fn()
    finally:
        del storage.commit
    return counted


@pytest.mark.parametrize("safe", [False, True])
def test_only_the_end_of_a_turn_is_a_general_commit_its_first_step_included(safe: bool) -> None:
    """The first step writes documents the lease has not written (the conversation's
    usage): their heads are read once, or found not yet written, and the step is still
    one statement; in the first turn of a conversation and in the next."""
    registry = Registry()
    register_agent(registry, "steps", agent_of(3, safe))
    kernel, handle, conversation = a_conversation(registry)
    for request in ("r1", "r2"):
        submitted = submit(handle, conversation, {"text": "go", "agent": "steps"}, request)
        assert submitted.submission is not None
        assert general_commits(kernel, Scheduler(kernel, "w").run_until_idle) == 1, request
        stored = kernel.storage.submission(submitted.submission.id)
        assert stored is not None and stored.status is SubmissionStatus.ANSWERED
    usage = kernel.document(handle.id, "agent-usage", f"conversation:{conversation}")
    responses = [e for e in kernel.entries(conversation) if e.kind == "model_response"]
    assert len(responses) == 6
    assert usage["models"][""]["input_tokens"] == sum(
        e.payload["usage"]["input_tokens"] for e in responses)
    log_is_whole(kernel, handle.id)


def test_a_document_created_after_the_lease_found_it_unwritten_is_written_as_a_new_version(
) -> None:
    """Another commit creates the usage document between the lease's look (not written)
    and its first step's commit: the step's statement, which would create it, is refused,
    and the commit goes the general way on what the database holds."""
    registry = Registry()
    register_agent(registry, "steps", agent_of(2, False))
    kernel, handle, conversation = a_conversation(registry)
    key = f"conversation:{conversation}"
    storage = kernel.storage
    assert isinstance(storage, PostgresStorage)
    look = storage.document_head

    def look_then_meddle(session_id: str, kind: str, key_: str) -> object:
        found = look(session_id, kind, key_)
        if kind == "agent-usage" and found is None:
            other = Draft(actor="user:other")
            other.update_document(kind, key_, {"op": "incr",
                                               "path": ["models", "x", "input_tokens"],
                                               "value": 5})
            kernel.open(handle.id).commit(other)
        return found

    storage.document_head = look_then_meddle  # type: ignore[assignment,method-assign]
    submitted = submit(handle, conversation, {"text": "go", "agent": "steps"}, "r1")
    assert submitted.submission is not None
    Scheduler(kernel, "w").run_until_idle()
    del storage.document_head
    stored = kernel.storage.submission(submitted.submission.id)
    assert stored is not None and stored.status is SubmissionStatus.ANSWERED
    usage = kernel.document(handle.id, "agent-usage", key)
    responses = [e for e in kernel.entries(conversation) if e.kind == "model_response"]
    assert usage["models"]["x"]["input_tokens"] == 5
    assert usage["models"][""]["input_tokens"] == sum(
        e.payload["usage"]["input_tokens"] for e in responses)
    log_is_whole(kernel, handle.id)
