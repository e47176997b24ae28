"""The kernel tables carry no index that a commit pays for and no query uses: every row
a commit inserts (a task, an entry, a document version) updates each index of its table.
Migration ``0017_fewer_indexes`` dropped them; Django makes a ``*_like`` index again
whenever a later migration alters a text column that has an index, and adds a foreign
key's own index unless told ``db_index=False``: these tests say so when that happens."""

from __future__ import annotations

import pytest
from django.db import connection

pytestmark = pytest.mark.django_db

KERNEL_INDEXES = """
SELECT t.relname, i.relname, am.amname, x.indpred IS NOT NULL,
       ARRAY(SELECT a.attname FROM unnest(x.indkey) WITH ORDINALITY AS k(n, o)
             JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = k.n
             ORDER BY k.o),
       pg_get_indexdef(x.indexrelid)
FROM pg_index x
JOIN pg_class i ON i.oid = x.indexrelid
JOIN pg_class t ON t.oid = x.indrelid
JOIN pg_am am ON am.oid = i.relam
JOIN pg_namespace n ON n.oid = t.relnamespace
WHERE n.nspname = current_schema() AND t.relname LIKE 'kernel\\_%'
"""


def kernel_indexes() -> list[tuple[str, str, str, bool, list[str], str]]:
    with connection.cursor() as cur:
        cur.execute(KERNEL_INDEXES)
        return [tuple(row) for row in cur.fetchall()]  # type: ignore[misc]


def test_no_kernel_table_has_a_prefix_pattern_index() -> None:
    found = [(table, name) for table, name, *_, definition in kernel_indexes()
             if "text_pattern_ops" in definition or "varchar_pattern_ops" in definition]
    assert found == []


def test_no_single_column_index_repeats_the_lead_of_another() -> None:
    """A plain index of one column is redundant beside another plain btree index that
    leads with that column: the planner uses the longer one for the same lookups."""
    indexes = [i for i in kernel_indexes() if i[2] == "btree" and not i[3]]
    redundant = [
        (table, name)
        for table, name, _, _, columns, _ in indexes
        if len(columns) == 1 and any(
            other_table == table and other_name != name and len(other_columns) > 1
            and other_columns[0] == columns[0]
            for other_table, other_name, _, _, other_columns, _ in indexes)
    ]
    assert redundant == []
