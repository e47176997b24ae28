#!/usr/bin/env python
"""Django's command-line utility for the control plane."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    from django.core.management import execute_from_command_line
    from django.db import OperationalError

    from kernel.errors import StorageUnavailable

    try:
        execute_from_command_line(sys.argv)
    except (OperationalError, StorageUnavailable) as exc:
        # Run from a shell, a database that is down or missing is the user's to fix, not
        # a bug: one line naming it says more than a page of traceback.
        if "--traceback" in sys.argv:
            raise
        sys.exit(unavailable(exc))


def unavailable(exc: Exception) -> str:
    """What to say when the database cannot be used: where it was looked for (never the
    password) and how to get one."""
    from django.conf import settings

    db = settings.DATABASES["default"]
    where = f"{db.get('HOST') or 'localhost'}:{db.get('PORT') or 5432}/{db.get('NAME')}"
    cause = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    command = " ".join(["manage.py", *sys.argv[1:2]])
    return (f"{command}: database unavailable at {where}: {cause}\n"
            "Set DATABASE_URL to a running Postgres, or run `make services` to find or "
            "start one.")


if __name__ == "__main__":
    main()
