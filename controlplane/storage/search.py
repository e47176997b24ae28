"""Finding tasks by a word of their input: ``(input)::text ILIKE '%word%'``.

The predicate is the same on every server, so a search finds the same tasks everywhere.
Where the server has the ``pg_trgm`` extension (any packaged Postgres: it is in
contrib), a trigram GIN index on the same expression serves it. Where it has not (the
embedded ``pgserver`` build ships only plpgsql and pgvector), the predicate is checked
row by row, and statistics on the expression (``CREATE STATISTICS``, core Postgres
since 14; the index brings its own) tell the planner how common a word is: a common
one is then found by walking the newest tasks until a page (and the page's count) is
full, a rare one by one scan of the table. Core Postgres has no index for a substring
anywhere in a text, and keeping a second, indexable copy of every input would cost
every commit that writes a task, on the path the product measures.
"""

from __future__ import annotations

from typing import Any

INPUT_TEXT = "(kernel_task.input)::text"
"""The searched expression: the input's JSON text (keys and values)."""
INDEX = "task_input_trgm"
"""The trigram index on :data:`INPUT_TEXT`, where the server has ``pg_trgm``."""
STATISTICS = "task_input_text"
"""Statistics on :data:`INPUT_TEXT`, where there is no index (which has its own)."""


def like_pattern(text: str) -> str:
    """``text`` as a LIKE pattern matching it anywhere (its wildcards taken literally)."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def input_contains(text: str) -> tuple[str, list[str]]:
    """A WHERE clause (and its parameters) for tasks whose input contains ``text``,
    case-insensitively: the expression of :data:`INDEX`, so that it is used."""
    return f"{INPUT_TEXT} ILIKE %s", [like_pattern(text)]


def trigram_available(cursor: Any) -> bool:
    """Whether this server can create ``pg_trgm`` (or already has it)."""
    cursor.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'pg_trgm'")
    return cursor.fetchone() is not None


CREATE_INDEX = (f"CREATE INDEX IF NOT EXISTS {INDEX} ON kernel_task USING gin "
                f"(((input)::text) gin_trgm_ops)")
CREATE_STATISTICS = (f"CREATE STATISTICS IF NOT EXISTS {STATISTICS} ON ((input)::text) "
                     f"FROM kernel_task")


def create_input_index(apps: Any, schema_editor: Any) -> None:
    """The migration's step: the extension and the index where the server has
    ``pg_trgm``, the statistics where it has not."""
    with schema_editor.connection.cursor() as cursor:
        trigrams = trigram_available(cursor)
    if trigrams:
        schema_editor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
        schema_editor.execute(CREATE_INDEX)
    else:
        schema_editor.execute(CREATE_STATISTICS)


def drop_input_index(apps: Any, schema_editor: Any) -> None:
    """Its reverse (the extension stays: other databases' objects may use it)."""
    schema_editor.execute(f"DROP INDEX IF EXISTS {INDEX}")
    schema_editor.execute(f"DROP STATISTICS IF EXISTS {STATISTICS}")
