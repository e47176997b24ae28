"""`make services` keeps the URLs a checkout was pointed at (controlplane/dev/services.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from controlplane.dev import services


@pytest.fixture
def resolved(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The URLs ensure resolves, as given: no server is asked."""
    asked: list[str] = []

    def resolve(url: str, data_dir: Path) -> services.Resolved:
        asked.append(url)
        return services.Resolved(url, f"resolved {url}")

    monkeypatch.setattr(services, "resolve_postgres", resolve)
    monkeypatch.setattr(services, "resolve_redis", resolve)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.delenv("REDIS_URL", raising=False)
    return asked


def test_a_url_given_once_is_kept_by_the_next_run_without_one(
    tmp_path: Path, resolved: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    env_file = tmp_path / "services.env"
    own = "postgresql://postgres@127.0.0.1:5432/durable_mine"
    monkeypatch.setenv("DATABASE_URL", own)
    services.ensure(env_file, tmp_path)
    monkeypatch.delenv("DATABASE_URL")

    values = services.ensure(env_file, tmp_path)

    assert values["DATABASE_URL"] == own
    assert services.read_env_file(env_file)["DATABASE_URL"] == own
    assert values["REDIS_URL"] == services.DEFAULT_REDIS_URL


def test_the_environment_names_another_and_without_a_file_the_default_holds(
    tmp_path: Path, resolved: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    env_file = tmp_path / "services.env"
    assert services.ensure(env_file, tmp_path)["DATABASE_URL"] == services.DEFAULT_DATABASE_URL
    other = "postgresql://postgres@127.0.0.1:5432/durable_other"
    monkeypatch.setenv("DATABASE_URL", other)
    assert services.ensure(env_file, tmp_path)["DATABASE_URL"] == other
