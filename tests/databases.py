"""The test database as a URL, for the real processes that tests start."""

from __future__ import annotations

from urllib.parse import quote

from django.conf import settings
from django.db import connection


def url_of_test_database() -> str:
    """pytest-django's test database as a libpq URL another process can use.

    A host that is a directory (the embedded Postgres listens on a Unix socket
    only) goes in the query string, where ``controlplane.settings`` reads it.
    """
    params = settings.DATABASES["default"]
    user = quote(params["USER"] or "postgres")
    name = quote(connection.settings_dict["NAME"])
    host = params["HOST"] or "127.0.0.1"
    port = params["PORT"] or "5432"
    if host.startswith("/"):
        return f"postgresql://{user}@/{name}?host={quote(host)}&port={port}"
    return f"postgresql://{user}@{host}:{port}/{name}"
