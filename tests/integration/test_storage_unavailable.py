"""A lost database connection inside a handler restarts the phase (issue 11, point 7).

The conformance suite raises the kernel's ``StorageUnavailable`` directly; here the
real thing happens: the handler's Postgres backend is terminated between its intent
commit and a document read, and the Postgres storage must report it as
"unavailable, nothing written" - not as an error of the task.
"""

from __future__ import annotations

import contextlib

import psycopg
import pytest
from django.db import connection

from controlplane.storage import PostgresStorage
from kernel import (
    Draft,
    Kernel,
    ManualClock,
    Registry,
    Run,
    Scheduler,
    StorageUnavailable,
    Transition,
)
from tests.databases import url_of_test_database

pytestmark = pytest.mark.django_db(transaction=True)


def terminate_own_backend() -> None:
    pid = connection.connection.info.backend_pid
    with psycopg.connect(url_of_test_database(), autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])


@pytest.mark.parametrize("where", ["read", "intent commit"])
def test_a_connection_lost_inside_a_handler_restarts_the_phase(where: str) -> None:
    runs: list[int] = []
    registry = Registry()
    registry.document("notes")

    @registry.task("careful")
    class Careful:
        initial = "call"

        def call(self, run: Run) -> Transition:
            runs.append(run.restarts)
            if len(runs) == 1 and where == "intent commit":
                terminate_own_backend()
            run.commit(checkpoint={"intent": len(runs)})
            if len(runs) == 1 and where == "read":
                terminate_own_backend()
            run.document("notes", "n")
            return run.succeed({"runs": len(runs)})

    clock = ManualClock()
    kernel = Kernel(PostgresStorage(), registry, clock)
    handle = kernel.create_session()
    draft = Draft(actor="user:ann")
    task_id = draft.create_task("careful", {})
    handle.commit(draft)

    with contextlib.suppress(StorageUnavailable):  # the scheduler's next look, maybe
        Scheduler(kernel, "w1").run_until_idle()
    connection.close()  # a worker's next message starts with close_old_connections()
    interrupted = kernel.storage.task(task_id)
    assert not interrupted.terminal, interrupted.outcome

    restarted = Kernel(PostgresStorage(), registry, clock)
    Scheduler(restarted, "w2").run_until_idle(advance_clock=True)
    task = restarted.storage.task(task_id)
    assert task.outcome["kind"] == "succeeded", task.outcome
    assert runs == [0, 1]  # the second run was counted as a restart
