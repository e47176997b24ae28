"""Django settings for the durable control plane.

Everything that differs between a laptop, CI and a deployment comes from the
environment: ``DATABASE_URL``, ``REDIS_URL``, ``DJANGO_SECRET_KEY``, ``DJANGO_DEBUG``,
``DJANGO_ALLOWED_HOSTS``, ``DJANGO_CSRF_TRUSTED_ORIGINS``, ``DJANGO_HTTPS`` and the
limits below (docs/security.md lists them all). ``make services`` resolves the first two
(shared servers or embedded ones under ``.data/``) and writes them to
``.data/services.env``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

from controlplane import model_catalog
from controlplane.process import logs
from controlplane.web import client_address

BASE_DIR = Path(__file__).resolve().parent.parent

DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/durable"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


def parse_database_url(url: str) -> dict[str, Any]:
    """Turn a libpq-style URL into a Django ``DATABASES`` entry.

    Small on purpose (no dj-database-url dependency). Understands
    ``postgresql://user:pass@host:port/dbname?opt=val``, a percent-encoded socket
    directory as host, and ``?host=/socket/dir`` (the form ``make services`` writes for
    the embedded pgserver, which listens on a Unix socket only). Other query
    parameters (``sslmode``, ``connect_timeout``, ...) are passed to libpq as OPTIONS.
    """
    parts = urlsplit(url)
    if parts.scheme not in {"postgres", "postgresql", "pgsql"}:
        raise ValueError(f"DATABASE_URL must be a postgresql:// URL, got {parts.scheme!r}")
    options: dict[str, Any] = dict(parse_qsl(parts.query, keep_blank_values=True))
    raw_host = parts.netloc.rpartition("@")[2]
    if raw_host.lower().startswith("%2f"):
        # A percent-encoded socket directory; urlsplit().hostname would lowercase it.
        netloc_host = unquote(raw_host.partition(":")[0])
    else:
        netloc_host = parts.hostname or ""
    host = options.pop("host", None) or netloc_host
    port = options.pop("port", None) or (str(parts.port) if parts.port else "")
    # Django leaves psycopg's statement preparation off (threshold None), which also
    # ignores an explicit prepare=True. The kernel's commit path asks for it on its few
    # hot statements; the ORM's client-side-binding cursors never prepare either way.
    # Behind a transaction-mode pooler, set ?prepare_threshold= to an empty value.
    threshold = options.pop("prepare_threshold", "5")
    if threshold and not threshold.isdigit():
        raise ValueError(
            f"DATABASE_URL: prepare_threshold must be a count or empty, got {threshold!r}"
        )
    options["prepare_threshold"] = int(threshold) if threshold else None
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")) or "postgres",
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": host,
        "PORT": port,
        "OPTIONS": options,
        "CONN_MAX_AGE": int(os.environ.get("DJANGO_CONN_MAX_AGE", "60")),
        "CONN_HEALTH_CHECKS": True,
    }


def _env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def _env_list(name: str, default: str = "") -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


# DEBUG is for a laptop and the test suite only (`make demo` and tests/conftest.py ask for
# it): it shows tracebacks with settings, URLs with passwords among them, to anyone.
DEBUG = _env_bool("DJANGO_DEBUG", False)
BUILTIN_SECRET_KEY = "dev-insecure-secret-key-change-me-in-any-real-deployment"
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "").strip() or BUILTIN_SECRET_KEY
if SECRET_KEY == BUILTIN_SECRET_KEY and not DEBUG:
    raise ImproperlyConfigured(
        "DJANGO_SECRET_KEY is missing (or is the built-in development key): sessions, CSRF "
        "tokens and password resets would be forgeable. Set it to a long random value, e.g. "
        "`python -c 'import secrets; print(secrets.token_urlsafe(50))'`, or set "
        "DJANGO_DEBUG=1 on a development machine only."
    )
# A key anyone could guess is as good as none: held to Django's own rule for a deployment
# (`check --deploy`, security.W009), at start-up rather than in a check nobody runs.
if not DEBUG and (len(SECRET_KEY) < 50 or len(set(SECRET_KEY)) < 5
                  or SECRET_KEY.startswith("django-insecure-")):
    raise ImproperlyConfigured(
        "DJANGO_SECRET_KEY is too weak: it needs 50 or more characters, 5 or more of them "
        "different, and no 'django-insecure-' prefix. Make one with "
        "`python -c 'import secrets; print(secrets.token_urlsafe(50))'`."
    )
ALLOWED_HOSTS = _env_list("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver")
# Origins (scheme://host[:port]) besides the served one that may post forms and open
# websockets: the public address(es) when a proxy serves the app under another name.
CSRF_TRUSTED_ORIGINS = _env_list("DJANGO_CSRF_TRUSTED_ORIGINS")

# Served over TLS (DJANGO_HTTPS=1): cookies only over HTTPS, HSTS, and plain HTTP
# redirected (the health check aside, for probes). Behind a proxy that terminates TLS
# and sets `X-Forwarded-Proto` (overwriting any the client sent), DJANGO_TLS_PROXY=1
# lets Django trust that header.
HTTPS = _env_bool("DJANGO_HTTPS", False)
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = HTTPS
SECURE_SSL_REDIRECT = HTTPS
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$"]
SECURE_HSTS_SECONDS = int(os.environ.get("DJANGO_HSTS_SECONDS", "31536000")) if HTTPS else 0
SECURE_HSTS_INCLUDE_SUBDOMAINS = HTTPS and _env_bool("DJANGO_HSTS_INCLUDE_SUBDOMAINS", True)
SECURE_HSTS_PRELOAD = HTTPS and _env_bool("DJANGO_HSTS_PRELOAD", True)
if _env_bool("DJANGO_TLS_PROXY", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
# A dashboard login lasts a working day, not Django's two weeks.
SESSION_COOKIE_AGE = int(os.environ.get("DJANGO_SESSION_SECONDS", str(8 * 3600)))
SESSION_COOKIE_SAMESITE = CSRF_COOKIE_SAMESITE = "Lax"
# The proxies whose X-Forwarded-For is believed (addresses or networks, comma-separated;
# none by default: the TCP peer is the client). Behind nginx, its address, with nginx
# setting `X-Forwarded-For $remote_addr` (controlplane.web.client_address).
try:
    TRUSTED_PROXIES = [
        str(net) for net in client_address.parse_networks(_env_list("DJANGO_TRUSTED_PROXIES"))]
except ValueError as bad:
    raise ImproperlyConfigured(str(bad)) from None
# Login throttling (the dashboard's and the admin's login): after this many failed
# logins within LOGIN_THROTTLE_SECONDS for one account (its name as Django compares it:
# NFKC, any case), or from one address (an IPv6 /64), logins for it are refused until
# the oldest failure is that old.
LOGIN_FAILURES_PER_ACCOUNT = int(os.environ.get("LOGIN_FAILURES_PER_ACCOUNT", "5"))
LOGIN_FAILURES_PER_ADDRESS = int(os.environ.get("LOGIN_FAILURES_PER_ADDRESS", "20"))
LOGIN_THROTTLE_SECONDS = float(os.environ.get("LOGIN_THROTTLE_SECONDS", "900"))
# What Prometheus sends as `Authorization: Bearer ...` to scrape /metrics (empty: only a
# logged-in operator may read them).
METRICS_TOKEN = os.environ.get("METRICS_TOKEN", "")

DATABASE_URL = os.environ.get("DATABASE_URL") or DEFAULT_DATABASE_URL
REDIS_URL = os.environ.get("REDIS_URL") or DEFAULT_REDIS_URL

INSTALLED_APPS = [
    # daphne first: its `runserver` serves the ASGI app (websockets included).
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    # django-ninja as an app: /api/docs loads Swagger UI from ninja's own static files
    # (pinned with it in requirements.txt), served from this origin, not from a CDN.
    "ninja",
    "controlplane",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "controlplane.web.middleware.ContentSecurityPolicy",
    "controlplane.web.middleware.RejectUnstorableText",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "controlplane.web.middleware.LimitRequestRates",
    "controlplane.web.middleware.NameTheCredential",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "controlplane.web.middleware.AnswerStorageDown",
]

ROOT_URLCONF = "controlplane.urls"
ASGI_APPLICATION = "controlplane.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "controlplane.ui.access.role",
            ],
        },
    },
]

DATABASES = {"default": parse_database_url(DATABASE_URL)}
# A streaming replica of it, optional: pages, the feeds' catch-up reads and the metrics
# read there; commits, claims, actions and everything else stay on the primary
# (controlplane.reads.replica). Its tests mirror the primary's database.
DATABASE_REPLICA_URL = os.environ.get("DATABASE_REPLICA_URL", "").strip()
if DATABASE_REPLICA_URL:
    DATABASES["replica"] = {
        **parse_database_url(DATABASE_REPLICA_URL), "TEST": {"MIRROR": "default"}}
DATABASE_ROUTERS = ["controlplane.reads.replica.Router"]

# Channels: live views are pushed through Redis so that events raised in Celery
# workers reach consumers in the web process. Messages only say "commit N happened";
# consumers read the data of record from Postgres (DESIGN §9, §13).
#
# channels_redis drops a group message for a channel over `capacity` (and logs it at
# INFO), and expires unread messages after `expiry` seconds: losing a hint costs only
# latency, since consumers also poll the log. CHANNEL_LAYER_CAPACITY=1 makes drops
# routine (the e2e tests use it). A group membership lasts `group_expiry` seconds: the
# web process's hint hub (controlplane.sockets.notify.HintHub) renews its memberships every
# minute, and a websocket must not outlive its group anyway: run Daphne with
# `--websocket_timeout` below it (DAPHNE_WEBSOCKET_TIMEOUT, Daphne's own default).
CHANNEL_LAYER_CAPACITY = int(os.environ.get("CHANNEL_LAYER_CAPACITY", "100"))
CHANNEL_LAYER_EXPIRY = int(os.environ.get("CHANNEL_LAYER_EXPIRY", "60"))
CHANNEL_LAYER_GROUP_EXPIRY = int(os.environ.get("CHANNEL_LAYER_GROUP_EXPIRY", str(2 * 86400)))
DAPHNE_WEBSOCKET_TIMEOUT = int(os.environ.get("DAPHNE_WEBSOCKET_TIMEOUT", "86400"))
if DAPHNE_WEBSOCKET_TIMEOUT >= CHANNEL_LAYER_GROUP_EXPIRY:
    raise ValueError(
        "DAPHNE_WEBSOCKET_TIMEOUT must be below CHANNEL_LAYER_GROUP_EXPIRY: a socket that "
        "outlives its group membership stops getting hints"
    )
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {
            "hosts": [REDIS_URL],
            "capacity": CHANNEL_LAYER_CAPACITY,
            "expiry": CHANNEL_LAYER_EXPIRY,
            "group_expiry": CHANNEL_LAYER_GROUP_EXPIRY,
        },
    },
}
# The change feed: how often a websocket consumer (controlplane.sockets.feed) reads the log
# without a hint (the safety net for dropped hints), how long a quiet socket goes before
# a heartbeat frame, and how often a REST long-poll (controlplane.api.feed) reads the log.
FEED_POLL_SECONDS = float(os.environ.get("FEED_POLL_SECONDS", "1.5"))
FEED_HEARTBEAT_SECONDS = float(os.environ.get("FEED_HEARTBEAT_SECONDS", "15"))
FEED_LONG_POLL_SECONDS = float(os.environ.get("FEED_LONG_POLL_SECONDS", "0.2"))
# How often an open websocket checks its credential again (a revoked or expired token, a
# logout, a lost role close it within this time; controlplane.sockets.feed).
WEBSOCKET_RECHECK_SECONDS = float(os.environ.get("WEBSOCKET_RECHECK_SECONDS", "5"))
# Work one account may hold at once, counted in Redis across web processes
# (controlplane.sockets.slots): open websockets (beyond: closed with 4429) and long-polling
# requests (beyond: 429 with Retry-After). A slot of a web process that died is freed
# USER_SLOT_SECONDS after its last renewal.
USER_SOCKET_LIMIT = int(os.environ.get("USER_SOCKET_LIMIT", "20"))
USER_LONG_POLL_LIMIT = int(os.environ.get("USER_LONG_POLL_LIMIT", "5"))
USER_SLOT_SECONDS = float(os.environ.get("USER_SLOT_SECONDS", "30"))
# How long one statement of a web process may run before Postgres cancels it (the request
# is answered 503 saying so); 0: unbounded. Workers and commands are not bounded
# (controlplane.web.request_connections).
WEB_STATEMENT_TIMEOUT_SECONDS = float(os.environ.get("WEB_STATEMENT_TIMEOUT_SECONDS", "5"))
# Request rates, counted in Redis across web processes (controlplane.web.rates): per account
# and per client address, requests per second on average and at once; beyond them
# 429 with Retry-After. 0 requests per second: not counted.
USER_REQUESTS_PER_SECOND = float(os.environ.get("USER_REQUESTS_PER_SECOND", "10"))
USER_REQUEST_BURST = int(os.environ.get("USER_REQUEST_BURST", "50"))
ADDRESS_REQUESTS_PER_SECOND = float(os.environ.get("ADDRESS_REQUESTS_PER_SECOND", "30"))
ADDRESS_REQUEST_BURST = int(os.environ.get("ADDRESS_REQUEST_BURST", "150"))
# What one account's requests may take of the server's time, counted like the rates: its
# requests' seconds (a long-poll's wait excluded) per second on average, and at once
# (each charged a second as it starts, so this over a second, plus one, is also how many
# it can start at once); an account further in arrears is answered 429 until it is paid
# off. 0 seconds per second: not counted.
USER_SERVER_SECONDS_PER_SECOND = float(os.environ.get("USER_SERVER_SECONDS_PER_SECOND", "0.5"))
USER_SERVER_SECONDS_BURST = float(os.environ.get("USER_SERVER_SECONDS_BURST", "5"))
# In each web process an account's requests and live-page renders run one at a time
# (controlplane.web.turns); one waits for its turn up to this many seconds, then a request
# is answered 429 and a render is not made. 0: an account's work runs at once.
USER_TURN_WAIT_SECONDS = float(os.environ.get("USER_TURN_WAIT_SECONDS", "10"))

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
# The dashboard's login (session auth, CSRF on every form).
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "overview"
LOGOUT_REDIRECT_URL = "login"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = BASE_DIR / ".data" / "staticfiles"

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Logs: LOG_LEVEL (INFO), LOG_FORMAT=text|json; what happened at INFO, routine at DEBUG
# (controlplane.process.logs). Celery's worker and beat apply the same (controlplane.celery).
LOGGING = logs.config()
LOGGING_CONFIG = "controlplane.process.logs.apply"

# --------------------------------------------------------------------------- execution
# Celery carries only "advance task X" and the sweep; Postgres decides who runs what
# (DESIGN §7). acks_late + prefetch 1: a killed worker's message goes back to the
# queue, and the database lease makes the duplicate harmless.
CELERY_BROKER_URL = REDIS_URL
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_DEFAULT_QUEUE = "default"
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A commit must not wait long on a broker that is down: the sweep re-delivers.
CELERY_TASK_PUBLISH_RETRY_POLICY = {"max_retries": 1, "interval_start": 0, "interval_step": 0.2}
CELERY_BROKER_TRANSPORT_OPTIONS = {"socket_connect_timeout": 2, "socket_timeout": 5}
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# Celery's Django fix-up closes the database connection before and after every task
# unless this is set: each message then paid a new connection (a backend fork) and
# lost the commit path's prepared statements. Our tasks call close_old_connections()
# themselves, which drops a connection that failed or is older than CONN_MAX_AGE, and
# the health check (CONN_HEALTH_CHECKS) replaces one that died idle (a restarted
# Postgres). The fix-up counts its calls (two a task) and closes after 2 x this many:
# in effect never.
CELERY_DB_REUSE_MAX = 1_000_000_000

# Renewed every third of it while a phase runs (KERNEL_HEARTBEAT), so a short lease costs
# a renewal every 5 s and lets the sweep recover a dead worker's task 15 s after its
# last renewal at most.
KERNEL_LEASE_SECONDS = float(os.environ.get("KERNEL_LEASE_SECONDS", "15"))
KERNEL_SWEEP_SECONDS = float(os.environ.get("KERNEL_SWEEP_SECONDS", "1"))
KERNEL_REDELIVER_SECONDS = float(os.environ.get("KERNEL_REDELIVER_SECONDS", "30"))
# A commit (or sweep) that makes up to KERNEL_DISPATCH_MESSAGES tasks of one queue
# runnable sends a message per task; a bigger burst sends that many queue messages instead,
# each making a worker claim and run the queue's runnable tasks one after another from
# Postgres for KERNEL_CLAIM_SECONDS (then it sends a queue message for the rest). Such a worker
# commits the endings of up to KERNEL_ENDINGS_PER_COMMIT quick tasks of one session in
# one commit.
KERNEL_DISPATCH_MESSAGES = int(os.environ.get("KERNEL_DISPATCH_MESSAGES", "32"))
KERNEL_CLAIM_SECONDS = float(os.environ.get("KERNEL_CLAIM_SECONDS", "1"))
KERNEL_ENDINGS_PER_COMMIT = int(os.environ.get("KERNEL_ENDINGS_PER_COMMIT", "10"))
# Idle workers LISTEN for the tasks a commit announces on the due channel and claim them
# at once (controlplane.worker.announcements). A committer then holds each such task's
# message for KERNEL_HINT_GRACE_MS (the announcement's grace: the variable keeps its
# name) and sends it only if no worker claimed the task meanwhile
# (kernel.dispatch.HeldMessages); a busy worker waits that long for a slot to free
# before it leaves an announced task to its message. Long enough for a worker to end a
# short phase: under a steady stream of tasks the workers then take them from Postgres
# and the broker carries almost no messages; short enough that a task whose announcement
# nobody heard is not kept waiting long. Set KERNEL_LISTEN the same for web, workers
# and beat.
KERNEL_LISTEN = _env_bool("KERNEL_LISTEN", True)
KERNEL_HINT_GRACE_MS = float(os.environ.get("KERNEL_HINT_GRACE_MS", "50"))
# SIGTERM to a worker: how long its running phases may take to finish before it gives
# their leases back and exits (controlplane.worker.execution.drain). Keep the process manager's
# stop timeout (compose: stop_grace_period) above it.
KERNEL_DRAIN_SECONDS = float(os.environ.get("KERNEL_DRAIN_SECONDS", "25"))
# The function that builds this deployment's Registry: every task and document kind its
# processes run (the reference apps, and what the two settings below add).
KERNEL_REGISTRY = os.environ.get("KERNEL_REGISTRY",
                                 "controlplane.reference.registry.build_registry")
# Dotted paths of ``register(registry)`` callables adding task kinds to the project's
# registry (comma-separated), e.g. the benchmarks' no-op kind (``benchmarks._support.noop``).
KERNEL_TASK_MODULES = [p for p in os.environ.get("KERNEL_TASK_MODULES", "").split(",") if p]
# Framework agents a submission may name ({"agent": "support"}): name -> dotted path of
# a Pydantic AI Agent built with KernelDurability (kernel.hosts.pydantic_ai). JSON in the
# environment, e.g. {"support": "myapp.agents.support"}.
KERNEL_AGENTS: dict[str, str] = json.loads(os.environ.get("KERNEL_AGENTS") or "{}")
# Retention (kernel.retention, `manage.py prune`, daily from beat): a finished session's
# history (commits, entries, old document versions) goes once its last commit is older
# than KERNEL_RETENTION_DAYS (unset: kept forever), or the days for its status in
# KERNEL_RETENTION_DAYS_BY_STATUS ("failed=90,succeeded=7"; unset keeps the default),
# or its own metadata["retention_days"].
def _days(name: str, text: str) -> float:
    try:
        days = float(text)
    except ValueError:
        days = -1.0
    if not days >= 0:  # also NaN
        raise ImproperlyConfigured(f"{name}: {text!r} is not a number of days (0 or more)")
    return days


KERNEL_RETENTION_DAYS = (
    _days("KERNEL_RETENTION_DAYS", os.environ["KERNEL_RETENTION_DAYS"])
    if os.environ.get("KERNEL_RETENTION_DAYS", "").strip() else None
)
KERNEL_RETENTION_DAYS_BY_STATUS = {
    status.strip(): _days(f"KERNEL_RETENTION_DAYS_BY_STATUS[{status.strip()}]", days)
    for status, _, days in (
        item.partition("=") for item in _env_list("KERNEL_RETENTION_DAYS_BY_STATUS")
    )
}
# The commit log is partitioned by "day" or "month" of its commits (storage.partitions);
# the partitions of the next KERNEL_COMMIT_PARTITIONS_AHEAD periods are made in advance.
KERNEL_COMMIT_PARTITION = os.environ.get("KERNEL_COMMIT_PARTITION", "month")
KERNEL_COMMIT_PARTITIONS_AHEAD = int(os.environ.get("KERNEL_COMMIT_PARTITIONS_AHEAD", "2"))
# When beat runs the prune: once a day at this UTC hour.
KERNEL_PRUNE_HOUR = int(os.environ.get("KERNEL_PRUNE_HOUR", "3"))
# Off only to test what happens when renewals stop (a stuck process, a long GC pause).
KERNEL_HEARTBEAT = _env_bool("KERNEL_HEARTBEAT", True)

# The worker registry (controlplane.worker.heartbeats): each worker process writes its row
# every WORKER_HEARTBEAT_SECONDS; one silent for WORKER_DEAD_SECONDS is shown dead and the
# sweep ends its leases at once (keep it at least four beats long: a live worker taken for
# dead has its phases restarted, and a sweeper's own run of beats is broken by a silence
# of half of it: controlplane.worker.heartbeats.gap), and one gone for
# WORKER_FORGET_SECONDS is no longer listed.
def _seconds(name: str, default: str) -> float:
    text = os.environ.get(name, default)
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < float("inf"):  # also NaN
        raise ImproperlyConfigured(f"{name}: {text!r} is not a number of seconds above 0")
    return seconds


WORKER_HEARTBEAT_SECONDS = _seconds("WORKER_HEARTBEAT_SECONDS", "2")
WORKER_DEAD_SECONDS = _seconds("WORKER_DEAD_SECONDS", "10")
WORKER_FORGET_SECONDS = _seconds("WORKER_FORGET_SECONDS", "3600")
if WORKER_DEAD_SECONDS < 4 * WORKER_HEARTBEAT_SECONDS:
    raise ImproperlyConfigured(
        f"WORKER_DEAD_SECONDS: {WORKER_DEAD_SECONDS} is less than four heartbeats "
        f"(WORKER_HEARTBEAT_SECONDS={WORKER_HEARTBEAT_SECONDS}): the sweep would take live "
        "workers for dead after an outage")

# Where large values (kernel.artifacts) are stored: Postgres (table kernel_artifact) unless
# ARTIFACT_S3_ENDPOINT names an S3-compatible store, whose bucket ARTIFACT_S3_BUCKET must
# exist; its credentials come from the usual AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY.
ARTIFACT_S3_ENDPOINT = os.environ.get("ARTIFACT_S3_ENDPOINT", "")
ARTIFACT_S3_BUCKET = os.environ.get("ARTIFACT_S3_BUCKET", "artifacts")

# Modules whose ``TOOLS`` (a list of kernel.agent.Tool) the assistant offers besides its
# own, comma-separated: how a deployment adds tools, and how chaos tests put killable
# tools into real worker processes.
ASSISTANT_TOOL_MODULES = [
    name.strip() for name in os.environ.get("ASSISTANT_TOOL_MODULES", "").split(",") if name.strip()
]

# The assistant's send_notices asks an operator to approve a call to more than this many
# recipients before it sends anything (0: every call); a call nobody decides on within
# NOTICE_APPROVAL_TIMEOUT seconds is denied. See docs/agents.md, "The approval gate".
NOTICE_APPROVAL_ABOVE = int(os.environ.get("NOTICE_APPROVAL_ABOVE", "10"))
NOTICE_APPROVAL_TIMEOUT = float(os.environ.get("NOTICE_APPROVAL_TIMEOUT", "86400"))

# The models a submission may name (controlplane/model_catalog.py, docs/models.md): MODELS
# (JSON) or MODELS_FILE (TOML or JSON), each model by name with its provider, server,
# key variable, the model name the server expects, context window and prices. The demo's
# "scripted" model is always there; DEFAULT_MODEL answers a submission that names none.
MODELS = model_catalog.load(os.environ)
DEFAULT_MODEL = os.environ.get("DEFAULT_MODEL", model_catalog.SCRIPTED)
if DEFAULT_MODEL not in MODELS:
    raise ImproperlyConfigured(
        f"DEFAULT_MODEL: {DEFAULT_MODEL!r} is not a configured model ({', '.join(MODELS)})")
# Prices per million tokens by model name, for the cost the dashboard shows beside each
# model call's usage (a model without prices shows its tokens only).
MODEL_PRICES: dict[str, dict[str, float]] = {
    name: model.prices for name, model in MODELS.items() if model.prices}

# Traces (controlplane/process/telemetry.py, docs/models.md): spans are exported with OTLP/HTTP
# when OTEL_EXPORTER_OTLP_ENDPOINT is set (the standard OTEL_* variables apply), off
# otherwise. TRACE_URL, such as https://jaeger.example/trace/{trace_id}, links a task's
# trace id on its page.
TRACE_URL = os.environ.get("TRACE_URL", "")

# --------------------------------------------------------------------------- notices
# The HTTP provider contract is in docs/email-provider.md; any provider that keeps it
# can be plugged in by URL.
EMAIL_PROVIDER_URL = os.environ.get("EMAIL_PROVIDER_URL", "http://127.0.0.1:8025")
EMAIL_PROVIDER_TIMEOUT = float(os.environ.get("EMAIL_PROVIDER_TIMEOUT", "10"))
EMAIL_HOST = os.environ.get("SMTP_HOST", "127.0.0.1")
EMAIL_PORT = int(os.environ.get("SMTP_PORT", "1025"))
DEFAULT_FROM_EMAIL = os.environ.get("NOTICES_FROM", "notices@example.com")
