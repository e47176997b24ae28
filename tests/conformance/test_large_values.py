"""Values above the artifact threshold, on both storages (:mod:`kernel.large_values`):
an entry payload (or a field of one) and a document op's value are stored apart as
artifacts before their commit and read back whole, their hash checked; a corrupt one is
refused with the same error on both; a writer that dies storing one leaves no record
naming it; the sweep keeps every artifact an entry or a document version references."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from kernel import Draft, InMemoryStorage, Kernel, Registry, Run, Scheduler, Transition
from kernel.artifacts import (
    GRACE,
    HOLDS,
    IN_PLACE_OF,
    REFERENCE,
    ArtifactStore,
    CorruptArtifact,
    InMemoryArtifacts,
    MissingArtifact,
    digest_of,
    encoded,
    is_stand_in,
    load,
    offload,
)
from tests.unit.crashes import Crash, DiesMidWrite

from .world import World

ABOVE = 4_096


def text(tag: str, words: int = 1_000) -> str:
    return " ".join(f"{tag}{n}" for n in range(words))


def store_for(world: World) -> tuple[ArtifactStore, Callable[[str, bytes], None]]:
    """The world's own kind of artifact store, and how to damage an object in it."""
    if isinstance(world.storage, InMemoryStorage):
        memory = InMemoryArtifacts(world.clock.now)
        return memory, memory.corrupt
    from django.db import connection

    from controlplane.storage import PostgresArtifacts

    def corrupt(digest: str, data: bytes) -> None:
        with connection.cursor() as cur:
            cur.execute("UPDATE kernel_artifact SET data = %s WHERE digest = %s", [data, digest])

    return PostgresArtifacts(), corrupt


def kernel_for(world: World, store: ArtifactStore) -> Kernel:
    registry = Registry()
    registry.document("plan")
    return Kernel(world.storage, registry, world.clock, artifacts=store, artifact_above=ABOVE)


def conversation_in(kernel: Kernel) -> tuple[Any, str]:
    handle = kernel.create_session()
    draft = Draft()
    conversation = draft.create_conversation()
    handle.commit(draft)
    return handle, conversation


def test_a_large_entry_payload_is_stored_apart_and_read_back_whole(world: World) -> None:
    store, _ = store_for(world)
    kernel = kernel_for(world, store)
    handle, conversation = conversation_in(kernel)
    response = {"turn": "task_1", "usage": {"input_tokens": 3}, "text": text("w")}
    listed = [text("a"), text("b")]
    small = {"text": "hello"}
    draft = Draft()
    ids = [draft.append(conversation, kind, payload) for kind, payload in
           (("response", response), ("listed", listed), ("user", small))]
    draft.set("plan", "p", ["n"], 1)
    handle.commit(draft)

    stored = {e.id: e.payload for e in world.storage.conversation_entries(conversation)}
    kept = stored[ids[0]]
    assert kept["turn"] == "task_1" and kept["usage"] == {"input_tokens": 3}  # small: inline
    assert is_stand_in(kept["text"])
    assert kept["text"][IN_PLACE_OF] == f"entry {ids[0]} (response) payload field 'text'"
    assert kept["text"]["excerpt"] == response["text"][:1_000]
    assert kept["text"][REFERENCE] == digest_of(encoded(response["text"]))
    assert is_stand_in(stored[ids[1]]) and stored[ids[2]] == small
    assert len(encoded(kept)) <= ABOVE

    world.reopen()
    again = kernel_for(world, store)  # a process that knows only what was stored
    read = {e.id: e.payload for e in again.entries(conversation)}
    assert read == {ids[0]: response, ids[1]: listed, ids[2]: small}
    assert [e.payload for e in again.context(conversation)] == [response, listed, small]


def test_a_large_document_value_is_stored_apart_and_every_version_reads_whole(
    world: World,
) -> None:
    store, _ = store_for(world)
    kernel = kernel_for(world, store)
    handle = kernel.create_session()
    big = {"rows": [text(f"r{n}-", 40) for n in range(20)]}
    history = []
    for ops in (
        [{"op": "set", "path": ["big"], "value": big}],
        [{"op": "set", "path": ["big", "seen"], "value": 1}],  # reaches inside it
        [{"op": "append", "path": ["log"], "value": text("l")}],
        [{"op": "append", "path": ["log"], "value": "short"}],
        [{"op": "set", "path": [], "value": {"whole": text("x")}}],
        [{"op": "set", "path": ["after"], "value": 2}],
    ):
        draft = Draft()
        draft.update_document("plan", "p", *ops)
        handle.commit(draft)
        history.append(kernel.document(handle.id, "plan", "p"))
    assert history[1] == {"big": {**big, "seen": 1}}
    assert history[3] == {"big": {**big, "seen": 1}, "log": [text("l"), "short"]}
    assert history[5] == {"whole": text("x"), "after": 2}
    head = world.storage.document_head(handle.id, "plan", "p")
    first = world.storage.document_versions(head.id, 1)[0]
    assert is_stand_in(first.baseline["big"])  # the baseline holds the stand-in
    assert first.baseline["big"][IN_PLACE_OF] == "document plan/p set value at big"
    # Weighed as the value it stands for: the next baseline is due as late as before.
    assert head.baseline_bytes > len(encoded({"whole": text("x")}))
    world.reopen()
    again = kernel_for(world, store)
    for version, value in enumerate(history, start=1):
        assert again.document(handle.id, "plan", "p", version=version) == value
    assert again.versioned_document(handle.id, "plan", "p") == (history[-1], 6)


