"""Under ASGI a request runs on a thread of its own, so the database connection it opens
can never serve another request: it is closed when the request ends, not left for the
garbage collector to find (each one a Postgres backend held open meanwhile, and a
server's connections are few)."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import psycopg
import pytest
from django.db import connection

from .server import daphne_alone, viewer_token

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

REQUESTS = 200


def test_requests_leave_no_database_connection_open_behind_them(tmp_path: Path) -> None:
    token = viewer_token()
    name = connection.settings_dict["NAME"]
    with daphne_alone(tmp_path / "daphne.log") as server, \
            psycopg.connect(**connection.get_connection_params(), autocommit=True) as watch:
        def backends() -> int:
            found = watch.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> "
                "pg_backend_pid()", [name]).fetchone()
            assert found is not None
            return int(found[0])

        before = backends()  # this process's own, and the server's start-up ones
        most = 0
        for n in range(REQUESTS):
            request = urllib.request.Request(f"{server.http}/api/sessions?limit=5",
                                             headers={"Authorization": f"Bearer {token}"})
            with urllib.request.urlopen(request, timeout=10) as answer:
                assert answer.status == 200
            if n % 10 == 9:
                most = max(most, backends() - before)
    # A request's connection lingering until a collection would leave dozens open.
    assert most <= 2, most
