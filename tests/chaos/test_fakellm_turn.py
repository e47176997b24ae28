"""An agent turn on a real worker against ``fakellm`` (a mock OpenAI server from PyPI
that no one here wrote), configured as a user would: by name in ``MODELS``, the server
asked for the model name it expects, never the configuration's name. The model calls a
tool, gets its result, and answers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controlplane import model_catalog
from tests.fakellm_server import FakeLLM, fakellm

from .harness import Stack, chaos_stack

pytestmark = [pytest.mark.chaos, pytest.mark.slow]
SERVED = "gpt-4o-mini"
RULES = [
    {"name": "answer", "when": {"tool_result_contains": "probed"},
     "respond": {"content": "The probe said v1."}},
    {"name": "call", "when": {"model_matches": SERVED, "tools_include": "probe"},
     "respond": {"tool_calls": [{"name": "probe", "arguments": {"value": "v1"}}]}},
]


@pytest.fixture
def mock(tmp_path: Path) -> Iterator[FakeLLM]:
    with fakellm(tmp_path, RULES) as running:
        yield running


@pytest.fixture
def stack(tmp_path: Path, transactional_db: None, mock: FakeLLM, settings: Any) -> Iterator[Stack]:
    models = json.dumps({"mini": {"provider": "openai", "base_url": mock.url,
                                  "model": SERVED, "timeout": 30}})
    settings.MODELS = model_catalog.load({"MODELS": models})
    env = {"MODELS": models, "ASSISTANT_TOOL_MODULES": "tests.chaos.agent_tools",
           "AGENT_TOOL_DIR": str(tmp_path)}
    with chaos_stack(tmp_path, env=env) as running:
        yield running


def test_a_turn_with_a_tool_call_against_fakellm(stack: Stack, mock: FakeLLM) -> None:
    stack.worker()
    stack.beat()
    _, conversation, submission = stack.converse("probe v1, please", model="mini")
    answered = stack.wait_answered(submission.id)
    assert answered.reason is None
    entries = [(e.kind, e.payload) for e in stack.entries(conversation)]
    assert [kind for kind, _ in entries] == ["user", "model_response", "tool_result",
                                            "model_response"]
    (call,) = entries[1][1]["tool_calls"]
    assert (call["name"], call["arguments"]) == ("probe", {"value": "v1"})
    assert entries[2][1]["result"] == {"probed": "v1"}
    assert entries[3][1]["text"] == "The probe said v1."
    assert stack.tool_runs() == ["probe"]
    asked = mock.requests()
    assert [(r["model"], r["stream"], r["matched_rule"]) for r in asked] == [
        (SERVED, True, "call"), (SERVED, True, "answer")]
