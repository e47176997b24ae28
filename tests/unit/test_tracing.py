"""The kernel's spans on the reference storage: one turn's tree (submission, phases,
commits, model requests with the GenAI attributes, tool calls), the context kept with
each task, and nothing at all while no tracer provider is installed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from kernel import tracing
from kernel.agent import ModelRequest, ModelResponse, PermanentModelError, ScriptedProvider

from .agent_world import World, two_rounds


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use(provider)
    try:
        yield exporter
    finally:
        tracing.use(None)
        provider.shutdown()


def parent_of(span: ReadableSpan, finished: list[ReadableSpan]) -> ReadableSpan | None:
    if span.parent is None:
        return None
    return next((s for s in finished if s.context.span_id == span.parent.span_id), None)


def test_a_turn_is_one_tree_under_its_submission(spans: InMemorySpanExporter) -> None:
    world = World(two_rounds())
    kernel, handle, conversation, submitted = world.start()
    world.run()
    finished = list(spans.get_finished_spans())
    (submit,) = [s for s in finished if s.name == "submit"]
    assert submit.parent is None
    assert submit.attributes["kernel.submission.outcome"] == "placed"
    assert {s.context.trace_id for s in finished if s.name != "commit" or s.parent} == {
        submit.context.trace_id}

    turn = next(t for t in kernel.storage.session_tasks(handle.id) if t.kind == "agent-turn")
    assert tracing.trace_id(turn.trace) == format(submit.context.trace_id, "032x")
    turn_phases = [s for s in finished if s.name.startswith("phase agent-turn.")]
    assert {s.name for s in turn_phases} >= {"phase agent-turn.prepare",
                                             "phase agent-turn.request",
                                             "phase agent-turn.finish"}
    assert all(parent_of(s, finished) is submit for s in turn_phases)

    chats = [s for s in finished if s.name == "chat scripted"]
    assert len(chats) == 2
    assert all(parent_of(c, finished).name == "phase agent-turn.request" for c in chats)
    first, second = sorted(chats, key=lambda s: s.start_time)
    assert first.attributes["gen_ai.operation.name"] == "chat"
    assert first.attributes["gen_ai.request.model"] == "scripted"
    assert (first.attributes["gen_ai.usage.input_tokens"],
            first.attributes["gen_ai.usage.output_tokens"]) == (10, 4)
    assert tuple(first.attributes["gen_ai.response.finish_reasons"]) == ("tool_calls",)
    assert (second.attributes["gen_ai.usage.input_tokens"],
            second.attributes["gen_ai.usage.output_tokens"]) == (20, 8)

    # The tool call (a task of its own kind) is a child of the phase that called it, and
    # the batch task it runs is a child of the call.
    (call,) = [s for s in finished if s.name == "execute_tool send_notices"]
    assert call.attributes["gen_ai.tool.call.id"] == "call_1"
    assert parent_of(call, finished).name == "phase agent-tool.call"
    tool_phase = parent_of(call, finished)
    assert parent_of(tool_phase, finished) is parent_of(first, finished)  # spawned there
    batch = [s for s in finished if s.name == "phase fake-batch.send"]
    assert [parent_of(s, finished) for s in batch] == [call]

    # Every commit of the turn is inside the span that made it; only the test's set-up
    # (the session, the conversation) committed outside any.
    commits = [s for s in finished if s.name == "commit"
               and s.context.trace_id == submit.context.trace_id]
    assert all(parent_of(c, finished) is not None for c in commits)
    roots = [s for s in finished if s.parent is None]
    assert sorted(s.name for s in roots) == ["commit", "submit"]  # the conversation's
    assert {parent_of(c, finished).name for c in commits} >= {"submit",
                                                              "phase agent-turn.request"}


def test_a_refused_model_request_and_the_failed_turn_are_failed_spans(
    spans: InMemorySpanExporter,
) -> None:
    def refuse(request: ModelRequest) -> ModelResponse:
        raise PermanentModelError("model server answered 400")

    world = World(ScriptedProvider(refuse))
    world.start()
    world.run()
    finished = list(spans.get_finished_spans())
    (chat,) = [s for s in finished if s.name == "chat scripted"]
    assert chat.status.status_code is StatusCode.ERROR
    assert chat.attributes["error.type"] == "PermanentModelError"
    (finish,) = [s for s in finished if s.name == "phase agent-turn.finish"]
    assert finish.status.status_code is StatusCode.ERROR
    assert finish.attributes["kernel.task.outcome"] == "failed"
    (request,) = [s for s in finished if s.name == "phase agent-turn.request"]
    assert request.status.status_code is not StatusCode.ERROR  # it decided to finish


def test_without_a_provider_nothing_is_recorded_or_kept() -> None:
    assert not tracing.active()
    assert tracing.carrier() is None and tracing.current_trace_id() is None
    with tracing.span("anything", {"a": 1}) as span:
        assert span is tracing.OFF
        span.set({"b": 2})
    world = World(two_rounds())
    kernel, handle, _, _ = world.start()
    world.run()
    assert {t.trace for t in kernel.storage.session_tasks(handle.id)} == {None}


def test_a_kept_context_names_its_trace() -> None:
    kept = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
    assert tracing.trace_id(kept) == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert tracing.trace_id({"traceparent": "00-" + "0" * 32 + "-00f067aa0ba902b7-01"}) is None
    assert tracing.trace_id(None) is None and tracing.trace_id({"traceparent": "x"}) is None
