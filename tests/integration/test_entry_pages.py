"""Transcripts are paged in SQL: the session page's last entries, the pages of earlier
entries it loads, the API's pages of a conversation (a fork's among them) and the usage
totals never read a whole transcript."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from html import unescape
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from controlplane.reads import pages
from controlplane.reads import transcript as conversations
from controlplane.worker.runtime import runtime
from kernel import Draft
from kernel.agent.requests import USAGE, conversation_key

from .clients import login_as
from .sessions import turns_conversation

pytestmark = pytest.mark.django_db(transaction=True)

ENTRIES = 260  # past the page's ENTRY_TAIL and the API's pages of 100
FORK_AT = 99
FORK_OWN = 150


@contextmanager
def entry_rows() -> Iterator[list[int]]:
    """The row count of every query on the entries table made meanwhile."""
    counts: list[int] = []

    def count(execute: Callable[..., Any], sql: str, params: Any, many: bool,
              context: dict[str, Any]) -> Any:
        result = execute(sql, params, many, context)
        if "kernel_entry" in sql and sql.lstrip().upper().startswith("SELECT"):
            counts.append(context["cursor"].rowcount)
        return result

    with connection.execute_wrapper(count):
        yield counts


def long_conversation() -> tuple[str, str, str]:
    """A session with a conversation of ENTRIES model responses (response i used i input
    tokens and 1 output token) and a fork of it at entry FORK_AT with FORK_OWN of its own."""
    kernel = runtime().kernel
    handle = kernel.create_session()
    draft = Draft(actor="user:test")
    conversation = draft.create_conversation()
    handle.commit(draft)
    ids = []
    for start in range(0, ENTRIES, 20):
        draft = Draft(actor="task:turn_x")
        ids += [draft.append(conversation, "model_response", {
            "text": f"answer {i}", "tool_calls": [], "turn": "turn_x",
            "usage": {"input_tokens": i, "output_tokens": 1}}) for i in range(start, start + 20)]
        handle.commit(draft)
    draft = Draft(actor="user:test")
    fork = draft.create_conversation(fork_of=conversation, fork_entry_id=ids[FORK_AT])
    handle.commit(draft)
    draft = Draft(actor="user:test")
    for i in range(FORK_OWN):
        draft.append(fork, "user_message", {"text": f"fork {i}"})
    handle.commit(draft)
    return handle.id, conversation, fork


def test_the_page_shows_the_last_entries_and_the_whole_usage_reading_one_page() -> None:
    session_id, conversation, fork = long_conversation()
    every = runtime().kernel.entries(conversation)
    with entry_rows() as counts:
        found = {c.id: c for c in pages.transcript(session_id).items}
    assert counts and max(counts) <= pages.ENTRY_TAIL, counts
    shown = found[conversation]
    assert [item.entry.id for item in shown.items] == [e.id for e in every[-pages.ENTRY_TAIL:]]
    assert (shown.shown, shown.total) == (pages.ENTRY_TAIL, ENTRIES)
    assert shown.usage is not None
    assert (shown.usage.input_tokens, shown.usage.output_tokens) == (
        sum(range(ENTRIES)), ENTRIES)
    forked = found[fork]
    assert forked.total == FORK_AT + 1 + FORK_OWN
    assert forked.usage is not None  # the responses it inherits, up to the fork point
    assert (forked.usage.input_tokens, forked.usage.output_tokens) == (
        sum(range(FORK_AT + 1)), FORK_AT + 1)
    assert [item.entry.id for item in forked.items] == [
        e.id for e in runtime().kernel.entries(fork)[-pages.ENTRY_TAIL:]]


def counted_conversation(responses: int, fork: bool) -> tuple[str, str, str | None]:
    """A session with a conversation of ``responses`` model responses whose usage its
    running totals hold, as a turn's commits leave them (response i: i input tokens, 1
    output token, model ``m``); with ``fork``, a fork of it at its 10th response with 3
    responses of its own."""
    kernel = runtime().kernel
    handle = kernel.create_session()
    draft = Draft(actor="user:test")
    conversation = draft.create_conversation()
    handle.commit(draft)
    ids: list[str] = []

    def respond(draft: Draft, into: str, i: int) -> str:
        draft.update_document(USAGE, conversation_key(into),
                              {"op": "incr", "path": ["models", "m", "input_tokens"], "value": i},
                              {"op": "incr", "path": ["models", "m", "output_tokens"], "value": 1})
        return draft.append(into, "model_response", {
            "text": f"answer {i}", "tool_calls": [], "turn": "turn_x",
            "usage": {"input_tokens": i, "output_tokens": 1}})

    for start in range(0, responses, 100):
        draft = Draft(actor="task:turn_x")
        ids += [respond(draft, conversation, i) for i in range(start, min(start + 100, responses))]
        handle.commit(draft)
    if not fork:
        return handle.id, conversation, None
    draft = Draft(actor="user:test")
    forked = draft.create_conversation(fork_of=conversation, fork_entry_id=ids[9])
    handle.commit(draft)
    draft = Draft(actor="task:turn_y")
    for _ in range(3):
        respond(draft, forked, 1000)
    handle.commit(draft)
    return handle.id, conversation, forked


def test_the_page_reads_the_same_whatever_the_length_of_the_conversation(settings: Any) -> None:
    """The transcript of a long conversation costs what a short one's does: the same
    queries, each read of the entries cut by a LIMIT in SQL (the count too), and the
    usage total from the running totals, not from every response."""
    settings.MODEL_PRICES = {"m": {"input": 1.0, "output": 1000.0}}
    read = {}
    for responses in (pages.ENTRIES_COUNTED + 100, 3 * pages.ENTRIES_COUNTED):
        session_id, conversation, _ = counted_conversation(responses, fork=False)
        with CaptureQueriesContext(connection) as queries, entry_rows() as counts:
            (shown,) = [c for c in pages.transcript(session_id).items if c.id == conversation]
        on_entries = [q["sql"] for q in queries.captured_queries if "kernel_entry" in q["sql"]]
        unbounded = [sql for sql in on_entries if " LIMIT " not in sql]
        assert on_entries and not unbounded, unbounded
        assert max(counts) <= pages.ENTRY_TAIL, counts
        read[responses] = len(queries.captured_queries)
        assert (shown.shown, shown.total, shown.more) == (
            pages.ENTRY_TAIL, pages.ENTRIES_COUNTED, True)
        assert shown.usage is not None
        assert (shown.usage.input_tokens, shown.usage.output_tokens) == (
            sum(range(responses)), responses)
        assert shown.usage.cost == pytest.approx((sum(range(responses)) + 1000 * responses) / 1e6)
    assert len(set(read.values())) == 1, read


def test_a_forks_usage_is_its_running_totals_and_its_origins_up_to_the_fork() -> None:
    session_id, conversation, fork = counted_conversation(50, fork=True)
    found = {c.id: c for c in pages.transcript(session_id).items}
    forked = found[fork]
    assert (forked.shown, forked.total, forked.more) == (13, 13, False)
    assert forked.usage is not None
    assert (forked.usage.input_tokens, forked.usage.output_tokens) == (
        sum(range(10)) + 3000, 13)
    assert found[conversation].usage is not None
    assert found[conversation].usage.input_tokens == sum(range(50))


def test_the_usage_total_is_priced_per_turn(settings: Any) -> None:
    session_id, conversation, _ = long_conversation()
    settings.MODEL_PRICES = {"": {"input": 1.0, "output": 1000.0}}  # turn_x has no task
    total = conversations.usage_total(session_id, conversation)
    assert total is not None and total.cost == pytest.approx(
        (sum(range(ENTRIES)) + 1000 * ENTRIES) / 1_000_000)


def test_api_pages_of_a_fork_are_its_transcript_in_order_read_a_page_at_a_time() -> None:
    _, _, fork = long_conversation()
    client: Client = login_as("viewer")
    read, after = [], None
    with entry_rows() as counts:
        while True:
            params = {"limit": 100, **({"after": after} if after else {})}
            page = client.get(f"/api/conversations/{fork}/entries", params).json()
            read += [e["id"] for e in page["entries"]]
            after = page["next"]
            if after is None:
                break
    assert read == [e.id for e in runtime().kernel.entries(fork)]
    assert len(read) == FORK_AT + 1 + FORK_OWN
    assert counts and max(counts) <= 101, counts  # limit + 1 per conversation spanned
    assert client.get("/api/conversations/conv_nope/entries").status_code == 404


def test_the_tool_cards_read_the_tasks_of_the_shown_calls_only() -> None:
    """A call's card reads its tool task; the page reads the tasks of the calls it shows,
    not every tool task the session ever made."""
    kernel = runtime().kernel
    handle = kernel.create_session()
    draft = Draft(actor="user:test")
    conversation = draft.create_conversation()
    handle.commit(draft)
    turns = 300
    for start in range(0, turns, 50):
        draft = Draft(actor="task:turn_x")
        for i in range(start, start + 50):
            call = {"id": f"c{i}", "name": "lookup", "arguments": {}}
            draft.append(conversation, "model_response", {
                "text": "", "tool_calls": [call], "turn": "turn_x", "attempt": 1})
            draft.create_task("agent-tool", {"call": call, "conversation_id": conversation})
            draft.append(conversation, "tool_result", {"call_id": f"c{i}", "name": "lookup",
                                                       "result": {"n": i}})
        handle.commit(draft)
    rows: list[int] = []

    def count(execute: Callable[..., Any], sql: str, params: Any, many: bool,
              context: dict[str, Any]) -> Any:
        result = execute(sql, params, many, context)
        if '"kernel_task"' in sql and sql.lstrip().upper().startswith("SELECT"):
            rows.append(context["cursor"].rowcount)
        return result

    with connection.execute_wrapper(count):
        (shown,) = [c for c in pages.transcript(handle.id).items if c.id == conversation]
    cards = [card for item in shown.items for card in item.tools]
    assert len(cards) == pages.ENTRY_TAIL // 2 and all(card.task_id for card in cards)
    assert max(rows) <= len(cards), rows


SHOWN_ENTRY = re.compile(r'<li class="entry [^"]*" id="entry-([^"]+)"')
EARLIER = re.compile(r'<button type="button" hx-get="([^"]+)"[^>]*>Show earlier entries<')


def section(html: str, conversation: str) -> str:
    """The part of a session page that shows ``conversation``."""
    start = html.index(f'aria-labelledby="conv-{conversation}"')
    return html[start:html.index("</section>", start)]


def walked(client: Client, shown: str) -> tuple[list[str], str]:
    """The entries ``shown`` (a conversation's part of the session page) and those its
    "earlier entries" buttons load, page after page, in order; and every page's HTML."""
    ids, pages_read = SHOWN_ENTRY.findall(shown), [shown]
    button = EARLIER.search(shown)
    while button:
        answer = client.get(unescape(button.group(1)))
        assert answer.status_code == 200, answer.status_code
        page = answer.content.decode()
        ids = SHOWN_ENTRY.findall(page) + ids
        pages_read.append(page)
        button = EARLIER.search(page)
    return ids, "".join(pages_read)


def test_the_page_shows_the_latest_entries_and_loads_the_earlier_ones_by_pages() -> None:
    """A long conversation's session page shows a page of its latest entries, as the task
    tree shows a page of children, and its "earlier entries" button walks back through
    every other entry a page at a time; a call at the end of a page shows its result,
    which is on the page after it."""
    turns = 130
    session_id, conversation = turns_conversation(turns)
    every = runtime().kernel.entries(conversation)
    client = login_as("viewer")
    shown = section(client.get(f"/sessions/{session_id}/").content.decode(), conversation)
    latest = SHOWN_ENTRY.findall(shown)
    assert pages.ENTRY_TAIL <= pages.CHILD_PAGE
    assert 0 < len(latest) <= pages.ENTRY_TAIL
    assert latest == [e.id for e in every[-pages.ENTRY_TAIL:] if e.kind != "tool_result"]
    with entry_rows() as counts:
        ids, html = walked(client, shown)
    assert ids == [e.id for e in every if e.kind != "tool_result"]
    assert counts and max(counts) <= pages.ENTRY_PAGE + 1, counts
    assert html.count('<pre tabindex="0" class="json result">') == turns  # every call's result
    assert html.count('class="badge tool-succeeded"') == turns


def test_a_forks_earlier_entries_go_back_through_its_origin() -> None:
    session_id, _, fork = long_conversation()
    client = login_as("viewer")
    shown = section(client.get(f"/sessions/{session_id}/").content.decode(), fork)
    ids, _ = walked(client, shown)
    assert ids == [e.id for e in runtime().kernel.entries(fork)]


def test_earlier_entries_of_what_the_session_does_not_hold_are_not_found() -> None:
    session_id, conversation, fork = long_conversation()
    other, _ = turns_conversation(1)
    client = login_as("viewer")
    first = runtime().kernel.entries(conversation)[0].id
    own = runtime().kernel.entries(fork)[-1].id
    url = "/sessions/{}/conversations/{}/entries"
    assert client.get(url.format(session_id, conversation), {"before": first}).status_code == 200
    assert client.get(url.format(other, conversation), {"before": first}).status_code == 404
    assert client.get(url.format(session_id, "conv_nope"), {"before": first}).status_code == 404
    # The fork's own entry is in no transcript of its origin.
    assert client.get(url.format(session_id, conversation), {"before": own}).status_code == 404
    assert client.get(url.format(session_id, conversation)).status_code == 404


def test_the_entries_between_two_load_by_pages_too() -> None:
    """What a live update's latest page skipped (more entries came at once than a page
    holds): the entries after the page's newest and before the fresh page's oldest."""
    session_id, conversation = turns_conversation(60)
    every = runtime().kernel.entries(conversation)
    client = login_as("viewer")
    first = client.get(f"/sessions/{session_id}/conversations/{conversation}/entries",
                       {"before": every[150].id, "after": every[20].id}).content.decode()
    ids, _ = walked(client, first)
    assert ids == [e.id for e in every[21:150] if e.kind != "tool_result"]
    assert f"after={every[20].id}" in first  # the page before it stops there too


def test_a_page_ending_with_a_call_whose_id_the_page_answered_before_shows_its_result() -> None:
    """Some models number their calls per response: the page's last response calls
    ``call_0`` as an earlier one on the page did, and its result is on the next page."""
    handle = runtime().kernel.create_session()
    draft = Draft(actor="user:test")
    conversation = draft.create_conversation()
    handle.commit(draft)
    draft = Draft(actor="task:turn_x")
    call = [{"id": "call_0", "name": "lookup", "arguments": {}}]
    for n in (1, 2):
        draft.append(conversation, "model_response", {"text": "", "tool_calls": call,
                                                      "turn": "turn_x"})
        draft.append(conversation, "tool_result", {"call_id": "call_0", "name": "lookup",
                                                   "result": f"answer {n}"})
    draft.append(conversation, "model_response", {"text": "done", "turn": "turn_x"})
    handle.commit(draft)
    every = runtime().kernel.entries(conversation)
    page = conversations.earlier(handle.id, conversation, False, every[3].id, 10)
    cards = [card for item in page.items for card in item.tools]
    assert [(c.state, c.result) for c in cards] == [("succeeded", '"answer 1"'),
                                                     ("succeeded", '"answer 2"')]


def test_a_call_made_again_in_a_branch_shows_each_conversations_own_task() -> None:
    """A branch makes the calls of the response it starts from anew, under the same call
    ids, in the fork: the original's card shows the original's tool task, the fork's the
    fork's."""
    handle = runtime().kernel.create_session()
    draft = Draft(actor="user:test")
    conversation = draft.create_conversation()
    handle.commit(draft)
    call = {"id": "call_a", "name": "lookup", "arguments": {}}
    draft = Draft(actor="task:turn_x")
    response = draft.append(conversation, "model_response", {
        "text": "", "tool_calls": [call], "turn": "turn_x", "attempt": 1})
    first = draft.create_task("agent-tool", {"call": call, "conversation_id": conversation})
    draft.append(conversation, "tool_result", {"call_id": "call_a", "name": "lookup",
                                               "result": "first"})
    handle.commit(draft)
    draft = Draft(actor="user:test")
    fork = draft.create_conversation(fork_of=conversation, fork_entry_id=response)
    again = draft.create_task("agent-tool", {"call": call, "conversation_id": fork})
    draft.append(fork, "tool_result", {"call_id": "call_a", "name": "lookup",
                                       "result": "again"})
    handle.commit(draft)
    shown = {c.id: [card for item in c.items for card in item.tools]
             for c in pages.transcript(handle.id).items}
    assert [(c.task_id, c.result) for c in shown[conversation]] == [(first, '"first"')]
    assert [(c.task_id, c.result) for c in shown[fork]] == [(again, '"again"')]
