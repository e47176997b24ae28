"""How a benchmark starts: the options every one has, and Django set up on its own
freshly made database.
"""

from __future__ import annotations

import argparse
import os

from benchmarks._support.postgres import BENCH_DATABASE, database_url, recreate_database
from benchmarks._support.report import REPORT, progress


def parse_arguments(
    parser: argparse.ArgumentParser, argv: list[str] | None, database: str
) -> tuple[argparse.Namespace, str]:
    """Add the options every benchmark has, parse, and return the arguments with the URL
    of the benchmark's database: ``--database`` (refused unless its name says it is a
    benchmark's, since it is dropped and recreated) and ``--no-write``."""
    parser.add_argument("--database", default=database, help="dropped and recreated")
    parser.add_argument("--no-write", action="store_true", help=f"do not update {REPORT.name}")
    args = parser.parse_args(argv)
    if not args.database.startswith(BENCH_DATABASE):
        parser.error(f"--database must start with {BENCH_DATABASE!r}: it is dropped and recreated")
    return args, database_url(args.database)


def setup_django(url: str, *, migrate: bool) -> None:
    """Point Django at ``url`` and set it up; optionally bring the schema up to date.

    DEBUG is off unless ``DJANGO_DEBUG`` says otherwise: with DEBUG on, Django formats
    and keeps every query, which no deployment pays for. Without DEBUG the settings
    want a real secret key: a random one for this run (the servers it starts inherit it).
    Request rates are not counted (below).
    """
    import secrets

    import django

    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    os.environ.setdefault("DJANGO_DEBUG", "0")
    os.environ.setdefault("DJANGO_SECRET_KEY", secrets.token_urlsafe(50))
    # The benchmarks ask from one address (and mostly one account) faster than any person
    # should: the request rates would measure the limiter. Off here and in the servers
    # they start, unless asked (controlplane.web.rates).
    os.environ.setdefault("USER_REQUESTS_PER_SECOND", "0")
    os.environ.setdefault("ADDRESS_REQUESTS_PER_SECOND", "0")
    os.environ.setdefault("USER_SERVER_SECONDS_PER_SECOND", "0")
    django.setup()
    if migrate:
        from django.core.management import call_command

        call_command("migrate", verbosity=0, interactive=False)


def fresh_database(args: argparse.Namespace, url: str, redis_url: str | None = None) -> None:
    """Recreate the benchmark's database (``--database``), migrate it and set Django up
    on it, saying so (and which Redis database the run uses, if it uses one)."""
    redis = f"; Redis {redis_url}" if redis_url else ""
    progress(f"database {args.database}: recreating and migrating{redis}")
    recreate_database(url)
    setup_django(url, migrate=True)