def test_a_corrupt_artifact_is_refused_naming_the_record_on_both_storages(world: World) -> None:
    store, corrupt = store_for(world)
    kernel = kernel_for(world, store)
    handle, conversation = conversation_in(kernel)
    draft = Draft()
    entry_id = draft.append(conversation, "note", {"text": text("c"), "n": 1})
    draft.set("plan", "p", ["big"], text("d"))
    handle.commit(draft)
    note = digest_of(encoded(text("c")))
    value = digest_of(encoded(text("d")))
    corrupt(note, b'"damaged"')
    corrupt(value, b'"damaged"')
    found = digest_of(b'"damaged"')
    with pytest.raises(CorruptArtifact) as refused:
        kernel.entries(conversation)
    assert str(refused.value) == (
        f"entry {entry_id} (note) payload field 'text': artifact {note} is corrupt: its 9 "
        f"stored bytes hash to {found}")
    with pytest.raises(CorruptArtifact) as refused:
        kernel.document(handle.id, "plan", "p")
    assert str(refused.value) == (
        f"document plan/p set value at big: artifact {value} is corrupt: its 9 stored "
        f"bytes hash to {found}")


def test_a_writer_that_dies_storing_a_large_value_leaves_no_record_naming_it(
    world: World,
) -> None:
    store = DiesMidWrite(world.clock.now)
    kernel = kernel_for(world, store)
    handle, conversation = conversation_in(kernel)
    draft = Draft()
    draft.append(conversation, "note", {"text": text("h")})
    with pytest.raises(Crash):
        handle.commit(draft)
    [half] = list(store._objects)
    assert world.storage.conversation_entries(conversation) == []
    assert world.storage.session(handle.id).head_seq == handle.head_seq
    assert world.storage.referenced_artifacts([half]) == set()
    kernel.open(handle.id).commit(draft)  # again: stored whole, then referenced
    assert [e.payload for e in kernel.entries(conversation)] == [{"text": text("h")}]


def test_the_sweep_keeps_what_entries_and_documents_reference(world: World) -> None:
    store = InMemoryArtifacts(world.clock.now)
    kernel = kernel_for(world, store)
    handle, conversation = conversation_in(kernel)
    result = offload(store, {"rows": text("t")}, ABOVE)  # a tool's result reference
    draft = Draft()
    draft.append(conversation, "tool_result", {"call_id": "c1", "result": result,
                                               "more": text("m")})
    draft.append(conversation, "note", {"inner": [result, text("i")]})
    draft.set("plan", "p", ["big"], text("p"))
    handle.commit(draft)
    inner = [e.payload["inner"] for e in world.storage.conversation_entries(conversation)
             if e.kind == "note"][0]
    assert inner[HOLDS] == [result[REFERENCE]]  # named, so a search finds it
    orphan = store.put(b"left by a writer that died before its commit", "text/plain")
    every = set(store._objects)
    assert len(every) == 5
    assert world.storage.referenced_artifacts(every) == every - {orphan}
    world.clock.advance(GRACE + timedelta(seconds=1))
    assert store.sweep(world.storage.referenced_artifacts, world.clock.now()) == 1
    with pytest.raises(MissingArtifact):
        store.get(orphan)
    assert kernel.entries(conversation)[1].payload == {"inner": [result, text("i")]}
    assert kernel.document(handle.id, "plan", "p") == {"big": text("p")}


