"""The clean slate after each transactional test, for a few milliseconds instead of ~0.12 s.

pytest-django ends a transactional test with Django's ``flush``: one TRUNCATE of every
model table (each table, index and partition gets a new file: ~5 ms a table), then the
``post_migrate`` signal, which writes the content types and permissions back.

:func:`empty_tables` leaves the same database behind:

- It first locks every table the flush would truncate, in the mode TRUNCATE takes, so it
  waits for whatever a test left running (a killed worker's transaction) as TRUNCATE does.
- Content types and permissions are left alone when they are still the rows that the
  last real flush's ``post_migrate`` wrote (same ids, same values); otherwise it gives
  up and the real flush runs.
- The other tables are emptied with DELETE, except that a table the planner could tell
  from a truncated one is truncated: one analysed or vacuumed since it was last truncated
  (``reltuples`` is no longer -1), or with ten pages or more. Postgres estimates a table
  that was never analysed and is under ten pages as ten pages, whatever it holds, so the
  next test's plans, and the burst claim's "analyse after a burst" decision, which reads
  ``reltuples``, are what they would be after TRUNCATE.
- Sequences go on from where they were, as after Django's flush (it does not reset them).

A test with ``available_apps`` or ``serialized_rollback`` (none here so far) gets
Django's own teardown.
"""

from __future__ import annotations

from typing import Any

from django.core.management import call_command
from django.db import DatabaseError, connections, transaction
from django.test import TransactionTestCase

KEPT = ("django_content_type", "auth_permission")
FINGERPRINT = (
    "SELECT (SELECT md5(coalesce(string_agg(t::text, '|' ORDER BY t.id), '')) "
    "FROM django_content_type t), "
    "(SELECT md5(coalesce(string_agg(p::text, '|' ORDER BY p.id), '')) FROM auth_permission p)"
)
# Per table (a partitioned table by its partitions): analysed or vacuumed since its last
# TRUNCATE, or ten pages or more: what the planner would see differently after DELETE.
TRUNCATE_WANTED = """
SELECT coalesce(parent.relname, c.relname)
FROM pg_class c
LEFT JOIN pg_inherits i ON i.inhrelid = c.oid
LEFT JOIN pg_class parent ON parent.oid = i.inhparent
WHERE c.relkind = 'r' AND pg_table_is_visible(coalesce(parent.oid, c.oid))
  AND coalesce(parent.relname, c.relname) = ANY(%s)
GROUP BY 1
HAVING bool_or(c.reltuples >= 0)
    OR bool_or(pg_relation_size(c.oid) >= 10 * current_setting('block_size')::int)
"""

_after_flush: dict[str, tuple[Any, ...]] = {}  # database alias: FINGERPRINT's row


class _Changed(Exception):
    """Content types or permissions differ from what the last flush left."""


def flush(db_name: str) -> None:
    """Django's flush, as ``TransactionTestCase`` runs it, then a note of what its
    ``post_migrate`` wrote."""
    call_command("flush", verbosity=0, interactive=False, database=db_name,
                 reset_sequences=False, allow_cascade=False, inhibit_post_migrate=False)
    with connections[db_name].cursor() as cur:
        cur.execute(FINGERPRINT)
        _after_flush[db_name] = tuple(cur.fetchone())


def empty_tables(db_name: str) -> bool:
    """Leave ``db_name`` as :func:`flush` would; False (nothing done) if only the flush can."""
    if db_name not in _after_flush:
        return False
    conn = connections[db_name]
    quote = conn.ops.quote_name
    tables = sorted(conn.introspection.django_table_names(only_existing=True,
                                                          include_views=False))
    emptied = [t for t in tables if t not in KEPT]
    try:
        with transaction.atomic(using=db_name), conn.cursor() as cur:
            cur.execute(f"LOCK TABLE {', '.join(map(quote, tables))} IN ACCESS EXCLUSIVE MODE")
            cur.execute(FINGERPRINT)
            if tuple(cur.fetchone()) != _after_flush[db_name]:
                raise _Changed
            cur.execute(TRUNCATE_WANTED, [emptied])
            truncated = sorted(row[0] for row in cur.fetchall())
            if truncated:
                # CASCADE: the tables that refer to these (all of them in ``emptied``).
                cur.execute(f"TRUNCATE {', '.join(map(quote, truncated))} CASCADE")
            cur.execute("SET CONSTRAINTS ALL DEFERRED")
            for table in emptied:
                if table not in truncated:
                    cur.execute(f"DELETE FROM {quote(table)}")
    except (_Changed, DatabaseError):
        return False
    return True


def fixture_teardown(case: Any) -> None:
    """``TransactionTestCase._fixture_teardown``, with :func:`empty_tables` first."""
    if case.available_apps is not None or case.serialized_rollback:
        return DJANGO_FIXTURE_TEARDOWN(case)
    for db_name in case._databases_names(include_mirrors=False):
        if not empty_tables(db_name):
            flush(db_name)


DJANGO_FIXTURE_TEARDOWN = TransactionTestCase._fixture_teardown
