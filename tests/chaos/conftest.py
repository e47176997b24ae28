"""Chaos tests run real Celery workers against pytest-django's test database."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pytest_django.fixtures import Settings

from controlplane import model_catalog
from tests.model_stand_in import ModelStandIn, model_stand_in, models_env

from .harness import Stack, chaos_stack


@pytest.fixture
def stack(tmp_path: Path, transactional_db: None) -> Iterator[Stack]:
    with chaos_stack(tmp_path) as running:
        yield running


@pytest.fixture
def model(settings: Settings) -> Iterator[ModelStandIn]:
    """A loopback model server the workers use as model ``remote`` (configured in this
    process too: submissions through the API name it)."""
    with model_stand_in() as stand_in:
        settings.MODELS = model_catalog.load(models_env(stand_in.url))
        yield stand_in


@pytest.fixture
def agent_stack(tmp_path: Path, transactional_db: None, model: ModelStandIn) -> Iterator[Stack]:
    """A stack whose workers ask ``model`` and offer the killable tools of
    ``tests.chaos.agent_tools``."""
    env = {
        **models_env(model.url),
        "ASSISTANT_TOOL_MODULES": "tests.chaos.agent_tools",
        "AGENT_TOOL_DIR": str(tmp_path),
    }
    with chaos_stack(tmp_path, env=env) as running:
        yield running