def test_the_sweep_keeps_what_a_task_that_has_not_ended_stored_until_it_ends(
    world: World,
) -> None:
    """A value a task stored with ``Run.store_large`` and keeps only in its checkpoint,
    or passed only in a child's input, is read back after a sleep longer than the grace
    and a sweep in between; once both tasks ended, the next sweep removes them."""
    store = InMemoryArtifacts(world.clock.now)
    kernel = kernel_for(world, store)
    registry = kernel.registry
    nap = (GRACE * 2).total_seconds()
    mine, theirs = {"rows": text("c")}, {"rows": text("i")}
    stored: dict[str, str] = {}

    @registry.task("keeper")
    class Keeper:
        initial = "start"

        def start(self, run: Run) -> Transition:
            kept = run.store_large(mine, ABOVE, "keeper checkpoint")
            given = run.store_large(theirs, ABOVE, "reader input")
            stored.update(checkpoint=kept[REFERENCE], input=given[REFERENCE])
            run.spawn("reader", {"big": given}, owned=False)
            return run.sleep(nap, then="wake", checkpoint={"kept": kept})

        def wake(self, run: Run) -> Transition:
            return run.succeed({"same": load(store, run.checkpoint["kept"]) == mine})

    @registry.task("reader")
    class Reader:
        initial = "nap"

        def nap(self, run: Run) -> Transition:
            return run.sleep(nap, then="wake")

        def wake(self, run: Run) -> Transition:
            return run.succeed({"same": load(store, run.input["big"]) == theirs})

    handle = kernel.create_session()
    draft = Draft()
    keeper = draft.create_task("keeper", {})
    handle.commit(draft)
    scheduler = Scheduler(kernel, "w1", 30.0)
    scheduler.run_until_idle()
    world.clock.advance(GRACE + timedelta(seconds=1))
    store.sweep(world.storage.referenced_artifacts, world.clock.now())
    world.clock.advance(nap)
    scheduler.run_until_idle()
    ended = [world.storage.task(keeper), *world.storage.session_tasks(handle.id)[1:]]
    assert [t.outcome for t in ended] == [
        {"kind": "succeeded", "result": {"same": True}}] * 2
    # Ended: what their records name is for display, and no longer keeps the artifacts.
    assert world.storage.referenced_artifacts(set(stored.values())) == set()
    assert store.sweep(world.storage.referenced_artifacts, world.clock.now()) == 2


def test_a_large_value_holding_references_names_them_so_a_task_keeps_them_too(
    world: World,
) -> None:
    """A task that keeps in its checkpoint, stored with ``Run.store_large``, a value
    holding references (its children's large results, say) keeps those artifacts too:
    the reference lists them, as a stand-in does."""
    store = InMemoryArtifacts(world.clock.now)
    kernel = kernel_for(world, store)
    inner = [offload(store, {"rows": text(f"r{n}")}, ABOVE) for n in range(2)]

    @kernel.registry.task("gatherer")
    class Gatherer:
        initial = "start"

        def start(self, run: Run) -> Transition:
            kept = run.store_large({"results": inner}, 100, "gatherer checkpoint")
            return run.sleep(60, then="wake", checkpoint={"kept": kept})

        def wake(self, run: Run) -> Transition:
            return run.succeed()

    handle = kernel.create_session()
    draft = Draft()
    draft.create_task("gatherer", {})
    handle.commit(draft)
    Scheduler(kernel, "w1", 30.0).run_until_idle()
    (task,) = world.storage.session_tasks(handle.id)
    assert len(store._objects) == 3
    world.clock.advance(GRACE + timedelta(seconds=1))
    store.sweep(world.storage.referenced_artifacts, world.clock.now())
    held = load(store, task.checkpoint["kept"])["results"]
    assert [load(store, r) for r in held] == [{"rows": text(f"r{n}")} for n in range(2)]
    assert task.checkpoint["kept"][HOLDS] == sorted(r[REFERENCE] for r in inner)


def test_the_sweep_keeps_what_an_ended_child_returned_while_its_parent_has_not_ended(
    world: World,
) -> None:
    """A child that ended with a large value stored with ``Run.store_large`` in its
    outcome, long before its parent's join of it and a slower sibling wakes the parent:
    the parent reads it back (``Run.outcomes``). Once the parent ended, a sweep removes
    it."""
    store = InMemoryArtifacts(world.clock.now)
    kernel = kernel_for(world, store)
    registry = kernel.registry
    nap = (GRACE * 2).total_seconds()
    value = {"rows": text("o")}

    @registry.task("parent")
    class Parent:
        initial = "start"

        def start(self, run: Run) -> Transition:
            children = [run.spawn("child", {"nap": 0}), run.spawn("child", {"nap": nap})]
            return run.wait_all(children, then="gather")

        def gather(self, run: Run) -> Transition:
            results = [o["result"] for o in run.outcomes().values()]
            return run.succeed([r and load(store, r) == value for r in results])

    @registry.task("child")
    class Child:
        initial = "start"

        def start(self, run: Run) -> Transition:
            if run.input["nap"]:
                return run.sleep(run.input["nap"], then="done")
            return run.succeed(run.store_large(value, ABOVE, "child result"))

        def done(self, run: Run) -> Transition:
            return run.succeed()

    handle = kernel.create_session()
    draft = Draft()
    parent = draft.create_task("parent", {})
    handle.commit(draft)
    scheduler = Scheduler(kernel, "w1", 30.0)
    scheduler.run_until_idle()
    world.clock.advance(GRACE + timedelta(seconds=1))
    store.sweep(world.storage.referenced_artifacts, world.clock.now())
    world.clock.advance(nap)
    scheduler.run_until_idle()
    assert world.storage.task(parent).outcome == {"kind": "succeeded", "result": [True, None]}
    assert store.sweep(world.storage.referenced_artifacts, world.clock.now()) == 1
