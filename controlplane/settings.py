"""Django settings for the durable control plane.

Everything that differs between a laptop, CI and a deployment comes from the
environment: ``DATABASE_URL``, ``REDIS_URL``, ``DJANGO_SECRET_KEY``, ``DJANGO_DEBUG``,
``DJANGO_ALLOWED_HOSTS``. ``make services`` resolves the first two (shared servers or
embedded ones under ``.data/``) and writes them to ``.data/services.env``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

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
    options = dict(parse_qsl(parts.query, keep_blank_values=True))
    raw_host = parts.netloc.rpartition("@")[2]
    if raw_host.lower().startswith("%2f"):
        # A percent-encoded socket directory; urlsplit().hostname would lowercase it.
        netloc_host = unquote(raw_host.partition(":")[0])
    else:
        netloc_host = parts.hostname or ""
    host = options.pop("host", None) or netloc_host
    port = options.pop("port", None) or (str(parts.port) if parts.port else "")
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")) or "postgres",
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": host,
        "PORT": port,
        "OPTIONS": options,
        "CONN_MAX_AGE": int(os.environ.get("DJANGO_CONN_MAX_AGE", "0")),
        "CONN_HEALTH_CHECKS": True,
    }


def _env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


SECRET_KEY = os.environ.get(
    "DJANGO_SECRET_KEY", "dev-insecure-secret-key-change-me-in-any-real-deployment"
)
DEBUG = _env_bool("DJANGO_DEBUG", True)
ALLOWED_HOSTS = os.environ.get(
    "DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver"
).split(",")

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
    "controlplane",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
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
            ],
        },
    },
]

DATABASES = {"default": parse_database_url(DATABASE_URL)}

# Channels: live views are pushed through Redis so that events raised in Celery
# workers reach consumers in the web process. Messages only say "commit N happened";
# consumers read the data of record from Postgres (DESIGN §9, §13).
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {"hosts": [REDIS_URL]},
    },
}

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
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = BASE_DIR / ".data" / "staticfiles"

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
