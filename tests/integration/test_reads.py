"""The read layer's SQL says what the kernel's records say."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime

import pytest
from django.db import connection

from controlplane.reads import tasks
from controlplane.storage.schema import SESSION, TASK
from kernel.records import SHOWN_STATUSES, Outcome, SessionRecord, Status, Task, new_id

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_shown_status_in_sql_is_the_records_shown_status() -> None:
    """Counting by shown status happens in the database (SHOWN_STATUS_SQL); each task must
    land in the group its record's ``shown_status`` names, for every status and outcome
    (and a terminal task without an outcome)."""
    session_id = new_id("sess")
    made = [Task(new_id("task"), session_id, "k", 1, {}, status, "p", {}, 1, 1)
            for status in Status if status is not Status.TERMINAL]
    made += [Task(new_id("task"), session_id, "k", 1, {}, Status.TERMINAL, "p", {}, 1, 1,
                  outcome={"kind": str(outcome)}) for outcome in Outcome]
    made.append(Task(new_id("task"), session_id, "k", 1, {}, Status.TERMINAL, "p", {}, 1, 1))
    connection.ensure_connection()
    with connection.connection.cursor() as cur:
        session = SessionRecord(session_id, 1, datetime.now(UTC), {})
        cur.execute(f"INSERT INTO {SESSION.name} ({', '.join(SESSION.inserted)}) VALUES "
                    f"({', '.join(['%s'] * len(SESSION.inserted))})", SESSION.values(session))
        for task in made:
            cur.execute(f"INSERT INTO {TASK.name} ({', '.join(TASK.inserted)}) VALUES "
                        f"({', '.join(['%s'] * len(TASK.inserted))})", TASK.values(task))
    expected = Counter(t.shown_status for t in made)
    assert tasks.status_counts(session_id) == dict(expected)
    assert set(expected) == {*SHOWN_STATUSES, "terminal"}
