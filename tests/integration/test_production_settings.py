"""Production settings (issue 15, point 1): DEBUG off unless asked, no start-up on a
missing or built-in secret key, and ``check --deploy`` clean when served over TLS.

Each case runs ``manage.py`` in a process of its own with the environment a deployment
would give it (the suite's own DEBUG and secret key removed).
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys

import pytest
from django.contrib.auth.models import User

from controlplane.dev.processes import ROOT
from controlplane.management.commands.demo import demo_accounts
from controlplane.settings import BUILTIN_SECRET_KEY

PRODUCTION = {
    "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
    "DJANGO_HTTPS": "1",
    "DJANGO_ALLOWED_HOSTS": "dcp.example.com",
    "DJANGO_CSRF_TRUSTED_ORIGINS": "https://dcp.example.com",
}


def manage(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items()
             if k not in {"DJANGO_DEBUG", "DJANGO_SECRET_KEY", "DJANGO_HTTPS"}}
    clean["DJANGO_SETTINGS_MODULE"] = "controlplane.settings"
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env={**clean, **env},
        capture_output=True, text=True, timeout=120,
    )


def test_check_deploy_with_production_settings_reports_nothing() -> None:
    done = manage("check", "--deploy", "--fail-level", "WARNING", **PRODUCTION)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues (0 silenced)." in done.stdout
    assert "WARNINGS" not in done.stderr


@pytest.mark.parametrize("key", [None, "", BUILTIN_SECRET_KEY])
def test_start_up_without_a_secret_key_fails_with_a_clear_message(key: str | None) -> None:
    env = {k: v for k, v in PRODUCTION.items() if k != "DJANGO_SECRET_KEY"}
    if key is not None:
        env["DJANGO_SECRET_KEY"] = key
    done = manage("check", **env)
    assert done.returncode != 0
    assert "ImproperlyConfigured: DJANGO_SECRET_KEY is missing" in done.stderr
    assert "DJANGO_DEBUG=1" in done.stderr  # says what to do on a laptop
    # The ASGI server's entry point refuses the same way.
    clean = {k: v for k, v in os.environ.items() if k not in {"DJANGO_DEBUG", "DJANGO_SECRET_KEY"}}
    asgi = subprocess.run(
        [sys.executable, "-c", "import controlplane.asgi"], cwd=ROOT,
        env={**clean, **env, "DJANGO_SETTINGS_MODULE": "controlplane.settings"},
        capture_output=True, text=True, timeout=120,
    )
    assert asgi.returncode != 0 and "DJANGO_SECRET_KEY is missing" in asgi.stderr


def test_debug_is_off_unless_asked_and_tls_settings_follow_the_environment() -> None:
    show = ("shell", "--no-imports", "-c", "from django.conf import settings as s; print(s.DEBUG, "
            "s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, s.SECURE_HSTS_SECONDS > 0, "
            "s.SECURE_PROXY_SSL_HEADER, s.CSRF_TRUSTED_ORIGINS, s.SESSION_COOKIE_AGE)")
    plain = manage(*show, DJANGO_SECRET_KEY=PRODUCTION["DJANGO_SECRET_KEY"])
    assert plain.stdout.split() == ["False", "False", "False", "False", "None", "[]", "28800"], \
        plain.stderr
    tls = manage(*show, **PRODUCTION, DJANGO_TLS_PROXY="1")
    assert tls.stdout.strip() == (
        "False True True True ('HTTP_X_FORWARDED_PROTO', 'https') "
        "['https://dcp.example.com'] 28800"
    ), tls.stderr
    asked = manage(*show, DJANGO_DEBUG="1")
    assert asked.stdout.split()[0] == "True", asked.stderr


@pytest.mark.django_db
def test_demo_accounts_have_roles_but_no_staff_rights() -> None:
    User.objects.create_user("operator", password="old", is_staff=True)  # an older demo's
    demo_accounts("operator")
    for name in ("operator", "viewer"):
        user = User.objects.get(username=name)
        assert not user.is_staff and not user.is_superuser
        assert user.groups.filter(name=name).exists()


@pytest.mark.parametrize("key", ["x", "short-but-not-empty", "a" * 60, "abcd" * 20,
                                 "django-insecure-" + secrets.token_urlsafe(50)])
def test_a_weak_secret_key_is_refused_at_start_up(key: str) -> None:
    done = manage("check", **{**PRODUCTION, "DJANGO_SECRET_KEY": key})
    assert done.returncode != 0
    assert "DJANGO_SECRET_KEY is too weak" in done.stderr, done.stderr[-500:]


@pytest.mark.django_db
def test_the_demo_accounts_are_refused_outside_a_laptop() -> None:
    done = manage("demo", **PRODUCTION)
    assert done.returncode != 0
    assert "known passwords" in done.stderr and "DJANGO_DEBUG=1" in done.stderr
    assert not User.objects.filter(username__in=["operator", "viewer"]).exists()
