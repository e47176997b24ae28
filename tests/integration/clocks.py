"""A machine's wall clock that runs behind the database's, for the tests that show a
time is read from the database's clock (``Kernel.clock``), not the local one."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any


def behind(minutes: float) -> type[datetime]:
    """A ``datetime`` whose ``now()`` is ``minutes`` behind: patch a module's
    ``datetime`` with it."""

    class Behind(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Any:
            return datetime.now(tz) - timedelta(minutes=minutes)

    return Behind
