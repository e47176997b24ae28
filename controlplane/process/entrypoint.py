"""The one entry point of the container image:
``python -m controlplane.process.entrypoint ROLE [ARGS]``
(``deploy/entrypoint.sh ROLE`` in the image). The role picks the program; its settings
come from the environment (docs/deploy.md lists them); ``ARGS`` are appended to the
program's own (a later option wins), e.g. ``worker --concurrency 8``.

- ``web``: Daphne (HTTP + websockets) on ``WEB_BIND``:``PORT`` (``0.0.0.0:8000``),
  ``DAPHNE_WEBSOCKET_TIMEOUT``; its access log only with ``WEB_ACCESS_LOG=1``. Without
  Daphne's ``--proxy-headers``, which would believe the first ``X-Forwarded-For`` entry
  (the client's choice) from any peer: the app reads that header only from the proxies
  in ``DJANGO_TRUSTED_PROXIES`` (controlplane.web.client_address).
- ``worker``: a Celery worker on ``WORKER_QUEUES`` (``default,hands,brain``) with
  ``WORKER_CONCURRENCY`` phases at once (``1``: the solo pool; more: threads, one kernel
  runtime per process either way), named ``WORKER_NAME@hostname``. Run one pool per
  queue set (``brain`` for model turns, ``hands`` for tools and sends) to scale them
  apart. SIGTERM drains it (``KERNEL_DRAIN_SECONDS``).
- ``beat``: Celery beat (the once-a-second sweep), schedule in ``BEAT_SCHEDULE_FILE``.
  Two beats are harmless (the sweep is idempotent), one is enough.
- ``migrate``: apply the database migrations and exit (0 when done).

``LOG_LEVEL`` and ``LOG_FORMAT`` (text|json) apply to every role (controlplane.process.logs).
The process replaces this one (``exec``), so signals reach it directly.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

ROLES = ("web", "worker", "beat", "migrate")
ROOT = Path(__file__).resolve().parents[2]  # the checkout: manage.py beside controlplane/
CELERY = ["-m", "celery", "-A", "controlplane.celery"]


def command(role: str, args: Sequence[str] = (), env: Mapping[str, str] = os.environ) -> list[str]:
    """The argv that runs ``role`` with this environment (the first item is the program)."""
    python = sys.executable
    level = env.get("LOG_LEVEL", "info").lower()
    # Celery's start-up banners are printed, not logged: off when every line must be JSON.
    celery = [*CELERY, "-q"] if env.get("LOG_FORMAT", "text").lower() == "json" else CELERY
    if role == "web":
        return [
            python, "-m", "daphne", "-b", env.get("WEB_BIND", "0.0.0.0"),
            "-p", env.get("PORT", "8000"),
            "--websocket_timeout", env.get("DAPHNE_WEBSOCKET_TIMEOUT", "86400"),
            "--application-close-timeout", env.get("WEB_CLOSE_TIMEOUT", "10"),
            # Daphne's access log (plain text, every probe included) only when asked:
            # the proxy in front keeps one.
            "-v", "1" if env.get("WEB_ACCESS_LOG", "") in ("1", "true", "yes") else "0",
            *args, "controlplane.asgi:application",
        ]
    if role == "worker":
        concurrency = int(env.get("WORKER_CONCURRENCY", "1"))
        pool = ["-P", "solo"] if concurrency <= 1 else ["-P", "threads", "-c", str(concurrency)]
        return [
            python, *celery, "worker", *pool,
            "-Q", env.get("WORKER_QUEUES", "default,hands,brain"),
            "-n", f"{env.get('WORKER_NAME', 'worker')}@%h",
            "--without-mingle", "--without-gossip", "-l", level, *args,
        ]
    if role == "beat":
        schedule = env.get("BEAT_SCHEDULE_FILE") or str(
            Path(tempfile.gettempdir()) / "celerybeat-schedule")
        return [python, *celery, "beat", "-s", schedule, "-l", level, *args]
    if role == "migrate":
        return [python, str(ROOT / "manage.py"), "migrate", "--noinput", *args]
    raise ValueError(f"unknown role {role!r}; one of {', '.join(ROLES)}")


def main(argv: Sequence[str]) -> None:
    if not argv or argv[0] not in ROLES:
        sys.exit(f"usage: entrypoint ROLE [ARGS...]; ROLE is one of {', '.join(ROLES)}")
    argv_out = command(argv[0], argv[1:])
    os.chdir(ROOT)
    os.execv(argv_out[0], argv_out)


if __name__ == "__main__":
    main(sys.argv[1:])
