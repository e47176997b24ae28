"""Sessions a benchmark puts in its database: seeded in SQL where making them through the
kernel would take minutes and measure nothing, or committed one small change at a time.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

PLAN = "email-plan"  # a document kind the project registers
STATES = ["succeeded", "running", "pending", "waiting", "sleeping"]
"""The children's states in :func:`seed_session`, in turn."""
WORDS = ["invoice", "renewal", "digest", "reminder", "receipt", "welcome", "outage", "survey"]
KINDS = ["send-notice", "send-batch", "agent-turn", "tool-call"]
SHOWN = [("succeeded", "terminal"), ("failed", "terminal"),
         ("pending", None), ("running", None), ("waiting", None), ("sleeping", None)]
"""The tasks of :func:`seed_tasks`: their input words, kinds and (shown state, status)."""


def seed_session(tasks: int) -> tuple[str, str]:
    """A session with one root and ``tasks - 1`` children in mixed states; (session, root).

    Rows are kernel records copied in through the storage's schema, so a new record
    field needs nothing here."""
    from django.db import connection

    from controlplane.storage.schema import SESSION, TASK
    from kernel.records import SessionRecord, Status, Task, new_id

    session_id, root = new_id("sess"), new_id("task")
    rows = [Task(root, session_id, "send-batch", 1, {"recipients": []}, Status.WAITING,
                 "summarize", {}, 1, 1, wait={"deps": [], "policy": "all_settled"}, epoch=1)]
    for g in range(1, tasks):
        state = STATES[g % len(STATES)]
        done = state == "succeeded"
        rows.append(Task(
            f"task_bench_{g}", session_id, "send-notice", 1, {"to": f"r{g}@example.com"},
            Status.TERMINAL if done else Status(state), "confirm", {}, 2, 2, parent_id=root,
            owned=True, outcome={"kind": "succeeded"} if done else None, epoch=1,
            queue="hands",
        ))
    connection.ensure_connection()
    with connection.connection.cursor() as cur:
        session = SessionRecord(session_id, 2, datetime.now(UTC), {"title": "benchmark"})
        cur.execute(f"INSERT INTO {SESSION.name} ({', '.join(SESSION.inserted)}) VALUES "
                    f"({', '.join(['%s'] * len(SESSION.inserted))})", SESSION.values(session))
        with cur.copy(f"COPY {TASK.name} ({', '.join(TASK.inserted)}) FROM STDIN") as copy:
            for task in rows:
                copy.write_row(TASK.values(task))
    return session_id, root


def seed_tasks(tasks: int, sessions: int = 100) -> list[str]:
    """``tasks`` tasks spread over ``sessions`` sessions, each session with two commits an
    hour apart at most; kinds, states and input words mixed. Returns the session ids."""
    import random

    from django.db import connection

    from controlplane.storage.schema import COMMIT, SESSION, TASK
    from kernel.records import Commit, SessionRecord, Status, Task, new_id

    rand = random.Random(13)
    now = datetime.now(UTC)
    session_ids = [new_id("sess") for _ in range(sessions)]
    connection.ensure_connection()
    with connection.connection.cursor() as cur:
        with cur.copy(f"COPY {SESSION.name} ({', '.join(SESSION.inserted)}) FROM STDIN") as copy:
            for session_id in session_ids:
                copy.write_row(SESSION.values(SessionRecord(session_id, 2, now, {"title": "b"})))
        with cur.copy(f"COPY {COMMIT.name} ({', '.join(COMMIT.inserted)}) FROM STDIN") as copy:
            for session_id in session_ids:
                for seq in (1, 2):
                    at = now - timedelta(seconds=rand.randrange(3600))
                    copy.write_row(COMMIT.values(Commit(session_id, seq, at, "bench", [])))
        with cur.copy(f"COPY {TASK.name} ({', '.join(TASK.inserted)}) FROM STDIN") as copy:
            for n in range(tasks):
                shown, terminal = SHOWN[n % len(SHOWN)]
                words = " ".join(rand.sample(WORDS, 2))
                copy.write_row(TASK.values(Task(
                    f"task_find_{n:06d}", session_ids[n % sessions], KINDS[n % len(KINDS)], 1,
                    {"to": f"r{n}@example.com", "subject": f"{words} {n}"},
                    Status(terminal or shown), "confirm", {}, 1, 2,
                    outcome={"kind": shown} if terminal else None, epoch=1,
                )))
    # Settled, as a table is once autovacuum has passed (hint bits set, visibility map
    # made): the first scans would otherwise do that work, and autovacuum would run
    # beside the measured ones.
    with connection.connection.cursor() as cur:
        for table in (TASK.name, COMMIT.name):
            cur.execute(f"VACUUM (ANALYZE) {table}")
    return session_ids


def commit_one(handle: Any, value: Any) -> Any:
    """One small commit on ``handle``'s session (a document ``set``); its commit record."""
    from kernel import Draft

    draft = Draft(actor="bench")
    draft.set(PLAN, "doc", ["n"], value)
    return handle.commit(draft).commit
