"""Shared pytest set-up.

Kept deliberately minimal: kernel-only tests (tests/unit) must run without Postgres,
Redis or any Django database access. pytest-django configures Django from
``DJANGO_SETTINGS_MODULE`` in pyproject.toml (tests/settings.py: the product's, with
DEBUG asked for), which imports settings but opens no connection until a test asks for
the database. The fixtures below touch no database until a test needs them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from controlplane.dev.smtp_server import SmtpStandIn

# Helper modules holding checks that were once in test modules: pytest rewrites their
# asserts as it does a test module's, so that a failure there shows the values compared.
pytest.register_assert_rewrite(
    "tests.unit.crash_trees", "tests.integration.round_trips", "tests.integration.sessions",
    "tests.e2e.logins", "tests.chaos.held_send", "tests.chaos.uncertain_smtp",
)


@pytest.fixture(scope="session", autouse=True)
def clean_slate_in_milliseconds() -> Iterator[None]:
    """Transactional tests end with :mod:`tests.clean_slate` instead of a full flush."""
    from django.test import TransactionTestCase

    from tests import clean_slate

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(TransactionTestCase, "_fixture_teardown", clean_slate.fixture_teardown)
        yield


@pytest.fixture(scope="session")
def postgres_cluster_template() -> Iterator[Any]:
    """A stopped, migrated private Postgres cluster, made once a run (initdb and migrate
    take seconds): the tests that restart Postgres, and the soak, each run a copy."""
    from tests.chaos.private_services import postgres_template

    with postgres_template() as server:
        yield server


@pytest.fixture
def smtp() -> Iterator[SmtpStandIn]:
    """An SMTP stand-in served from the test process (in the chaos tests it is the worker
    that dies, not the server)."""
    from controlplane.dev.smtp_server import start_smtp_server

    with start_smtp_server() as server:
        yield server
