"""The image's processes, started as plain processes from its entry point script
(``deploy/entrypoint.sh``) with the environment the image gives them (issue 14, points 1
and 6): production settings (``DJANGO_DEBUG=0``, a secret key), JSON logs.

On a database of its own that starts empty: web serves ``/healthz`` at once and
``/readyz`` 503 counting the unapplied migrations (named in its log); ``migrate`` exits 0;
``/readyz`` is 200;
a batch committed while the broker is unreachable (its message is not delivered) is
started by the worker from the commit's announcement, or else from beat's sweep, and advanced to
one message per recipient. Every
log line is JSON, the commits are logged, and once idle neither worker nor beat writes a
line per sweep.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.conf import settings

from controlplane.dev.ports import free_port, reserved_redis_url
from controlplane.dev.processes import ROOT, Process, process_env, start_provider, wait_for

ENTRYPOINT = ROOT / "deploy" / "entrypoint.sh"
RECIPIENTS = ["ana@example.com", "ben@example.com", "cai@example.com"]
pytestmark = [pytest.mark.slow]


def server_url(database: str) -> str:
    db = settings.DATABASES["default"]
    host, port = db["HOST"] or "127.0.0.1", db["PORT"] or "5432"
    if host.startswith("/"):
        return f"postgresql://{db['USER'] or 'postgres'}@/{database}?host={host}&port={port}"
    return f"postgresql://{db['USER'] or 'postgres'}@{host}:{port}/{database}"


@pytest.fixture
def empty_database() -> Iterator[str]:
    """A database of its own on the test server, created empty and dropped afterwards."""
    name = f"processes_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url("postgres"), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        yield server_url(name)
    finally:
        with psycopg.connect(server_url("postgres"), autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def get(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def entry_process(name: str, env: dict[str, str], logs: Path, **kwargs: Any) -> Process:
    return Process(name, [str(ENTRYPOINT), name], log=logs / f"{name}.log", env=env, **kwargs)


def json_lines(process: Process) -> list[dict[str, Any]]:
    lines = [line for line in process.output().splitlines() if line.strip()]
    parsed = []
    for line in lines:
        try:
            parsed.append(json.loads(line))
        except json.JSONDecodeError:
            pytest.fail(f"{process.name} wrote a line that is not JSON: {line!r}")
    return parsed


def batch_state(database_url: str) -> tuple[str, dict[str, Any] | None] | None:
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT status, outcome FROM kernel_task WHERE kind = 'send-batch'").fetchone()
    return (row[0], row[1]) if row else None


def test_the_processes_run_from_the_entry_point_with_production_settings(
    tmp_path: Path, empty_database: str
) -> None:
    port = free_port()
    with reserved_redis_url(settings.REDIS_URL) as redis_url, start_provider() as provider:
        env = process_env(
            empty_database, redis_url, PYTHON=sys.executable, DJANGO_DEBUG="0",
            DJANGO_SECRET_KEY="processes-test-" + uuid.uuid4().hex * 2,
            DJANGO_ALLOWED_HOSTS="127.0.0.1", EMAIL_PROVIDER_URL=provider.url,
            LOG_FORMAT="json", LOG_LEVEL="info", WEB_BIND="127.0.0.1", PORT=str(port),
            BEAT_SCHEDULE_FILE=str(tmp_path / "beat-schedule"),
        )
        env.pop("DJANGO_SETTINGS_MODULE", None)  # the image sets none: the product's own
        base = f"http://127.0.0.1:{port}"

        def alive() -> bool:
            try:
                return get(f"{base}/healthz")[0] == 200
            except OSError:
                return False

        web = entry_process("web", env, tmp_path, ready_check=alive)
        worker = entry_process("worker", env, tmp_path, ready_line=" ready.")
        beat = entry_process("beat", env, tmp_path)
        processes = [web]
        try:
            web.start()
            status, body = get(f"{base}/readyz")
            assert status == 503 and body["missing"]["migrations"].endswith(
                " not applied"), body
            assert "controlplane.0001_session_store" not in str(body)  # in the log only
            assert "controlplane.0001_session_store" in web.output()
            time.sleep(2.1)  # past the probe's reuse of its last answer

            migrate = subprocess.run([str(ENTRYPOINT), "migrate"], env=env, cwd=tmp_path,
                                     capture_output=True, text=True, timeout=180)
            assert migrate.returncode == 0, migrate.stdout + migrate.stderr
            assert get(f"{base}/readyz") == (200, {"status": "ok"})

            processes += [worker.spawn(), beat.spawn()]
            worker.wait_ready()
            beat.wait_ready()
            # The broker is unreachable for this commit. The command sends its message at
            # once (KERNEL_LISTEN=0: it does not hold it for the worker's announcement
            # reader), which fails; the reader, started by the commit's announcement, or
            # else beat's sweep delivers the batch.
            start = subprocess.run(
                [sys.executable, "manage.py", "send_notices", *RECIPIENTS],
                env={**env, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
                     "KERNEL_LISTEN": "0"},
                cwd=ROOT, capture_output=True, text=True, timeout=120,
            )
            assert start.returncode == 0, start.stdout + start.stderr
            assert "could not deliver" in start.stderr
            done = wait_for(
                lambda: (s := batch_state(empty_database)) and s[0] == "terminal" and s,
                "the worker to finish the batch", timeout=60)
            assert done[1] is not None and done[1]["kind"] == "succeeded", done
            messages = provider_messages(provider.url)
            assert sorted(m["to"] for m in messages) == RECIPIENTS

            # Idle: a few sweeps go by, and neither worker nor beat says anything. Once
            # the batch's own messages are handled: under load its reader may claim a task
            # after the grace of the task's message (which then finds it claimed) or
            # before the sweep re-sends the command's undelivered row, and those messages
            # may still be waiting for the worker when the batch is done.
            wait_for(lambda: delivered(empty_database, redis_url),
                     "the worker to handle what was sent for the batch", timeout=60)
            time.sleep(1.5)  # the batch's last lines are out
            before = {p.name: len(p.output()) for p in (worker, beat)}
            time.sleep(3.5)
            assert {p.name: len(p.output()) for p in (worker, beat)} == before, (
                worker.output()[before["worker"]:] + beat.output()[before["beat"]:])

            worker_lines, beat_lines = json_lines(worker), json_lines(beat)
            json_lines(web)
            commits = [line for line in worker_lines if line["logger"] == "controlplane.commits"]
            assert commits and all({"session", "seq", "actor", "tasks"} <= set(c) for c in commits)
            assert any(t.get("outcome") == "succeeded" and t["kind"] == "send-batch"
                       for c in commits for t in c["tasks"])
            assert not any("controlplane.sweep" in line["message"]
                           for line in worker_lines + beat_lines)
        finally:
            for process in processes:
                process.stop()
        assert web.popen.returncode == 0 and worker.popen.returncode == 0, (
            web.output()[-2000:], worker.output()[-2000:])


def delivered(database_url: str, redis_url: str) -> bool:
    """Whether nothing is left to deliver: no dispatch row (what a message is sent for) and
    no message in the broker, waiting in a queue or taken and not yet acknowledged (late
    acknowledgement: after its task returned and Celery logged so)."""
    import redis

    with psycopg.connect(database_url) as conn:
        if conn.execute("SELECT count(*) FROM kernel_dispatch").fetchone()[0]:
            return False
    broker = redis.Redis.from_url(redis_url)
    return not broker.hlen("unacked") and not any(
        broker.type(key) == b"list" for key in broker.scan_iter())


def provider_messages(url: str) -> list[dict[str, Any]]:
    from controlplane.dev.provider_admin import ProviderAdmin

    return ProviderAdmin(url).messages()


def test_readyz_names_an_unreachable_broker(
    client: Any, db: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.test import override_settings

    from controlplane.web import health

    monkeypatch.setattr(health, "READINESS_SECONDS", 0.0)  # every probe asks again
    assert client.get("/readyz").json() == {"status": "ok"}
    with override_settings(CELERY_BROKER_URL=f"redis://127.0.0.1:{free_port()}/0"):
        answer = client.get("/readyz")
    assert answer.status_code == 503
    assert answer.json()["missing"] == {"broker": "unreachable"}

