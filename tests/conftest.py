"""Shared pytest set-up.

Kept deliberately minimal: kernel-only tests (tests/unit) must run without Postgres,
Redis or any Django database access. pytest-django configures Django from
``DJANGO_SETTINGS_MODULE`` in pyproject.toml (tests/settings.py: the product's, with
DEBUG asked for), which imports settings but opens no connection until a test asks for
the database.
"""

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session", autouse=True)
def clean_slate_in_milliseconds() -> Iterator[None]:
    """Transactional tests end with :mod:`tests.clean_slate` instead of a full flush."""
    from django.test import TransactionTestCase

    from tests import clean_slate

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(TransactionTestCase, "_fixture_teardown", clean_slate.fixture_teardown)
        yield
