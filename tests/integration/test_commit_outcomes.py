"""What a Postgres commit failure means, by when it happens.

COMMIT travels in the same pipelined round trip as the writes, so the storage has to
tell "the server refused" (nothing landed, the handle stays usable) from "the
connection was lost once COMMIT was on its way" (it may have landed: the handle is
poisoned, invariant 6). These tests make each happen on a real connection.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import pytest
from django.db import connection

from controlplane.storage import PostgresStorage
from kernel import Draft, Kernel, ManualClock, Registry, SessionPoisoned
from kernel.records import Entry
from kernel.session import SessionHandle
from kernel.storage import CommitReads

pytestmark = pytest.mark.django_db(transaction=True)


def make_kernel() -> Kernel:
    registry = Registry()
    registry.document("plan")
    return Kernel(PostgresStorage(), registry, ManualClock())


def a_session() -> tuple[Kernel, SessionHandle, str]:
    """A kernel, a session at seq 1 and the conversation that commit created."""
    kernel = make_kernel()
    handle = kernel.create_session()
    setup = Draft()
    conversation = setup.create_conversation()
    handle.commit(setup)
    return kernel, handle, conversation


def a_draft(conversation: str) -> Draft:
    draft = Draft(actor="user:ann")
    draft.append(conversation, "user", {"text": "hello"})
    draft.set("plan", "p", ["status"], "drafted")
    return draft


@contextmanager
def after_statement(sql: str, action: Callable[[], None]) -> Iterator[None]:
    """Run ``action`` right after the commit path has sent ``sql`` (a Django execute
    wrapper: the commit path's cursor goes through them)."""

    def wrapper(execute: Callable[..., Any], query: str, *args: Any) -> Any:
        result = execute(query, *args)
        if query == sql:
            action()
        return result

    with connection.execute_wrapper(wrapper):
        yield


def cut_the_connection() -> None:
    """The network drops: the client can neither send nor hear anything more."""
    sock = socket.socket(fileno=connection.connection.pgconn.socket)
    try:
        sock.shutdown(socket.SHUT_RDWR)
    finally:
        sock.detach()  # the socket belongs to libpq


def test_a_connection_lost_after_commit_was_sent_is_uncertain_and_it_did_land() -> None:
    kernel, handle, conversation = a_session()
    heard: list[int] = []
    kernel.after_commit(lambda ws: heard.append(ws.commit.seq))

    with after_statement("COMMIT", cut_the_connection), pytest.raises(SessionPoisoned):
        handle.commit(a_draft(conversation))
    assert handle.poisoned and heard == []

    connection.close()  # what a worker does with a broken connection
    reopened = make_kernel().open(handle.id)
    assert reopened.head_seq == 2  # the server had COMMIT: it landed
    assert [e.payload for e in kernel.entries(conversation)] == [{"text": "hello"}]
    assert reopened.commit(a_draft(conversation)).commit.seq == 3


def test_a_connection_lost_before_commit_was_sent_is_a_plain_failure() -> None:
    kernel, handle, conversation = a_session()

    with (
        after_statement(
            "INSERT INTO kernel_document_version (document_id, version, seq, ops, baseline, "
            "has_baseline) VALUES (%s, %s, %s, %s, %s, %s)",
            cut_the_connection,
        ),
        pytest.raises(Exception) as failure,
    ):
        handle.commit(a_draft(conversation))
    assert not isinstance(failure.value, SessionPoisoned)
    assert not handle.poisoned

    connection.close()
    assert make_kernel().open(handle.id).head_seq == 1
    assert kernel.entries(conversation) == []
    assert handle.commit(a_draft(conversation)).commit.seq == 2


def test_commit_refused_by_the_server_writes_nothing_and_the_handle_stays_usable() -> None:
    """A deferred foreign key fails at COMMIT itself: the server says no, so it is known
    that nothing landed."""
    kernel, handle, conversation = a_session()
    storage = kernel.storage
    draft = Draft(actor="user:ann")
    draft.append(conversation, "user", {"text": "hello"})

    def dangling(tx: CommitReads) -> Any:
        """The builder would refuse this; storage is given it directly, as a bug would."""
        from kernel.commit import Builder

        written = Builder(tx, draft, kernel.registry, kernel.clock.now()).build()
        entry: Entry = written.entries[0]
        return replace(written, entries=[replace(entry, conversation_id="conv_missing")])

    with pytest.raises(Exception, match="foreign key"):
        storage.commit(handle.id, dangling)
    assert storage.session(handle.id).head_seq == 1
    assert handle.commit(a_draft(conversation)).commit.seq == 2
