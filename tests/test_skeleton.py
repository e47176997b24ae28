"""The project skeleton holds together: Django checks pass, the app answers, the
services that `make services` resolved are reachable with the URLs it exported."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from controlplane.settings import parse_database_url

ROOT = Path(__file__).resolve().parent.parent


def test_manage_py_check_passes() -> None:
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--fail-level", "WARNING"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout


def test_healthz_answers_ok_without_database(client) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


@pytest.mark.django_db
def test_database_from_database_url_is_reachable() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('server_version_num')::int")
        (version,) = cursor.fetchone()
    assert version >= 140000


def test_redis_from_redis_url_answers_ping() -> None:
    import redis
    from django.conf import settings

    client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=5)
    try:
        assert client.ping() is True
    finally:
        client.close()


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            "postgresql://postgres@127.0.0.1:5432/durable",
            {"NAME": "durable", "USER": "postgres", "HOST": "127.0.0.1", "PORT": "5432"},
        ),
        (
            "postgres://u%40x:p%3Aw@db.example:6543/app?sslmode=require",
            {
                "NAME": "app",
                "USER": "u@x",
                "PASSWORD": "p:w",
                "HOST": "db.example",
                "PORT": "6543",
                "OPTIONS": {"sslmode": "require", "prepare_threshold": 5},
            },
        ),
        (
            "postgresql://postgres@/durable?host=/Work/Main/.data/pg",
            {
                "NAME": "durable",
                "HOST": "/Work/Main/.data/pg",
                "PORT": "",
                "OPTIONS": {"prepare_threshold": 5},
            },
        ),
        (
            "postgresql://postgres@%2FTmp%2Fpg:5433/durable",
            {"HOST": "/Tmp/pg", "PORT": "5433"},
        ),
        (  # behind a transaction-mode pooler: no prepared statements
            "postgresql://postgres@127.0.0.1/durable?prepare_threshold=",
            {"OPTIONS": {"prepare_threshold": None}},
        ),
    ],
)
def test_parse_database_url(url: str, expected: dict[str, object]) -> None:
    parsed = parse_database_url(url)
    assert parsed["ENGINE"] == "django.db.backends.postgresql"
    for key, value in expected.items():
        assert parsed[key] == value, key


def test_parse_database_url_rejects_other_schemes() -> None:
    with pytest.raises(ValueError):
        parse_database_url("mysql://root@127.0.0.1/x")


def test_parse_database_url_rejects_a_bad_prepare_threshold() -> None:
    with pytest.raises(ValueError, match="prepare_threshold"):
        parse_database_url("postgresql://postgres@127.0.0.1/durable?prepare_threshold=often")


def test_settings_use_the_exported_service_urls() -> None:
    """`make test` exports what `make services` resolved; settings must use exactly that."""
    from django.conf import settings

    if "DATABASE_URL" not in os.environ or "REDIS_URL" not in os.environ:
        pytest.skip("no DATABASE_URL/REDIS_URL exported (not run through `make test`)")
    expected = parse_database_url(os.environ["DATABASE_URL"])
    actual = settings.DATABASES["default"]
    # NAME is left out: pytest-django points it at the test database (test_<name>).
    for key in ("USER", "HOST", "PORT", "OPTIONS"):
        assert actual[key] == expected[key], key
    redis_url = os.environ["REDIS_URL"]
    configured_redis = settings.REDIS_URL
    assert configured_redis == redis_url
    assert settings.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"] == [redis_url]
