"""Rebuilding a model's context reads only what is recent, on Postgres: the same
statements and the same rows read for a conversation of 100 entries and of 1,000, once
a summary covers all but the newest; a fork after it the same way. Rows are counted
from the plan Postgres ran (EXPLAIN ANALYZE), never timed."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from controlplane.storage import PostgresStorage
from controlplane.storage import statements as sql
from kernel import Draft, Kernel, ManualClock, Registry
from kernel.records import LAST_POSITION, SUMMARY, Entry

RECENT = 12


def conversation_of(kernel: Kernel, handle: Any, length: int) -> tuple[str, list[Entry]]:
    draft = Draft()
    conversation = draft.create_conversation()
    handle.commit(draft)
    entries: list[Entry] = []
    for start in range(0, length, 4):  # a few entries a commit, as turns write them
        draft = Draft()
        for number in range(start, min(start + 4, length)):
            draft.append(conversation, "user", {"text": f"message {number} " + "x" * 200})
        entries += handle.commit(draft).entries
    return conversation, entries


def summarize(handle: Any, conversation: str, first: Entry, last: Entry) -> Entry:
    draft = Draft()
    draft.append(conversation, SUMMARY, {"text": "earlier", "covers": {
        "first": {"id": first.id, "seq": first.seq, "ordinal": first.ordinal},
        "last": {"id": last.id, "seq": last.seq, "ordinal": last.ordinal}}})
    return handle.commit(draft).entries[0]


def rows_read(plan: Any) -> int:
    """Table rows the plan's scans produced or threw away, over all their loops (a bitmap
    index scan's row ids are the rows its heap scan then reads: counted once, there)."""
    node = plan.get("Plan", plan)
    own = 0
    if "Scan" in node["Node Type"] and node["Node Type"] != "Bitmap Index Scan":
        own = (node["Actual Rows"] + node.get("Rows Removed by Filter", 0)
               + node.get("Rows Removed by Index Recheck", 0)) * node["Actual Loops"]
    return own + sum(rows_read(child) for child in node.get("Plans", []))


def context_read(conversation: str, summary: Entry) -> tuple[int, list[str]]:
    """Rows read and scans used by the two statements of a context read, as Postgres
    ran them."""
    last = summary.payload["covers"]["last"]
    params = {"conversation": conversation,
              "upto_seq": LAST_POSITION[0], "upto_ordinal": LAST_POSITION[1],
              "after_seq": last["seq"], "after_ordinal": last["ordinal"]}
    rows, used = 0, []
    for statement in (sql.CONTEXT_SUMMARY, sql.CONTEXT_RANGE):
        with connection.cursor() as cur:
            cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + statement, params)
            (plan,) = cur.fetchone()
        plan = (json.loads(plan) if isinstance(plan, str) else plan)[0]
        rows += rows_read(plan)
        used += scans(plan["Plan"])
    return rows, used


def scans(node: Any) -> list[str]:
    found = [node["Node Type"]] if "Scan" in node["Node Type"] else []
    return found + [s for child in node.get("Plans", []) for s in scans(child)]


@pytest.mark.django_db(transaction=True)
def test_the_context_of_a_long_conversation_reads_what_a_short_one_does() -> None:
    kernel = Kernel(PostgresStorage(), Registry(), ManualClock())
    handle = kernel.create_session()
    built = {}
    for length in (100, 1000):
        conversation, entries = conversation_of(kernel, handle, length)
        summarize(handle, conversation, entries[0], entries[-RECENT - 1])
        built[length] = conversation, entries
    with connection.cursor() as cur:
        cur.execute("ANALYZE kernel_entry")
    measured = {}
    for length, (conversation, entries) in built.items():
        with CaptureQueriesContext(connection) as captured:
            context = kernel.context(conversation)
        assert [e.kind for e in context] == [SUMMARY] + ["user"] * RECENT
        assert context[1:] == entries[-RECENT:]
        rows, scanned = context_read(conversation, context[0])
        measured[length] = (len(captured), rows)
        assert "Seq Scan" not in scanned
    assert measured[100] == measured[1000]
    statements, rows = measured[1000]
    assert statements == 3  # the conversation, its latest summary, the range after it
    assert rows <= RECENT + 3  # the summary, the entries after it, nothing older


@pytest.mark.django_db(transaction=True)
def test_a_fork_after_a_summary_reads_its_inherited_part_by_range_too() -> None:
    kernel = Kernel(PostgresStorage(), Registry(), ManualClock())
    handle = kernel.create_session()
    counts = []
    for length in (100, 1000):
        conversation, entries = conversation_of(kernel, handle, length)
        summarize(handle, conversation, entries[0], entries[-RECENT - 1])
        draft = Draft()
        fork = draft.create_conversation(fork_of=conversation, fork_entry_id=entries[-1].id)
        draft.append(fork, "user", {"text": "in the fork"})
        handle.commit(draft)
        with CaptureQueriesContext(connection) as captured:
            context = kernel.context(fork)
        assert [e.payload["text"] for e in context[-2:]] == [
            entries[-1].payload["text"], "in the fork"]
        assert context[0].kind == SUMMARY and len(context) == RECENT + 2
        counts.append(len(captured))
    assert counts[0] == counts[1]

