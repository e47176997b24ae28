"""A throwaway Postgres cluster of its own, for tests and benchmarks that need a server
they may stop, restart, listen elsewhere or replicate.

:class:`PrivatePostgres`: ``initdb`` + ``postgres`` from the system's
``/usr/lib/postgresql/*/bin`` (or the binaries that the ``pgserver`` package ships),
trust authentication, in a temporary folder (:func:`private_folder`), on a free port.
Postgres refuses to run as root, so under root the server runs as the ``postgres`` (or
``pgserver``) system user (:func:`server_user`). :func:`create_and_migrate` gives it the
project's schema; :func:`streaming_replica` clones a running one into a hot standby with
``pg_basebackup``. The shared servers (Postgres on 5432) are never touched.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

from controlplane.dev.ports import free_port
from controlplane.dev.processes import ROOT, Process

DATABASE = "chaos"  # the database create_and_migrate makes (the chaos tests' first user)
SITE_PACKAGES = Path(psycopg.__file__).resolve().parents[1]


class NoServerUser(RuntimeError):
    """Running as root, with no unprivileged system user to run Postgres as."""


def postgres_bin() -> Path | None:
    """The newest system Postgres, else the one shipped by the ``pgserver`` package."""

    def major(path: str) -> int:
        name = Path(path).parent.parent.name
        return int(name) if name.isdigit() else 0

    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=major, reverse=True)
    candidates.append(str(SITE_PACKAGES / "pgserver" / "pginstall" / "bin" / "postgres"))
    for candidate in candidates:
        path = Path(candidate)
        if path.exists() and (path.parent / "initdb").exists():
            return path.parent
    return None


def server_user() -> str | None:
    """Postgres will not run as root: under root, run it as an unprivileged user."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "pgserver"):
        with suppress(KeyError):
            pwd.getpwnam(name)
            return name
    raise NoServerUser("running as root and no 'postgres' system user to run Postgres as")


@dataclass
class PrivatePostgres:
    """A throwaway Postgres cluster in a temporary folder, on a port of its own."""

    folder: Path
    bin_dir: Path
    user: str | None
    port: int = field(default_factory=free_port)
    process: Process | None = None
    # Fast and unsafe by default; a primary to take a base backup of needs full pages.
    settings: tuple[str, ...] = ("fsync=off", "synchronous_commit=off", "full_page_writes=off")
    # Addresses besides loopback to listen on, trusting every client that reaches them
    # (the host ends of network namespaces' links: a throwaway cluster on this machine).
    listen: tuple[str, ...] = ()
    max_connections: int = 50

    @property
    def data(self) -> Path:
        return self.folder / "data"

    @property
    def log(self) -> Path:
        return self.folder / "postgres.log"

    def url(self, database: str = DATABASE, host: str = "127.0.0.1") -> str:
        return f"postgresql://postgres@{host}:{self.port}/{database}"

    def init(self) -> None:
        subprocess.run(
            [str(self.bin_dir / "initdb"), "-D", str(self.data), "-U", "postgres",
             "-A", "trust", "-E", "UTF8", "--no-locale", "--no-sync"],
            check=True, capture_output=True, user=self.user, cwd=self.folder,
        )

    def start(self) -> None:
        if self.process is None:
            self.process = Process(
                "the private Postgres",
                [str(self.bin_dir / "postgres"), "-D", str(self.data), "-p", str(self.port),
                 "-k", str(self.folder),
                 "-c", "listen_addresses=" + ",".join(("127.0.0.1", *self.listen)),
                 *[arg for setting in self._settings() for arg in ("-c", setting)],
                 "-c", f"max_connections={self.max_connections}"],
                log=self.log, cwd=self.folder, user=self.user, append=True,
                ready_check=self.accepts,
            )
        self.process.start(timeout=30)

    def _settings(self) -> tuple[str, ...]:
        if not self.listen:
            return self.settings
        hba = self.folder / "pg_hba_listen.conf"
        hba.write_text("local all all trust\nhost all all 0.0.0.0/0 trust\n")
        hba.chmod(0o644)
        # A client across a link may vanish in the middle of a transaction (a cut link
        # resets nothing): its row locks, a session's commit order among them, must not
        # stay held until TCP gives up on it, hours later.
        return (*self.settings, f"hba_file={hba}", "idle_in_transaction_session_timeout=5s")

    def accepts(self) -> bool:
        try:
            with psycopg.connect(self.url("postgres"), connect_timeout=2):
                return True
        except psycopg.OperationalError:
            return False

    def stop(self, mode: str = "fast") -> None:
        """``fast`` (SIGINT): disconnect everyone, shut down; ``immediate`` (SIGQUIT): crash."""
        if self.process is not None:
            self.process.stop(30, signal.SIGQUIT if mode == "immediate" else signal.SIGINT)

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()

    def connect(self) -> psycopg.Connection[dict[str, Any]]:
        return psycopg.connect(self.url(), autocommit=True, row_factory=dict_row,
                               connect_timeout=2)


@contextmanager
def private_folder(prefix: str, owner: str | None) -> Iterator[Path]:
    """A temporary folder outside pytest's (root-only) tmp tree, removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        if owner is not None:
            entry = pwd.getpwnam(owner)
            os.chown(folder, entry.pw_uid, entry.pw_gid)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def create_and_migrate(server: PrivatePostgres) -> None:
    """Create the database :data:`DATABASE` on a running server and migrate it."""
    with psycopg.connect(server.url("postgres"), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {DATABASE}")
    migrate = subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
        cwd=ROOT, capture_output=True, text=True, timeout=180,
        env={**os.environ, "DATABASE_URL": server.url()},
    )
    if migrate.returncode != 0:
        raise RuntimeError(f"migrate failed:\n{migrate.stdout}{migrate.stderr}")


def streaming_replica(primary: PrivatePostgres, replica: PrivatePostgres) -> None:
    """Clone the running ``primary`` into ``replica``'s (empty) data folder with
    ``pg_basebackup -R`` (a hot standby streaming from it) and start it. The primary
    needs ``full_page_writes`` on."""
    subprocess.run(
        [str(replica.bin_dir / "pg_basebackup"), "-h", "127.0.0.1", "-p", str(primary.port),
         "-U", "postgres", "-D", str(replica.data), "-R", "-X", "stream", "-c", "fast"],
        check=True, capture_output=True, user=replica.user, cwd=replica.folder, timeout=120)
    replica.start()
