"""Fixtures the API tests share: the web process's kernel with the test task kinds of
``test_api.py`` (no broker), and an operator's client."""

from __future__ import annotations

import pytest
from django.test import Client

from kernel import Kernel

from .test_api import client_for, with_test_kinds


@pytest.fixture
def api_kernel(monkeypatch: pytest.MonkeyPatch) -> Kernel:
    return with_test_kinds(monkeypatch)


@pytest.fixture
def operator() -> Client:
    return client_for("olga", "operator")
