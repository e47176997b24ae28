"""One agent turn's trace, across real worker processes.

The test process submits (its spans are collected with the SDK's ``InMemorySpanExporter``,
the kernel's spans sent there by :func:`kernel.tracing.use`); two Celery workers, one on
the ``brain`` queue (the turn) and one on ``hands`` (the tool), export theirs with the
SDK's OTLP exporter, as any deployment with ``OTEL_EXPORTER_OTLP_ENDPOINT`` does, to a
collector stand-in (:mod:`tests.otlp_receiver`). The trace context travels with the
tasks (``Task.trace``), not with the Celery messages: the tree is whole because each
task keeps the context it was created in.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from django.test import Client
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from controlplane.dev.processes import wait_for
from kernel import tracing
from tests.integration.clients import client_for
from tests.model_stand_in import SERVED, Completion, ModelStandIn, by_round, models_env
from tests.otlp_receiver import Receiver, otlp_receiver

from .harness import Stack, chaos_stack

pytestmark = [pytest.mark.chaos, pytest.mark.slow]
PROBE = {"id": "call_probe", "name": "probe", "arguments": {"value": "v1"}}


@pytest.fixture
def collected() -> Iterator[InMemorySpanExporter]:
    """This process's kernel spans, in memory."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use(provider)
    try:
        yield exporter
    finally:
        tracing.use(None)
        provider.shutdown()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with otlp_receiver() as running:
        yield running


@pytest.fixture
def traced_stack(tmp_path: Path, transactional_db: None, model: ModelStandIn,
                 receiver: Receiver) -> Iterator[Stack]:
    env = {
        **models_env(model.url),
        "ASSISTANT_TOOL_MODULES": "tests.chaos.agent_tools",
        "AGENT_TOOL_DIR": str(tmp_path),
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_BSP_SCHEDULE_DELAY": "100",  # ms: export soon after each span ends
        "OTEL_SERVICE_NAME": "chaos-worker",
    }
    with chaos_stack(tmp_path, env=env) as running:
        yield running


def test_one_turn_is_one_trace_across_the_workers_that_ran_it(
    traced_stack: Stack, model: ModelStandIn, receiver: Receiver,
    collected: InMemorySpanExporter,
) -> None:
    stack = traced_stack
    model.script = by_round(Completion("", (PROBE,), usage=(12, 5)),
                            Completion("Probed.", usage=(20, 3)))
    brain = stack.worker("brain", queues="brain")
    hands = stack.worker("hands", queues="hands")
    stack.beat()
    session_id, conversation, submission = stack.converse("probe v1")
    stack.wait_answered(submission.id)

    (submit,) = [s for s in collected.get_finished_spans() if s.name == "submit"]
    trace_id = format(submit.context.trace_id, "032x")
    submit_id = format(submit.context.span_id, "016x")
    assert submit.parent is None and submit.attributes["kernel.submission.id"] == submission.id

    def spans() -> list:
        return [s for s in receiver.received() if s.trace_id == trace_id]

    # Each worker exports in batches: wait for the last spans of each (a span is
    # exported once it ends, and these end last on their worker).
    last = {"phase agent-turn.finish", "execute_tool probe", "phase agent-tool.call"}
    wait_for(lambda: last <= {s.name for s in spans()}, "the workers' spans of the turn",
             timeout=30)
    found = spans()
    by_id = {s.span_id: s for s in found}

    def parent(span: object) -> object:
        return by_id.get(span.parent_id)  # type: ignore[attr-defined]

    turn_phases = [s for s in found if s.name.startswith("phase agent-turn.")]
    assert {s.parent_id for s in turn_phases} == {submit_id}  # each a child of the submission
    assert {s.attributes["kernel.task.kind"] for s in turn_phases} == {"agent-turn"}

    chats = [s for s in found if s.name == f"chat {SERVED}"]
    assert len(chats) == 2  # one per round: the tool call, then the answer
    for chat in chats:
        assert parent(chat).name == "phase agent-turn.request"
        assert chat.attributes["gen_ai.operation.name"] == "chat"
        assert chat.attributes["gen_ai.request.model"] == SERVED
        assert chat.attributes["gen_ai.provider.name"] == "openai"
        assert chat.attributes["kernel.model.name"] == "remote"
    assert sorted((c.attributes["gen_ai.usage.input_tokens"],
                   c.attributes["gen_ai.usage.output_tokens"]) for c in chats) == [(12, 5), (20, 3)]

    (tool,) = [s for s in found if s.name == "execute_tool probe"]
    assert tool.attributes["gen_ai.tool.name"] == "probe"
    assert tool.attributes["gen_ai.tool.call.id"] == "call_probe"
    tool_phase = parent(tool)
    assert tool_phase.name == "phase agent-tool.call"
    assert tool_phase.attributes["kernel.task.kind"] == "agent-tool"
    spawned_by = parent(tool_phase)  # the turn's phase whose commit created the tool task
    assert spawned_by.name == "phase agent-turn.request"
    assert any(c.parent_id == spawned_by.span_id for c in chats)

    # Two processes ran them: the tool on the hands worker, the turn on the brain worker.
    assert tool.resource["service.instance.id"].endswith(f":{hands.pid}")
    assert spawned_by.resource["service.instance.id"].endswith(f":{brain.pid}")
    assert tool.resource["service.name"] == "chaos-worker"

    commits = [s for s in found if s.name == "commit"]
    assert commits and all(parent(c) is not None and parent(c).name.startswith("phase ")
                           for c in commits)
    assert not [s.name for s in found if s.failed]

    # The trace id is in the workers' log lines and on the turn's page.
    assert f"trace={trace_id}" in brain.output()
    turn = next(t for t in stack.tasks(session_id) if t.kind == "agent-turn")
    assert tracing.trace_id(turn.trace) == trace_id
    page = client_for("vera", "viewer").get(f"/tasks/{turn.id}/")
    assert page.status_code == 200 and trace_id in page.content.decode()
    api: Client = client_for("otto", "viewer")
    assert api.get(f"/api/tasks/{turn.id}").json()["trace_id"] == trace_id
