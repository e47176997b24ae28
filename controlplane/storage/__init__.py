"""The kernel's Storage protocol on Postgres, and the kernel's artifact stores, split by
concern.

- :mod:`.schema`: the ``kernel_*`` tables, derived once from the kernel records and
  the Django models; the row <-> record mapping that storage and the read layer share.
- :mod:`.statements`: the named SQL of commits, claims, reads and the outbox, built
  from the schema.
- :mod:`.connection`: the cursor on Django's connection and the general commit's
  transaction (pipelined reads, pipelined writes + COMMIT).
- :mod:`.fast_commits`: the kinds of commit that take one round trip.
- :mod:`.postgres`: :class:`PostgresStorage`, the Storage protocol itself.
- :mod:`.due`: the due channel, what a commit announces to listening workers.
- :mod:`.clock`: the database's clock, for claims, due times and lease expiry.
- :mod:`.retention` and :mod:`.partitions`: pruning and the commit log's partitions.
- :mod:`.search`: finding tasks by a word of their input.
- :mod:`.artifacts` and :mod:`.s3_artifacts`: artifacts in Postgres or an S3-compatible
  store.
"""

from __future__ import annotations

from controlplane.storage.connection import Observer
from controlplane.storage.postgres import READS, WRITES, PostgresStorage

__all__ = ["READS", "WRITES", "Observer", "PostgresStorage"]
