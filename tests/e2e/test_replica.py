"""Pages and feeds on a real streaming replica (issue 14, point 4).

The test starts a Postgres primary of its own, migrates it, clones it with
``pg_basebackup -R`` into a hot standby on another port, and serves it with Daphne
(``DATABASE_URL`` the primary, ``DATABASE_REPLICA_URL`` the standby). Commits come from
``manage.py send_notices`` processes on the primary (their hints reach Daphne through
Redis, as a worker's would).

- The session page is served from the replica: with replay paused
  (``pg_wal_replay_pause()``), a commit on the primary does not show on a page load.
- A page socket that has shown seq N (the overview's: commit id N) never shows a part
  older than N while the replica is behind it, and still shows the commits made
  meanwhile (read from the primary); a page load meanwhile shows the replica's state.
- A session feed from 0 sees every commit once, in order, whatever the replica holds.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from websockets.sync.client import connect

from controlplane.dev.ports import reserved_redis_url
from controlplane.dev.postgres import (
    PrivatePostgres,
    create_and_migrate,
    postgres_bin,
    private_folder,
    streaming_replica,
)
from controlplane.dev.processes import ROOT, running, wait_for
from tests.chaos.private_services import _server_user

from .server import Daphne, daphne_env

pytestmark = [pytest.mark.slow]
SEQ = re.compile(r'data-seq="(\d+)"')


def subfolder(folder: Path, name: str, owner: str | None) -> Path:
    path = folder / name
    path.mkdir()
    if owner is not None:
        shutil.chown(path, owner, owner)
    return path


def query(server: PrivatePostgres, sql: str, params: Any = None) -> list[dict[str, Any]]:
    with server.connect() as conn:
        return conn.execute(sql, params).fetchall()


@pytest.fixture(scope="module")
def clusters() -> Iterator[tuple[PrivatePostgres, PrivatePostgres]]:
    """A migrated primary and its streaming replica, each on a port of its own."""
    bin_dir = postgres_bin()
    if bin_dir is None or not (bin_dir / "pg_basebackup").exists():
        pytest.skip("no Postgres server binaries (initdb, postgres, pg_basebackup)")
    user = _server_user()
    with private_folder("replica-test-", user) as folder:
        # full_page_writes stays on: pg_basebackup refuses a primary without it
        primary = PrivatePostgres(subfolder(folder, "primary", user), bin_dir, user,
                                  settings=("fsync=off",))
        replica = PrivatePostgres(subfolder(folder, "replica", user), bin_dir, user,
                                  settings=("fsync=off",))
        try:
            primary.init()
            primary.start()
            create_and_migrate(primary)
            streaming_replica(primary, replica)
            assert query(replica, "SELECT pg_is_in_recovery() AS r") == [{"r": True}]
            yield primary, replica
        finally:
            replica.stop("immediate")
            primary.stop("immediate")


def _env(**extra: str) -> dict[str, str]:
    import os

    return {**os.environ, "PYTHONUNBUFFERED": "1", **extra}


def manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def started(output: str) -> tuple[str, str]:
    """(session, task) from ``manage.py send_notices``'s output."""
    found = re.search(r"session (\S+)\ntask (\S+)", output)
    assert found is not None, output
    return found.group(1), found.group(2)


def replica_has(replica: PrivatePostgres, session_id: str, seq: int) -> bool:
    found = query(replica, "SELECT head_seq FROM kernel_session WHERE id = %s", [session_id])
    return bool(found) and found[0]["head_seq"] >= seq


def test_pages_and_feeds_read_the_replica_and_never_go_back(
    clusters: tuple[PrivatePostgres, PrivatePostgres], tmp_path: Path
) -> None:
    primary, replica = clusters
    with reserved_redis_url(settings.REDIS_URL) as redis_url:
        env = daphne_env(primary.url(), redis_url, DATABASE_REPLICA_URL=replica.url(),
                         FEED_POLL_SECONDS="0.5")
        created = manage(env, "shell", "-c", (
            "from django.contrib.auth.models import Group, User\n"
            "u = User.objects.create_user('vic', password='vic-pass-1234')\n"
            "u.groups.add(Group.objects.get_or_create(name='viewer')[0])\n"
            "from controlplane.access import issue_token\n"
            "print('TOKEN', issue_token(u, 'replica-test'))"))
        token = created.split("TOKEN", 1)[1].strip()
        session, ana = started(manage(env, "send_notices", "ana@example.com"))
        wait_for(lambda: replica_has(replica, session, 1), "the replica to replay seq 1")

        server = Daphne(tmp_path / "daphne.log", env)
        with running(server):
            browser = server.login("vic", "vic-pass-1234")
            page = browser.open(f"{server.http}/sessions/{session}/", timeout=10).read().decode()
            assert ana in page

            query(replica, "SELECT pg_wal_replay_pause()")
            try:
                _, ben = started(manage(env, "send_notices", "ben@example.com",
                                        "--session", session))  # seq 2
                time.sleep(0.5)
                stale = browser.open(f"{server.http}/sessions/{session}/", timeout=10)
                assert ben not in stale.read().decode(), "not read on the replica"
                assert not replica_has(replica, session, 2)

                # A page socket that showed seq 2 (say, from another web process), and
                # the overview's socket that showed the newest commit id.
                newest = query(primary, "SELECT max(id) AS id FROM kernel_commit")[0]["id"]
                shown: list[int] = []
                overview: list[int] = []
                with connect(f"{server.ws}/ws/ui/sessions/{session}/", open_timeout=10) as ws, \
                        connect(f"{server.ws}/ws/ui/overview/", open_timeout=10) as all_ws:
                    ws.send(json.dumps({"token": token, "after": 2}))
                    all_ws.send(json.dumps({"token": token, "after": newest}))
                    _, cai = started(manage(env, "send_notices", "cai@example.com",
                                            "--session", session))  # seq 3
                    deadline = time.monotonic() + 15
                    while 3 not in shown and time.monotonic() < deadline:
                        shown += [int(s) for s in SEQ.findall(ws.recv(timeout=15))]
                    while not any(i > newest for i in overview) and time.monotonic() < deadline:
                        overview += [int(s) for s in SEQ.findall(all_ws.recv(timeout=15))]
                assert 3 in shown, "the commit made while the replica lags was not shown"
                assert min(shown) >= 2, f"the socket went back: {shown}"
                assert overview and min(overview) > newest, f"the overview went back: {overview}"
                overview_page = browser.open(f"{server.http}/", timeout=10).read().decode()
                assert max(map(int, SEQ.findall(overview_page))) < newest, "not the replica's"

                # A feed from 0: the replica has seq 1 only; every commit once, in order.
                with connect(f"{server.ws}/ws/sessions/{session}/feed/",
                             open_timeout=10) as ws:
                    ws.send(json.dumps({"token": token, "after": 0}))
                    seqs: list[int] = []
                    while len(seqs) < 3:
                        frame = json.loads(ws.recv(timeout=15))
                        if frame["type"] == "commit":
                            seqs.append(frame["seq"])
                assert seqs == [1, 2, 3]
            finally:
                query(replica, "SELECT pg_wal_replay_resume()")
            wait_for(lambda: replica_has(replica, session, 3), "the replica to catch up")
            page = browser.open(f"{server.http}/sessions/{session}/", timeout=10).read().decode()
            assert ben in page and cai in page
