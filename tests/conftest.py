"""Shared pytest set-up.

Kept deliberately minimal: kernel-only tests (tests/unit) must run without Postgres,
Redis or any Django database access. pytest-django configures Django from
``DJANGO_SETTINGS_MODULE`` in pyproject.toml (tests/settings.py: the product's, with
DEBUG asked for), which imports settings but opens no connection until a test asks for
the database.
"""
