"""The SQL that runs per phase on Postgres, counted: a new query on the hot path
must be a deliberate change to this test, not an accident."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from controlplane.storage import PostgresStorage
from kernel import Draft, Kernel, ManualClock, Registry, Run, Transition, Worker


def registry() -> Registry:
    reg = Registry()
    reg.document("plan")

    @reg.task("tool")
    class Tool:
        initial = "call"

        def call(self, run: Run) -> Transition:
            run.append(run.input["conversation"], "tool_result", {"ok": True})
            run.set("plan", "p", ["receipts", run.task_id], "sent")
            return run.succeed("sent")

    return reg


@pytest.mark.django_db(transaction=True)
def test_a_typical_phase_costs_a_fixed_set_of_statements() -> None:
    kernel = Kernel(PostgresStorage(), registry(), ManualClock())
    handle = kernel.create_session()
    setup = Draft()
    conversation = setup.create_conversation()
    setup.set("plan", "p", ["receipts"], {})
    first = setup.create_task("tool", {"conversation": conversation})
    second = setup.create_task("tool", {"conversation": conversation})
    handle.commit(setup)
    worker = Worker(kernel, "w1")
    worker.advance(first)  # opens the worker's session handle, which it then keeps

    with CaptureQueriesContext(connection) as captured:
        assert worker.advance(second)
    statements = [_shape(q["sql"]) for q in captured]
    assert statements == [
        # claim: lease + epoch (+ forget its dispatch rows), one statement, returning the
        # task; read first only when the claim finds nothing (issue 12's latency)
        "WITH kernel_task",
        # the phase's commit: two round trips, each pipelined
        "BEGIN",  # 1: open the transaction (in the pipeline: no round trip of its own)
        "UPDATE kernel_session",  # ... take the session's commit order by advancing its head
        "SELECT kernel_task",  # ... the task, locked for the fencing check
        "SELECT kernel_document",  # ... the document head
        "SELECT kernel_task",  # ... owned children of the finishing task
        "SELECT kernel_task",  # ... and its waiters (the conversation is cached: immutable)
        "WITH kernel_commit",  # 2: the commit row, dating its session ...
        "INSERT kernel_entry",
        "INSERT kernel_document",
        "INSERT kernel_document_version",
        "UPDATE kernel_task",  # ... the transition ...
        "DELETE kernel_dispatch",  # ... the ended task's rows (one a lapsed lease left)
        "COMMIT",  # ... and COMMIT itself
    ], "\n".join(q["sql"][:120] for q in captured)
    assert kernel.task(second).outcome["kind"] == "succeeded"

    # The hot statements run as prepared statements (parsed and planned once per
    # connection), not re-planned on every commit.
    with connection.cursor() as cur:
        cur.execute("SELECT statement FROM pg_prepared_statements")
        prepared = {_shape(row[0]) for row in cur.fetchall()}
    assert {
        "WITH kernel_task",  # the claim: its planning took longer than its execution
        "UPDATE kernel_session",
        "WITH kernel_commit",
        "INSERT kernel_entry",
        "UPDATE kernel_task",
    } <= prepared, prepared


def _shape(sql: str) -> str:
    """Verb and first table of a statement: what the count is about, without the values."""
    sql = sql.split("times: ", 1)[-1]  # executemany is logged as "N times: ..."
    verb = sql.split()[0]
    table = re.search(r"\b(kernel_\w+)", sql)
    return f"{verb} {table.group(1)}" if table else verb
