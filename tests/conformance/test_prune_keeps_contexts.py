"""Retention keeps what recovery needs, checked at random on both storages:
sessions with summaries, forks (after a summary, before it, with summaries of their
own), large results stored as artifacts, large entry payloads and document values the
kernel stores apart, and live tasks are pruned by a random policy at a random time; then
after a sweep that keeps what the storage says its records reference, every kept
conversation's context and document is what it was, every reference a kept entry holds
reads back (hash checked), a session with a live task is never pruned, and a pruned one
reads as empty, never as half a history."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from kernel import Draft, Kernel, ManualClock
from kernel.artifacts import GRACE, InMemoryArtifacts, load, offload, references
from kernel.records import SUMMARY, Entry
from kernel.retention import RetentionPolicy

from .definitions import Effects, make_registry
from .world import World

APART = 2_048
"""The kernel's threshold here: what passes it is stored apart (kernel.large_values)."""

session_plan = st.fixed_dictionaries({
    "entries": st.integers(min_value=1, max_value=8),
    "summaries": st.lists(st.integers(min_value=0, max_value=7), max_size=3),
    "fork_at": st.none() | st.integers(min_value=0, max_value=7),
    "fork_summary": st.booleans(),
    "large": st.lists(st.integers(min_value=0, max_value=7), max_size=2),
    "apart": st.lists(st.integers(min_value=0, max_value=7), max_size=2),
    "document": st.booleans(),
    "live": st.booleans(),
    "age_days": st.floats(min_value=0, max_value=10),
})


def ref(entry: Entry) -> dict[str, Any]:
    return {"id": entry.id, "seq": entry.seq, "ordinal": entry.ordinal}


def summarize(handle: Any, conversation: str, first: Entry, last: Entry) -> None:
    draft = Draft()
    draft.append(conversation, SUMMARY, {"text": f"up to {last.id}",
                                         "covers": {"first": ref(first), "last": ref(last)}})
    handle.commit(draft)


def build(kernel: Kernel, clock: ManualClock, plan: dict[str, Any], index: int) -> list[str]:
    """A session as ``plan`` says; its conversations."""
    store = kernel.artifacts
    assert store is not None
    handle = kernel.create_session()
    draft = Draft()
    conversation = draft.create_conversation()
    handle.commit(draft)
    entries: list[Entry] = []
    for number in range(plan["entries"]):
        draft = Draft()
        value: Any = {"text": f"s{index} e{number}"}
        if number in plan["large"]:
            value["result"] = offload(store, {"rows": [f"{index}-{number}-{n}" for n in
                                                       range(300)]}, 1_024)
        if number in plan["apart"]:  # above the kernel's threshold: stored apart
            value["long"] = " ".join(f"{index}-{number}-{n}" for n in range(500))
        draft.append(conversation, "user", value)
        entries += handle.commit(draft).entries
        if number in plan["summaries"]:
            summarize(handle, conversation, entries[0], entries[-1])
    conversations = [conversation]
    if plan["fork_at"] is not None and plan["fork_at"] < len(entries):
        draft = Draft()
        fork = draft.create_conversation(fork_of=conversation,
                                         fork_entry_id=entries[plan["fork_at"]].id)
        draft.append(fork, "user", {"text": f"s{index} fork"})
        own = handle.commit(draft).entries
        if plan["fork_summary"]:
            summarize(handle, fork, entries[0], own[0])
        conversations.append(fork)
    if plan["document"]:
        draft = Draft()
        draft.set("plan", "p", ["rows"], [f"{index}-{n}" for n in range(500)])
        handle.commit(draft)
    if plan["live"]:
        draft = Draft()
        draft.create_task("step", {"name": f"live-{index}"})
        handle.commit(draft)
    return conversations


# Examples share the world's storage: each checks only the sessions it built (an earlier
# example's sessions may be pruned by a later one's prune, as any other session).
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plans=st.lists(session_plan, min_size=1, max_size=4),
       days=st.floats(min_value=0, max_value=5), later=st.floats(min_value=0, max_value=10))
def test_pruning_at_random_keeps_every_kept_context_and_reference(
    world: World, plans: list[dict[str, Any]], days: float, later: float
) -> None:
    clock = ManualClock()
    kernel = Kernel(world.storage, make_registry(Effects()), clock,
                    artifacts=InMemoryArtifacts(clock.now), artifact_above=APART)
    store = kernel.artifacts
    assert store is not None
    built: dict[str, list[str]] = {}
    for index, plan in enumerate(sorted(plans, key=lambda p: -p["age_days"])):
        conversations = build(kernel, clock, plan, index)
        session_id = kernel.storage.conversation(conversations[0]).session_id
        built[session_id] = conversations
        clock.advance(timedelta(days=plan["age_days"]))
    before = {c: kernel.context(c) for cs in built.values() for c in cs}
    documents = {s: kernel.document(s, "plan", "p") for s in built}
    clock.advance(timedelta(days=later))
    report = kernel.storage.prune(RetentionPolicy(days=days), clock.now())
    event("some sessions pruned" if report.sessions else "nothing pruned")

    kept_references: set[str] = set()
    for session_id, conversations in built.items():
        session = kernel.storage.session(session_id)
        live = any(not t.terminal for t in kernel.storage.session_tasks(session_id))
        pruned = session.pruned_seq > 0
        assert not (live and pruned), "a session with a live task was pruned"
        for conversation in conversations:
            context = kernel.context(conversation)
            if pruned:
                assert context == [] and kernel.entries(conversation) == []
            else:
                assert context == before[conversation]
                for entry in kernel.entries(conversation):
                    kept_references.update(references(entry.payload))

    clock.advance(GRACE * 2)
    store.sweep(kernel.storage.referenced_artifacts, clock.now())
    for digest in kept_references:
        assert load(store, {"artifact": digest})  # present, its hash checked
    for session_id, conversations in built.items():
        if kernel.storage.session(session_id).pruned_seq == 0:  # read whole, hash checked
            assert [kernel.context(c) for c in conversations] == [
                before[c] for c in conversations]
            assert kernel.document(session_id, "plan", "p") == documents[session_id]
