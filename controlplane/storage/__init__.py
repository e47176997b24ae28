"""The kernel's Storage protocol on Postgres, split by concern.

- :mod:`.schema`: the ``kernel_*`` tables, derived once from the kernel records and
  the Django models; the row <-> record mapping that storage and the read layer share.
- :mod:`.statements`: the named SQL statements, built from the schema.
- :mod:`.connection`: the cursor on Django's connection and the commit transaction
  (pipelined reads, pipelined writes + COMMIT).
- :mod:`.postgres`: :class:`PostgresStorage`, the Storage protocol itself.
"""

from __future__ import annotations

from controlplane.storage.connection import Observer
from controlplane.storage.postgres import READS, WRITES, PostgresStorage

__all__ = ["READS", "WRITES", "Observer", "PostgresStorage"]
