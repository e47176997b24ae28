"""The models a submission may name: each one configured by name (docs/models.md).

``MODELS`` (JSON in the environment) or ``MODELS_FILE`` (a TOML or JSON file) maps a
name to how that model is reached::

    [mini]                          # what a submission names: {"model": "mini"}
    provider = "openai"             # an OpenAI-compatible server
    base_url = "https://api.openai.com/v1"
    api_key_env = "OPENAI_API_KEY"  # the variable holding the key (never the key itself)
    model = "gpt-4o-mini"           # what the server is asked for
    context_window = 128000
    prices = { input = 0.15, output = 0.6 }   # per million tokens (the dashboard's cost)
    timeout = 60                    # seconds
    background = false              # Responses background mode: poll a saved id
    stream = true                   # chat completions streamed (false: whole answers)
    max_retries = 0                 # the client's own in-process retries

The demo's ``scripted`` model is always there. Parsed and checked when the settings
load (a mistake names its field and stops the process); the providers are built from it
by the assistant (:func:`controlplane.reference.assistant.models`), so the kernel is handed its
configuration and reads no environment itself. Standard library only: the settings
import it.
"""

from __future__ import annotations

import json
import math
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.core.exceptions import ImproperlyConfigured

SCRIPTED = "scripted"
PROVIDERS = ("openai",)
NAME = re.compile(r"[A-Za-z0-9][\w.:-]{0,99}")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,199}")
FIELDS = frozenset({"provider", "base_url", "api_key_env", "model", "context_window",
                    "prices", "timeout", "background", "stream", "max_retries"})
REPLACED = ("MODEL_BASE_URL", "MODEL_API_KEY", "MODEL_TIMEOUT", "MODEL_BACKGROUND",
            "MODEL_PRICES")


@dataclass(frozen=True)
class ModelEntry:
    """One configured model."""

    name: str
    provider: str
    model: str
    """The model name the server expects (never the entry's own name)."""
    base_url: str | None = None
    api_key_env: str | None = None
    context_window: int | None = None
    prices: dict[str, float] = field(default_factory=dict)
    timeout: float = 60.0
    background: bool = False
    stream: bool = True
    max_retries: int = 0

    def public(self) -> dict[str, Any]:
        """What anyone who may submit may see: no URL, no key variable."""
        return {"name": self.name, "provider": self.provider, "model": self.model,
                "context_window": self.context_window, "prices": dict(self.prices) or None,
                "background": self.background}


BUILT_IN = ModelEntry(SCRIPTED, SCRIPTED, SCRIPTED)
"""The demo's deterministic model (no network)."""


def _fail(where: str, problem: str) -> ImproperlyConfigured:
    return ImproperlyConfigured(f"{where}: {problem} (see docs/models.md)")


def _number(where: str, value: Any, *, integer: bool, low: float, high: float) -> Any:
    wanted = int if integer else int | float
    if isinstance(value, bool) or not isinstance(value, wanted) or (
            isinstance(value, float) and not math.isfinite(value)) or not low <= value <= high:
        a = "an integer" if integer else "a number"
        raise _fail(where, f"{a} from {low:g} to {high:g}, not {value!r}")
    return value


