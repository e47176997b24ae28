"""The read layer's SQL says what the kernel's records say."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime

import pytest
from django.db import connection

from controlplane.reads import tasks
from controlplane.reads.snapshot import rows
from controlplane.storage.schema import SESSION, TASK
from kernel.commit import Builder
from kernel.records import SHOWN_STATUSES, Outcome, SessionRecord, Status, Task, new_id

pytestmark = pytest.mark.django_db(transaction=True)


def stored(session_id: str, made: list[Task]) -> None:
    """A session holding these task records, written as the storage writes them."""
    connection.ensure_connection()
    with connection.connection.cursor() as cur:
        session = SessionRecord(session_id, 1, datetime.now(UTC), {})
        cur.execute(f"INSERT INTO {SESSION.name} ({', '.join(SESSION.inserted)}) VALUES "
                    f"({', '.join(['%s'] * len(SESSION.inserted))})", SESSION.values(session))
        for task in made:
            cur.execute(f"INSERT INTO {TASK.name} ({', '.join(TASK.inserted)}) VALUES "
                        f"({', '.join(['%s'] * len(TASK.inserted))})", TASK.values(task))


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
    stored(session_id, made)
    expected = Counter(t.shown_status for t in made)
    assert tasks.status_counts(session_id) == dict(expected)
    assert set(expected) == {*SHOWN_STATUSES, "terminal"}


def test_needing_attention_reads_the_same_in_summaries_as_in_task_records() -> None:
    """The series reads commit summaries (``needs_attention_sql``), the list and its count
    read task records (``NEEDS_ATTENTION``): for a task in every status and outcome, and
    waiting on a signal or on tasks, both must say the same."""
    session_id = new_id("sess")

    def task(status: Status, **more: object) -> Task:
        return Task(new_id("task"), session_id, "k", 1, {}, status, "p", {}, 1, 1,
                    **more)  # type: ignore[arg-type]

    made = [task(s) for s in Status if s not in (Status.TERMINAL, Status.WAITING)]
    made += [task(Status.TERMINAL, outcome={"kind": str(o)}) for o in Outcome]
    made += [task(Status.WAITING, wait={"signal": "resolution"}),
             task(Status.WAITING, wait={"deps": ["task_a"], "policy": "all_settled"})]
    made += [replace(task(Status.SLEEPING), kind="agent-tool", phase="approval"),  # gated
             replace(task(Status.SLEEPING), kind="agent-tool", phase="call"),
             replace(task(Status.SLEEPING), kind="k", phase="approval")]
    stored(session_id, made)
    items = [{"type": "task", "id": t.id, "kind": t.kind, "phase": t.phase,
              "status": str(t.status),
              **({"outcome": t.outcome["kind"]} if t.outcome else {}),
              **Builder._what_it_waits_for(t)} for t in made]
    in_summaries = {i for (i,) in rows(
        f"SELECT i->>'id' FROM jsonb_array_elements(%s::jsonb) i "
        f"WHERE {tasks.needs_attention_sql('i')}", [json.dumps(items)])}
    in_records = {i for f in tasks.NEEDS_ATTENTION
                  for i in tasks.ids(replace(f, session_id=session_id), limit=100)}
    # signal, failed, faulted, and the call waiting for approval
    assert in_summaries == in_records and len(in_records) == 4
