"""The LangGraph saver where LangGraph's own savers (``InMemorySaver``, ``PostgresSaver``)
agree and the conformance suite does not look: a thread named ``""`` or holding ``/``
(refused here), a checkpoint id ``""``, a checkpoint id holding ``/`` (refused here),
namespaces whose names start with another's name and ``/``, a removal (``delete_thread``,
``prune``) while another saver puts to the same thread, and a lost database connection.
On the in-memory storage and on Postgres."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_metadata

from kernel import Kernel, KernelError, Registry, Storage
from kernel.hosts.langgraph import SessionStoreSaver
from kernel.hosts.langgraph.layout import INDEX


@pytest.fixture
def savers(storage: Callable[[], Storage]) -> Iterator[Callable[[], SessionStoreSaver]]:
    """Savers on one storage, each with a kernel (and on Postgres a connection) of its
    own, as savers in two processes have."""
    made: list[SessionStoreSaver] = []

    def saver() -> SessionStoreSaver:
        made.append(SessionStoreSaver(Kernel(storage(), Registry())))
        return made[-1]

    yield saver
    for one in made:
        one.close()


def config(thread_id: str, ns: str = "", checkpoint_id: str | None = None) -> dict[str, Any]:
    conf: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": ns}
    if checkpoint_id is not None:
        conf["checkpoint_id"] = checkpoint_id
    return {"configurable": conf}


def put(saver: SessionStoreSaver, to: dict[str, Any], value: Any, step: int = 0) -> dict[str, Any]:
    checkpoint = generate_checkpoint(channel_values={"value": value},
                                     channel_versions={"value": step + 1})
    return saver.put(to, checkpoint, generate_metadata(step=step), {"value": step + 1})


def value(saver: SessionStoreSaver, at: dict[str, Any]) -> Any:
    found = saver.get_tuple(at)
    return None if found is None else found.checkpoint["channel_values"]["value"]


def listed(saver: SessionStoreSaver, at: dict[str, Any]) -> list[Any]:
    return [t.checkpoint["channel_values"]["value"] for t in saver.list(at)]


def test_a_thread_named_with_the_empty_string_is_refused_before_anything_is_written(
    savers: Callable[[], SessionStoreSaver], storage: Callable[[], Storage],
) -> None:
    """A thread is a session, which an empty id cannot name on a page or in the API:
    writing to it is refused naming ``thread_id`` (where another id would have made a
    session that no later read could find), and reading it finds nothing."""
    saver = savers()
    with pytest.raises(ValueError, match="thread_id"):
        put(saver, config(""), "kept")
    with pytest.raises(ValueError, match="thread_id"):
        saver.put_writes(config("", checkpoint_id="c1"), [("value", "written")], "task")
    with pytest.raises(ValueError, match="thread_id"):
        put(saver, config("t"), "kept")
        saver.copy_thread("t", "")
    assert value(saver, config("")) is None and listed(saver, config("")) == []
    assert [t.config["configurable"]["thread_id"] for t in saver.list(None)] == ["t"]
    assert storage().session("") is None


def test_a_thread_named_with_a_slash_is_refused_before_anything_is_written(
    savers: Callable[[], SessionStoreSaver], storage: Callable[[], Storage],
) -> None:
    """A session is named by one segment of a path (its page, its API paths, its
    sockets), which a ``/`` would end: such a thread's session would have no page, and
    every page linking to it (the sessions list among them) would fail. Writing to it
    is refused naming ``thread_id`` before anything is written; so is a session the
    kernel is asked to make under such a name."""
    saver = savers()
    with pytest.raises(ValueError, match="thread_id"):
        put(saver, config("customer/42"), "kept")
    with pytest.raises(ValueError, match="thread_id"):
        saver.put_writes(config("customer/42", checkpoint_id="c1"), [("value", "w")], "task")
    assert listed(saver, config("customer/42")) == [] and list(saver.list(None)) == []
    assert storage().session("customer/42") is None
    with pytest.raises(ValueError, match="session id"):
        Kernel(storage(), Registry()).create_session("customer/42")
    assert storage().session("customer/42") is None


def test_the_newest_checkpoint_of_a_namespace_is_its_own_not_a_longer_named_ones(
    savers: Callable[[], SessionStoreSaver],
) -> None:
    """A namespace's documents are keyed ``<ns>/<id>``: those of ``sub/x`` (and of the
    root's ``/sub``) start with ``sub/`` (``/``) too, and a later checkpoint of theirs
    sorts after every one of the shorter name. Subgraphs compiled with
    ``checkpointer=True`` save under their node's name: nodes ``agent`` and
    ``agent/tools`` are such a pair, and ``agent`` would go on from the other's state."""
    saver = savers()
    put(saver, config("t"), "root")
    put(saver, config("t", "sub"), "sub")
    put(saver, config("t", "/node:1"), "slash node")
    put(saver, config("t", "sub/x"), "sub/x")
    assert value(saver, config("t")) == "root"
    assert value(saver, config("t", "sub")) == "sub"
    assert value(saver, config("t", "/node:1")) == "slash node"
    assert value(saver, config("t", "sub/x")) == "sub/x"


