"""Models configured by name (``MODELS`` / ``MODELS_FILE``): what is read, what is
refused (naming the field), and the providers built from it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from controlplane import model_catalog
from controlplane.model_catalog import SCRIPTED, ModelEntry, check_choice, load
from controlplane.reference import assistant
from kernel.agent import ModelRequest, PermanentModelError, ScriptedProvider
from kernel.agent.openai import OpenAICompatibleProvider

MINI = {"provider": "openai", "base_url": "https://api.example/v1",
        "api_key_env": "EXAMPLE_KEY", "model": "gpt-4o-mini", "context_window": 128000,
        "prices": {"input": 0.15, "output": 0.6}}
TOML = """
[mini]
provider = "openai"
base_url = "https://api.example/v1"
api_key_env = "EXAMPLE_KEY"
model = "gpt-4o-mini"
context_window = 128000
prices = { input = 0.15, output = 0.6 }

[local]
provider = "openai"
base_url = "http://127.0.0.1:8080/v1"
model = "qwen2.5-7b-instruct"
background = true
stream = false
timeout = 120
max_retries = 2
"""


def test_several_models_by_name_from_json_or_a_toml_file(tmp_path: Path) -> None:
    from_json = load({"MODELS": json.dumps({"mini": MINI})})
    assert list(from_json) == [SCRIPTED, "mini"]
    mini = from_json["mini"]
    assert (mini.model, mini.base_url, mini.api_key_env, mini.context_window) == (
        "gpt-4o-mini", "https://api.example/v1", "EXAMPLE_KEY", 128000)
    assert mini.prices == {"input": 0.15, "output": 0.6}
    assert (mini.timeout, mini.background, mini.stream, mini.max_retries) == (60, False, True, 0)

    path = tmp_path / "models.toml"
    path.write_text(TOML)
    from_file = load({"MODELS_FILE": str(path)})
    assert list(from_file) == [SCRIPTED, "mini", "local"]
    assert from_file["mini"] == mini
    local = from_file["local"]
    assert (local.model, local.api_key_env, local.background, local.stream, local.timeout,
            local.max_retries) == ("qwen2.5-7b-instruct", None, True, False, 120, 2)
    assert load({}) == {SCRIPTED: model_catalog.BUILT_IN}


@pytest.mark.parametrize("models, field", [
    ({"mini": {**MINI, "provider": "anthropic"}}, "MODELS.mini.provider"),
    ({"mini": {**MINI, "base_url": "ftp://x"}}, "MODELS.mini.base_url"),
    ({"mini": {k: v for k, v in MINI.items() if k != "model"}}, "MODELS.mini.model"),
    ({"mini": {**MINI, "api_key_env": "sk-live-123"}}, "MODELS.mini.api_key_env"),
    ({"mini": {**MINI, "context_window": 0}}, "MODELS.mini.context_window"),
    ({"mini": {**MINI, "prices": {"input": -1}}}, "MODELS.mini.prices.input"),
    ({"mini": {**MINI, "prices": {"cached": 1}}}, "MODELS.mini.prices.cached"),
    ({"mini": {**MINI, "timeout": "soon"}}, "MODELS.mini.timeout"),
    ({"mini": {**MINI, "background": "yes"}}, "MODELS.mini.background"),
    ({"mini": {**MINI, "max_retries": 99}}, "MODELS.mini.max_retries"),
    ({"mini": {**MINI, "api_key": "sk-live-123"}}, "MODELS.mini.api_key"),
    ({SCRIPTED: MINI}, f"MODELS.{SCRIPTED}"),
    ({"bad name!": MINI}, "MODELS.bad name!"),
    ({"mini": "gpt-4o-mini"}, "MODELS.mini"),
    (["mini"], "MODELS"),
])
def test_a_mistake_stops_the_process_naming_its_field(models: object, field: str) -> None:
    with pytest.raises(ImproperlyConfigured) as refused:
        load({"MODELS": json.dumps(models)})
    assert str(refused.value).startswith(f"{field}: ")
    assert "sk-live-123" not in str(refused.value)  # a pasted key is never echoed


def test_the_old_single_model_variables_are_refused_saying_what_replaced_them(
    tmp_path: Path,
) -> None:
    for name in model_catalog.REPLACED:
        with pytest.raises(ImproperlyConfigured, match=f"^{name}: no longer read.*MODELS"):
            load({name: "http://127.0.0.1:8080/v1"})
    with pytest.raises(ImproperlyConfigured, match="^MODELS_FILE: give MODELS or"):
        load({"MODELS": "{}", "MODELS_FILE": str(tmp_path / "m.toml")})
    with pytest.raises(ImproperlyConfigured, match="^MODELS_FILE: cannot read"):
        load({"MODELS_FILE": str(tmp_path / "missing.toml")})
    (tmp_path / "broken.toml").write_text("[mini\n")
    with pytest.raises(ImproperlyConfigured, match="^MODELS_FILE: .* is not valid TOML"):
        load({"MODELS_FILE": str(tmp_path / "broken.toml")})
    with pytest.raises(ImproperlyConfigured, match="^MODELS: not valid JSON"):
        load({"MODELS": "{mini"})


def test_a_submission_names_a_configured_model_within_its_window() -> None:
    models = load({"MODELS": json.dumps({"mini": MINI})})
    check_choice(models, {"text": "hi"})
    check_choice(models, {"text": "hi", "model": "mini", "options": {"max_tokens": 128000}})
    check_choice(models, {"text": "hi", "agent": "support", "model": "anything"})
    with pytest.raises(ValueError, match=r"^model: no model 'gpt-4o' is configured "
                                         r"\(configured: scripted, mini\)"):
        check_choice(models, {"text": "hi", "model": "gpt-4o"})
    with pytest.raises(ValueError, match=r"^options.max_tokens: at most model 'mini''s "
                                         r"context window, 128000"):
        check_choice(models, {"text": "hi", "model": "mini", "options": {"max_tokens": 128001}})


def test_providers_ask_for_the_configured_model_with_the_key_from_its_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    entry = load({"MODELS": json.dumps({"mini": {**MINI, "stream": False}})})["mini"]
    monkeypatch.setenv("EXAMPLE_KEY", "sk-from-env")
    built = assistant.provider(entry)
    assert isinstance(built, OpenAICompatibleProvider)
    assert (built.model, built.base_url, built.stream) == ("gpt-4o-mini",
                                                          "https://api.example/v1", False)
    assert built.client.api_key == "sk-from-env"
    assert isinstance(assistant.provider(model_catalog.BUILT_IN), ScriptedProvider)

    monkeypatch.delenv("EXAMPLE_KEY")
    missing = assistant.provider(entry)  # a process without the key asks nothing
    with pytest.raises(PermanentModelError, match="EXAMPLE_KEY is not set"):
        missing.generate(ModelRequest("mini", []), lambda text: None)


def test_what_anyone_may_see_of_a_model_holds_no_address_or_key_variable() -> None:
    entry: ModelEntry = load({"MODELS": json.dumps({"mini": MINI})})["mini"]
    shown = entry.public()
    assert shown == {"name": "mini", "provider": "openai", "model": "gpt-4o-mini",
                     "context_window": 128000, "prices": {"input": 0.15, "output": 0.6},
                     "background": False}


def test_the_documented_example_is_a_valid_configuration(tmp_path: Path) -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "models.md").read_text()
    example = doc.split("```toml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "models.toml"
    path.write_text(example)
    models = load({"MODELS_FILE": str(path)})
    assert [(m.name, m.model) for m in models.values()] == [
        (SCRIPTED, SCRIPTED), ("mini", "gpt-4o-mini"), ("local", "qwen2.5-7b-instruct")]
