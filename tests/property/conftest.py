"""Two Postgres databases for the two Postgres worlds of the differential test.

The world with every fast path on uses pytest-django's test database (alias
``default``). The world with them off (``PostgresStorage(fast_paths=False)``) uses a
database of its own, alias :data:`GENERAL`: a copy of the migrated test database
(``CREATE DATABASE ... TEMPLATE``), made once a run and dropped at its end. Two
databases, not two sessions in one: claims of burst rows, sweeps, expired leases and the
runnable list read every session's rows, so two worlds in one database would take each
other's work.

The alias is a connection of the test's thread only, made for the duration of a test
that asks for :func:`general_database`, so no other test can see it.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from django.db import connections

GENERAL = "property_general"


def _admin(settings: dict) -> psycopg.Connection:
    """A connection to the server's maintenance database, in autocommit mode."""
    return psycopg.connect(
        dbname="postgres", user=settings["USER"] or "postgres",
        host=settings["HOST"] or None, port=settings["PORT"] or None,
        password=settings["PASSWORD"] or None, autocommit=True,
    )


@pytest.fixture(scope="session")
def general_database_name(django_db_setup: None, django_db_blocker) -> Iterator[str]:
    """The copy of the migrated test database; dropped when the run ends."""
    with django_db_blocker.unblock():
        default = connections["default"]
        template = default.settings_dict["NAME"]
        name = f"{template}_general"
        settings = dict(default.settings_dict)
        default.close()  # a template must have no connection while it is copied
        with _admin(settings) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
            admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    yield name
    with django_db_blocker.unblock(), _admin(settings) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def general_database(transactional_db: None, general_database_name: str) -> Iterator[str]:
    """The alias :data:`GENERAL`, connected to the copy, for this test only (this
    thread's connection, made here: Django's test case allows a connection that is not
    in its settings, and its settings know nothing of this one)."""
    default = connections["default"]
    settings = dict(default.settings_dict)
    settings["NAME"] = general_database_name
    connections[GENERAL] = type(default)(settings, GENERAL)
    try:
        yield GENERAL
    finally:
        connections[GENERAL].close()
        del connections[GENERAL]
