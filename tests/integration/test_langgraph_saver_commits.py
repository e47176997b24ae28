"""The LangGraph saver's writes on Postgres: a ``put`` and a ``put_writes`` are each a
kernel commit that only writes documents (``CommitKind.DOCUMENTS_ONLY``), one statement
each once the thread is known; a ``put`` writes two documents, the checkpoint and the
thread's index, and the newest checkpoint still reads back without the namespace's head
that it no longer writes."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_metadata

from controlplane.storage import PostgresStorage
from controlplane.storage import statements as sql
from kernel import Kernel, Registry
from kernel.hosts.langgraph import KeepLatest, SessionStoreSaver
from kernel.hosts.langgraph.layout import CHECKPOINT, INDEX, checkpoint_key

from .round_trips import counting_pipelines, log_is_whole

pytestmark = pytest.mark.django_db(transaction=True)


def put(saver: SessionStoreSaver, config: dict[str, Any], step: int) -> dict[str, Any]:
    values = {"messages": [f"message {step}"], "step": step}
    versions: dict[str, str | int | float] = {channel: step for channel in values}
    checkpoint = generate_checkpoint(channel_values=values, channel_versions=versions)
    # The saver's own method, on this thread: its connection is the one captured here.
    return saver._put(config, checkpoint, generate_metadata(step=step), versions)


def test_each_put_and_put_writes_is_one_statement() -> None:
    kernel = Kernel(PostgresStorage(), Registry())
    saver = SessionStoreSaver(kernel)
    config: dict[str, Any] = {"configurable": {"thread_id": "t1", "checkpoint_ns": ""}}
    config = put(saver, config, 0)  # the first registers the thread in the directory
    for step in range(1, 4):
        with counting_pipelines() as pipelines, CaptureQueriesContext(connection) as captured:
            config = put(saver, config, step)
            saver._put_writes(config, [("messages", f"reply {step}"), ("step", step)],
                              f"task-{step}", "")
        assert [q["sql"].split(" AS ")[0] for q in captured] == ["WITH head"] * 2
        assert pipelines == [0]
    commits = kernel.commits_after("t1", 0)
    put_kinds = [[i["kind"] for i in c.summary] for c in commits[-2:-1]]
    assert put_kinds == [[CHECKPOINT, INDEX]]
    writes = commits[-1].summary
    assert [(i["kind"], i["key"]) for i in writes] == [
        (CHECKPOINT, checkpoint_key("", config["configurable"]["checkpoint_id"]))]
    assert writes[0]["version"] == 2  # the checkpoint, continued by its writes
    log_is_whole(kernel, "t1")
    newest = saver._get_tuple({"configurable": {"thread_id": "t1"}})
    assert newest is not None and newest.checkpoint["id"] == config["configurable"][
        "checkpoint_id"]
    assert [w[1:] for w in newest.pending_writes] == [("messages", "reply 3"), ("step", 3)]
    with connection.cursor() as cur:  # the read is planned once per connection
        cur.execute("SELECT statement FROM pg_prepared_statements")
        prepared = [r[0] for r in cur.fetchall()]  # with $n for the placeholders
        assert any(p.startswith(sql.NEWEST_DOCUMENT[:200]) for p in prepared), prepared
    saver._io.shutdown(wait=True)


def test_the_newest_checkpoint_is_found_past_writes_saved_against_a_removed_one() -> None:
    """Writes saved against a checkpoint that is gone make a document with no checkpoint
    that sorts newest: the read goes to the index's newest live checkpoint."""
    saver = SessionStoreSaver(Kernel(PostgresStorage(), Registry()))
    config: dict[str, Any] = {"configurable": {"thread_id": "t2", "checkpoint_ns": ""}}
    first = put(saver, config, 1)
    put(saver, first, 2)
    saver._prune(["t2"], KeepLatest(1))
    gone = {"configurable": {"thread_id": "t2", "checkpoint_ns": "",
                             "checkpoint_id": "zzzz-after-every-id"}}
    saver._put_writes(gone, [("step", 9)], "late", "")
    newest = saver._get_tuple({"configurable": {"thread_id": "t2"}})
    kept = saver._list({"configurable": {"thread_id": "t2"}}, None, None, None)
    assert newest is not None and [t.checkpoint["id"] for t in kept] == [newest.checkpoint["id"]]
    saver._io.shutdown(wait=True)
