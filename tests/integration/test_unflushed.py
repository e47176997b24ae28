"""What does not wait for the disk (issue 12's dispatch latency): a claim and a
committer's take of its dispatch rows. Each is flushed by the next synchronous commit
(the log is written in order); losing one in a crash of the server loses nothing that
depended on it (see controlplane.storage.statements). Their transactions run with
``synchronous_commit`` off; everything else keeps the server's setting."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection, transaction

from controlplane.storage import PostgresStorage
from kernel import Draft, Kernel, ManualClock, Registry, Run, Transition

pytestmark = pytest.mark.django_db(transaction=True)


def registry() -> Registry:
    reg = Registry()

    @reg.task("noop")
    class Noop:
        initial = "go"

        def go(self, run: Run) -> Transition:
            return run.succeed("ok")

    return reg


def synchronous_commit() -> str:
    with connection.cursor() as cur:
        cur.execute("SELECT current_setting('synchronous_commit')")
        return str(cur.fetchone()[0])


def test_claims_and_takes_do_not_wait_for_the_disk() -> None:
    storage = PostgresStorage()
    kernel = Kernel(storage, registry(), ManualClock())
    handle = kernel.create_session()
    draft = Draft()
    first, second = draft.create_task("noop", {}), draft.create_task("noop", {})
    written = handle.commit(draft)
    now = kernel.clock.now()
    server = synchronous_commit()
    assert server != "off"

    with transaction.atomic():  # the statement's own transaction, held open to look
        assert storage.take_dispatches([d.id for d in written.dispatches], now)
        assert synchronous_commit() == "off"
    assert synchronous_commit() == server  # set for that transaction only

    with transaction.atomic():
        assert storage.claim(first, "w", now, now + timedelta(seconds=30)) is not None
        assert synchronous_commit() == "off"
    assert synchronous_commit() == server

    storage.mark_burst([d.id for d in written.dispatches])
    with transaction.atomic():
        claimed = storage.claim_burst("default", "w", now, now + timedelta(seconds=30))
        assert claimed is not None and claimed.id == second
        assert synchronous_commit() == "off"
    assert synchronous_commit() == server
