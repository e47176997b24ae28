"""Chaos tests run real Celery workers against pytest-django's test database."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .harness import Stack, chaos_stack


@pytest.fixture
def stack(tmp_path: Path, transactional_db: None) -> Iterator[Stack]:
    with chaos_stack(tmp_path) as running:
        yield running