def test_a_checkpoint_id_with_a_slash_is_refused_and_never_read_as_another_namespaces(
    savers: Callable[[], SessionStoreSaver], storage: Callable[[], Storage],
) -> None:
    """A checkpoint's key is ``<ns>/<id>``: namespace ``a`` with id ``b/c`` and namespace
    ``a/b`` with id ``c`` would share a document, the second put overwriting the first's
    state. LangGraph's ids hold no ``/``; one that does is refused before anything is
    written, and reading it never finds the other namespace's checkpoint."""
    saver = savers()
    checkpoint = generate_checkpoint(channel_values={"value": "b/c"},
                                     channel_versions={"value": 1})
    checkpoint["id"] = "b/c"
    with pytest.raises(ValueError, match="checkpoint id"):
        saver.put(config("t", "a"), checkpoint, generate_metadata(step=0), {"value": 1})
    assert storage().session("t") is None
    checkpoint = generate_checkpoint(channel_values={"value": "a/b"},
                                     channel_versions={"value": 1})
    checkpoint["id"] = "c"
    saver.put(config("t", "a/b"), checkpoint, generate_metadata(step=0), {"value": 1})
    assert value(saver, config("t", "a/b", "c")) == "a/b"
    assert value(saver, config("t", "a", "b/c")) is None


def put_once_the_index_is_read(
    remover: SessionStoreSaver, writer: SessionStoreSaver, to: dict[str, Any], what: Any,
    step: int,
) -> list[dict[str, Any]]:
    """Make ``writer`` put a checkpoint just after ``remover`` next reads the thread's
    index: another process's put landing while the removal is worked out."""
    read = remover.kernel.versioned_document
    saved: list[dict[str, Any]] = []

    def reading(session_id: str, kind: str, key: str) -> tuple[Any, int]:
        found = read(session_id, kind, key)
        if kind == INDEX and not saved:
            saved.append(put(writer, to, what, step))
        return found

    remover.kernel.versioned_document = reading  # type: ignore[method-assign]
    return saved


def test_a_checkpoint_put_while_the_thread_is_deleted_is_deleted_or_kept_whole(
    savers: Callable[[], SessionStoreSaver],
) -> None:
    """Either way the thread reads the same through ``get_tuple`` and ``list``, and a
    later delete removes it: never a checkpoint that ``get_tuple`` returns, ``list``
    does not show and no delete reaches."""
    writer, remover = savers(), savers()
    put(writer, config("t"), "first")
    put_once_the_index_is_read(remover, writer, config("t"), "put meanwhile", 1)
    remover.delete_thread("t")
    newest, every = value(remover, config("t")), listed(remover, config("t"))
    assert (newest, every) in [(None, []), ("put meanwhile", ["put meanwhile"])]
    remover.delete_thread("t")
    assert (value(remover, config("t")), listed(remover, config("t"))) == (None, [])
    assert value(writer, config("t")) is None


def test_a_prune_keeps_the_newest_checkpoint_even_one_put_while_it_prunes(
    savers: Callable[[], SessionStoreSaver],
) -> None:
    writer, pruner = savers(), savers()
    saved = put(writer, config("t"), "older")
    saved = put(writer, saved, "old", 1)
    put_once_the_index_is_read(pruner, writer, saved, "newest", 2)
    pruner.prune(["t"])  # keep_latest
    assert value(pruner, config("t")) == "newest"
    assert listed(pruner, config("t")) == ["newest"]


def test_an_empty_checkpoint_id_addresses_the_newest_checkpoint(
    savers: Callable[[], SessionStoreSaver],
) -> None:
    """LangGraph reads ``checkpoint_id: ""`` as no id (a run so configured goes on from
    the thread's newest checkpoint): a saver that found nothing would start the thread
    over from an empty state."""
    saver = savers()
    saved = put(saver, config("t"), "older")
    put(saver, saved, "newest", 1)
    assert value(saver, config("t", checkpoint_id="")) == "newest"
    assert listed(saver, config("t", checkpoint_id="")) == ["newest", "older"]


@pytest.mark.django_db(transaction=True)
def test_the_saver_works_again_once_its_database_connection_was_lost() -> None:
    """The saver's storage work runs on a thread of its own, whose connection no request
    or task cycle ever replaces: after Postgres dropped it (a restart), the call that
    meets the dead connection fails, and the next ones work on a new connection."""
    from django.db import connection

    from controlplane.storage import PostgresStorage
    from tests.databases import url_of_test_database

    saver = SessionStoreSaver(Kernel(PostgresStorage(), Registry()))
    saved = put(saver, config("t"), "before")

    def backend() -> int:
        connection.ensure_connection()
        return int(connection.connection.info.backend_pid)

    with psycopg.connect(url_of_test_database(), autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [saver._call(backend)])
    with pytest.raises(KernelError):
        put(saver, saved, "lost with the connection", 1)
    put(saver, saved, "after", 2)
    assert value(saver, config("t")) == "after"
    saver.close()
