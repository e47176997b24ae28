"""The test suite's settings: the product's, with DEBUG asked for.

Without ``DJANGO_DEBUG`` the product refuses to start on its built-in secret key
(controlplane/settings.py). pytest-django imports settings before any conftest, so the
suite asks here (pyproject.toml names this module), and gives the processes it starts
(Daphne, Celery workers; they run with ``DJANGO_DEBUG=0`` as deployed) a secret key of
their own, and turns the request rates off. Those processes load the product's settings
module, not this one.
"""

import os

os.environ.setdefault("DJANGO_DEBUG", "1")
os.environ.setdefault("DJANGO_SECRET_KEY", "test-suite-only-secret-" + "k" * 48)
# Request rates and server time are not counted (0) here or in the processes the tests
# start: the suite asks faster than anyone should, from one address.
# tests/integration/test_request_rates.py turns them on.
os.environ.setdefault("USER_REQUESTS_PER_SECOND", "0")
os.environ.setdefault("ADDRESS_REQUESTS_PER_SECOND", "0")
os.environ.setdefault("USER_SERVER_SECONDS_PER_SECOND", "0")

from django.conf import global_settings  # noqa: E402

from controlplane.settings import *  # noqa: E402,F403

# This process's own commits (the API, commands and pages the tests call in-process)
# send their messages at once, as those tests expect; the workers, web servers and
# commands the tests start hold them for a hint's grace, as deployed
# (kernel.dispatch.HeldMessages, tested in tests/conformance/test_dispatch.py).
KERNEL_HINT_GRACE_MS = 0.0

# Accounts made here get a quick hash (tests/hashers.py), which takes the place of the
# default PBKDF2 hasher: a hash of either count of iterations is verified by both.
PASSWORD_HASHERS = [
    "tests.hashers.QuickPBKDF2PasswordHasher",
    *(h for h in global_settings.PASSWORD_HASHERS if not h.endswith(".PBKDF2PasswordHasher")),
]

# Read once by django.conf.settings already; what child processes inherit.
os.environ["DJANGO_SETTINGS_MODULE"] = "controlplane.settings"

# This process is not a web process, whatever it imports (the schema tests load
# controlplane.wsgi): its statements are not bounded in time. The web processes the tests
# start are (tests/integration/test_request_connections.py sets it here for itself).
WEB_STATEMENT_TIMEOUT_SECONDS = 0.0
