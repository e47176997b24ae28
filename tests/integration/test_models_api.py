"""The configured models through the API: listed for anyone who may read, named by a
submission (an unknown one, or more tokens than its window, refused with 422 naming the
field, nothing written), and asked for by their configured name."""

from __future__ import annotations

import json

import pytest
from django.test import Client
from pytest_django.fixtures import Settings

from controlplane.model_catalog import load
from controlplane.worker.runtime import runtime
from kernel import Kernel

from .api_kinds import with_test_kinds
from .clients import client_for, post

pytestmark = pytest.mark.django_db(transaction=True)
MINI = {"provider": "openai", "base_url": "https://api.example/v1",
        "api_key_env": "EXAMPLE_KEY", "model": "gpt-4o-mini", "context_window": 4096,
        "prices": {"input": 0.15, "output": 0.6}}


@pytest.fixture(autouse=True)
def kernel(monkeypatch: pytest.MonkeyPatch, settings: Settings) -> Kernel:
    settings.MODELS = load({"MODELS": json.dumps({"mini": MINI})})
    return with_test_kinds(monkeypatch)


def test_the_models_a_submission_may_name_are_listed_without_addresses() -> None:
    answer = client_for("vic", "viewer").get("/api/models")
    assert answer.status_code == 200
    assert answer.json() == [
        {"name": "scripted", "provider": "scripted", "model": "scripted",
         "context_window": None, "prices": None, "background": False, "default": True},
        {"name": "mini", "provider": "openai", "model": "gpt-4o-mini",
         "context_window": 4096, "prices": {"input": 0.15, "output": 0.6},
         "background": False, "default": False},
    ]
    assert "api.example" not in answer.content.decode()
    assert "EXAMPLE_KEY" not in answer.content.decode()
    assert Client().get("/api/models").status_code == 401


def test_a_submission_naming_no_configured_model_is_refused_and_writes_nothing(
    kernel: Kernel,
) -> None:
    operator = client_for("olga", "operator")
    session = post(operator, "/api/sessions", {}).json()["id"]
    conversation = post(operator, f"/api/sessions/{session}/conversations", {}).json()["id"]
    head = kernel.storage.session(session).head_seq

    def submit(input: dict[str, object], request_id: str) -> object:
        return post(operator, f"/api/sessions/{session}/submissions",
                    {"conversation_id": conversation, "request_id": request_id,
                     "input": input})

    unknown = submit({"text": "hi", "model": "remote"}, "r1")
    assert unknown.status_code == 422
    assert unknown.json()["detail"] == ("input: model: no model 'remote' is configured "
                                        "(configured: scripted, mini)")
    too_long = submit({"text": "hi", "model": "mini", "options": {"max_tokens": 5000}}, "r2")
    assert too_long.status_code == 422
    assert "options.max_tokens: at most model 'mini''s context window, 4096" in \
        too_long.json()["detail"]
    assert kernel.storage.session(session).head_seq == head

    placed = submit({"text": "hi", "model": "mini", "options": {"max_tokens": 4096}}, "r3")
    assert placed.status_code == 201
    turn = runtime().kernel.task(kernel.document(session, "agent-conversation",
                                                 conversation)["active"])
    assert turn.input["model"] == "mini"
