"""The kernel's Storage protocol on Postgres, and everything else the control plane
keeps in Postgres beside it, split by concern. This package's names (``__all__``) are
what the rest of the control plane uses; only the read layer reaches past them, to
:mod:`.schema` (rows into kernel records) and :mod:`.search`.

- :mod:`.schema`: the ``kernel_*`` tables, derived once from the kernel records and
  the Django models; the row <-> record mapping that storage and the read layer share.
- :mod:`.statements`: the named SQL statements of the commit, claim and read paths,
  built from the schema; :mod:`.fast_commits` the one-round-trip commit kinds.
- :mod:`.connection`: the cursor on Django's connection and the commit transaction
  (pipelined reads, pipelined writes + COMMIT).
- :mod:`.postgres`: :class:`PostgresStorage`, the Storage protocol itself.
- :mod:`.due`: the due channel, on which a commit announces to listening workers the
  tasks it made due.
- :mod:`.partitions` and :mod:`.retention`: the time-partitioned commit log and the
  prune of finished sessions.
- :mod:`.clock`: the database's clock; :mod:`.artifacts` and :mod:`.s3_artifacts`:
  large values kept apart from the rows that reference them.

The modules that are not the commit path (due, partitions, retention, clock, artifacts,
search) keep their own SQL beside the code that runs it.
"""

from __future__ import annotations

from controlplane.storage import due
from controlplane.storage.artifacts import PostgresArtifacts, referenced_artifacts
from controlplane.storage.clock import DatabaseClock
from controlplane.storage.connection import HotCursor, Observer
from controlplane.storage.partitions import prepare as prepare_partitions
from controlplane.storage.partitions import to_make as partitions_to_make
from controlplane.storage.postgres import READS, UNAVAILABLE, WRITES, PostgresStorage
from controlplane.storage.retention import PruneRunning
from controlplane.storage.s3_artifacts import S3Artifacts
from controlplane.storage.statements import task_blocked, task_runnable

__all__ = ["READS", "UNAVAILABLE", "WRITES", "DatabaseClock", "HotCursor", "Observer",
           "PostgresArtifacts", "PostgresStorage", "PruneRunning", "S3Artifacts", "due",
           "partitions_to_make", "prepare_partitions", "referenced_artifacts", "task_blocked",
           "task_runnable"]