def entry(name: Any, raw: Any, where: str) -> ModelEntry:
    """One model's configuration, checked field by field."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise _fail(f"{where}.{str(name)[:100]}", "a model's name: letters, digits and "
                    "._:- (at most 100), starting with a letter or digit")
    where = f"{where}.{name}"
    if name == SCRIPTED:
        raise _fail(where, f"{SCRIPTED!r} is the built-in demo model; choose another name")
    if not isinstance(raw, dict):
        raise _fail(where, "a table (object) of the model's settings")
    unknown = sorted(set(raw) - FIELDS)
    if unknown:
        raise _fail(f"{where}.{unknown[0]}", f"not a model setting (known: "
                    f"{', '.join(sorted(FIELDS))})")
    provider = raw.get("provider")
    if provider not in PROVIDERS:
        raise _fail(f"{where}.provider", f"one of {', '.join(PROVIDERS)}, not {provider!r}")
    model = raw.get("model")
    if not isinstance(model, str) or not 1 <= len(model) <= 200:
        raise _fail(f"{where}.model", "the model name the server expects (1 to 200 characters)")
    base_url = raw.get("base_url")
    if not isinstance(base_url, str) or not re.fullmatch(r"https?://\S+", base_url):
        raise _fail(f"{where}.base_url", "the server's http(s) URL, such as "
                    "https://api.openai.com/v1")
    key = raw.get("api_key_env")
    if key is not None and (not isinstance(key, str) or not ENV_NAME.fullmatch(key)):
        raise _fail(f"{where}.api_key_env", "the name of an environment variable that holds "
                    "the key")
    window = raw.get("context_window")
    if window is not None:
        window = _number(f"{where}.context_window", window, integer=True, low=1, high=10**8)
    prices = raw.get("prices") or {}
    if not isinstance(prices, dict):
        raise _fail(f"{where}.prices", "a table with input and output (per million tokens)")
    for kind, price in prices.items():
        if kind not in ("input", "output"):
            raise _fail(f"{where}.prices.{str(kind)[:40]}", "only input and output")
        _number(f"{where}.prices.{kind}", price, integer=False, low=0, high=10**6)
    flags = {flag: raw.get(flag, default) for flag, default in (("background", False),
                                                                 ("stream", True))}
    for flag, value in flags.items():
        if not isinstance(value, bool):
            raise _fail(f"{where}.{flag}", "true or false")
    return ModelEntry(
        name=name, provider=provider, model=model, base_url=base_url, api_key_env=key,
        context_window=window, prices={k: float(v) for k, v in prices.items()},
        timeout=float(_number(f"{where}.timeout", raw.get("timeout", 60.0), integer=False,
                              low=0.1, high=3600)),
        background=flags["background"],
        stream=flags["stream"],
        max_retries=_number(f"{where}.max_retries", raw.get("max_retries", 0), integer=True,
                            low=0, high=10),
    )


def parse(raw: Any, where: str) -> dict[str, ModelEntry]:
    """Every model of a parsed ``MODELS`` value, the built-in one first."""
    if not isinstance(raw, dict):
        raise _fail(where, "a table (object) of models by name")
    found = {SCRIPTED: BUILT_IN}
    for name, settings in raw.items():
        found[name] = entry(name, settings, where)
    return found


def load(environ: Mapping[str, str]) -> dict[str, ModelEntry]:
    """The models ``MODELS`` or ``MODELS_FILE`` configure (not both)."""
    stale = [name for name in REPLACED if environ.get(name)]
    if stale:
        raise _fail(stale[0], "no longer read: configure the model by name in MODELS or "
                    "MODELS_FILE (its prices too)")
    text, path = environ.get("MODELS"), environ.get("MODELS_FILE")
    if text and path:
        raise _fail("MODELS_FILE", "give MODELS or MODELS_FILE, not both")
    if path:
        try:
            content = Path(path).read_text()
        except OSError as exc:
            raise _fail("MODELS_FILE", f"cannot read {path}: {exc.strerror}") from exc
        try:
            raw = tomllib.loads(content) if path.endswith(".toml") else json.loads(content)
        except (tomllib.TOMLDecodeError, ValueError) as exc:
            raise _fail("MODELS_FILE", f"{path} is not valid "
                        f"{'TOML' if path.endswith('.toml') else 'JSON'}: {exc}") from exc
        return parse(raw, "MODELS_FILE")
    try:
        raw = json.loads(text) if text else {}
    except ValueError as exc:
        raise _fail("MODELS", f"not valid JSON: {exc}") from exc
    return parse(raw, "MODELS")


def api_key(model: ModelEntry, environ: Mapping[str, str] | None = None) -> str | None:
    """The model's key, read from the variable its entry names (None: no key sent)."""
    if model.api_key_env is None:
        return None
    return (environ if environ is not None else os.environ).get(model.api_key_env)


def check_choice(models: Mapping[str, ModelEntry], input: Any) -> None:
    """ValueError naming the field when a submission's input names a model that is not
    configured, or asks for more tokens than its context window holds. A framework
    agent's input (``agent``) runs on that agent's own model and is not checked here."""
    if not isinstance(input, dict) or "agent" in input:
        return
    name = input.get("model")
    if name is None:
        return
    chosen = models.get(name) if isinstance(name, str) else None
    if chosen is None:
        raise ValueError(f"model: no model {str(name)[:100]!r} is configured (configured: "
                         f"{', '.join(models)})")
    options = input.get("options")
    asked = options.get("max_tokens") if isinstance(options, dict) else None
    window = chosen.context_window
    if isinstance(asked, int) and window is not None and asked > window:
        raise ValueError(f"options.max_tokens: at most model {chosen.name!r}'s context "
                         f"window, {window}")
