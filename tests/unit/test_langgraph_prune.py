"""Pruning a thread never breaks the restore of a checkpoint it keeps.

A graph with a LangGraph ``DeltaChannel`` (which stores no value between snapshots and is
rebuilt from its ancestors' writes) runs for some steps; random prunes by policy follow;
after each, every checkpoint still listed restores to exactly the state it had before
any prune (compared as the serializer's bytes)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, TypedDict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langgraph.channels.delta import DeltaChannel
from langgraph.graph import END, START, StateGraph

from kernel import InMemoryStorage, Kernel, Registry
from kernel.documents import encoded_size
from kernel.hosts.langgraph import KeepLatest, KeepSince, SessionStoreSaver
from kernel.hosts.langgraph.layout import INDEX, INDEX_KEY


def extend(state: list[int], writes: list[list[int]]) -> list[int]:
    return [*state, *(n for batch in writes for n in batch)]


class Counting(TypedDict):
    log: Annotated[list[int], DeltaChannel(extend, snapshot_frequency=3)]
    last: int


def counting_graph(saver: SessionStoreSaver) -> Any:
    def step(state: Counting) -> dict[str, Any]:
        n = state.get("last", 0) + 1
        return {"log": [n], "last": n}

    def again(state: Counting) -> str:
        return "step" if state["last"] < 7 else END

    builder = StateGraph(Counting)
    builder.add_node("step", step)
    builder.add_edge(START, "step")
    builder.add_conditional_edges("step", again)
    return builder.compile(checkpointer=saver)


def states(graph: Any, saver: SessionStoreSaver, thread: str) -> dict[str, bytes]:
    """Every listed checkpoint of ``thread``, restored by LangGraph, as serialized bytes."""
    found = {}
    for listed in saver.list({"configurable": {"thread_id": thread, "checkpoint_ns": ""}}):
        state = graph.get_state(listed.config)
        found[listed.config["configurable"]["checkpoint_id"]] = saver.serde.dumps_typed(
            (state.values, state.next))[1]
    return found


policies = st.one_of(
    st.integers(min_value=0, max_value=6).map(KeepLatest),
    st.integers(min_value=-2, max_value=2).map(
        lambda minutes: KeepSince(datetime.now(UTC) + timedelta(minutes=minutes))),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prunes=st.lists(policies, min_size=1, max_size=4))
def test_every_kept_checkpoint_restores_byte_for_byte_after_random_prunes(
    prunes: list[Any],
) -> None:
    saver = SessionStoreSaver(Kernel(InMemoryStorage(), Registry()))
    try:
        graph = counting_graph(saver)
        graph.invoke({"log": [], "last": 0}, {"configurable": {"thread_id": "t"}})
        before = states(graph, saver, "t")
        assert len(before) == 9 and graph.get_state(
            {"configurable": {"thread_id": "t"}}).values["log"] == list(range(1, 8))
        for policy in prunes:
            saver.prune_by(["t"], policy)
            after = states(graph, saver, "t")
            if policy == KeepLatest(0):  # LangGraph's "delete": nothing stays
                assert after == {}
                break
            assert max(before) in after, "every policy keeps the newest checkpoint"
            assert set(after) <= set(before)
            assert after == {cid: before[cid] for cid in after}
    finally:
        saver.close()


def stored(storage: InMemoryStorage, session_id: str) -> tuple[int, int, int, int]:
    """What a session holds in storage: (commit rows, document heads, document version
    rows, bytes of those versions as stored)."""
    heads = [h for h in storage._heads.values() if h.session_id == session_id]
    versions = [v for h in heads for v in storage._versions.get(h.id, [])]
    size = sum(encoded_size([v.ops, v.baseline]) for v in versions)
    return len(storage._commits.get(session_id, [])), len(heads), len(versions), size


def test_a_10000_checkpoint_thread_stays_bounded_by_the_policy_and_resumable() -> None:
    """A thread pruned by keep-latest-10 every 500 checkpoints: after each prune its
    storage (commit rows, documents, versions, bytes) is what the kept checkpoints and
    the thread's few documents hold, the same at 10,000 checkpoints as at 1,000; its
    newest checkpoint and the kept history read back and the thread goes on from it."""
    from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_metadata

    storage = InMemoryStorage()
    kernel = Kernel(storage, Registry())
    saver = SessionStoreSaver(kernel)
    try:
        config: dict[str, Any] = {"configurable": {"thread_id": "long", "checkpoint_ns": ""}}
        listed, sizes = [], []
        for n in range(10_000):
            checkpoint = generate_checkpoint(channel_values={"n": n}, channel_versions={"n": n})
            config = saver.put(config, checkpoint, generate_metadata(step=n), {"n": n})
            saver.put_writes(config, [("n", n + 1)], f"task-{n}")
            if n % 500 == 499:
                saver.prune_by(["long"], KeepLatest(10))
                index = kernel.document("long", INDEX, INDEX_KEY)
                listed.append(len(index["namespaces"][""]))
                sizes.append(stored(storage, "long"))
        assert listed == [10] * 20
        commits, heads, versions, size = zip(*sizes, strict=True)
        assert set(commits) == {0}, "no commit row up to the prune stays (none has a key)"
        assert set(heads) == {11}, "the 10 kept checkpoints and the index"
        # The index's versions since its newest baseline come and go with its baseline
        # cadence (a few dozen rows). The first prunes keep a baseline written while the
        # index still listed the 500 checkpoints before them; from the third on, each
        # leaves a baseline of the index as the policy keeps it.
        assert max(versions) <= 200 and max(size) <= 200_000
        assert max(versions[2:]) <= 80 and max(size[2:]) <= 60_000
        assert storage.session("long").head_seq == 20_020  # put, writes, each prune
        assert storage.session("long").pruned_seq == 20_020

        newest = saver.get_tuple({"configurable": {"thread_id": "long"}})
        assert newest is not None and newest.checkpoint["channel_values"] == {"n": 9999}
        assert [w[2] for w in newest.pending_writes] == [10_000]
        kept = list(saver.list({"configurable": {"thread_id": "long"}}))
        assert [t.checkpoint["channel_values"]["n"] for t in kept] == list(range(9999, 9989, -1))
        assert all(t.parent_config is not None for t in kept)
        # It goes on from its newest checkpoint, and that reads back too.
        checkpoint = generate_checkpoint(channel_values={"n": 10_000})
        resumed = saver.put(newest.config, checkpoint, generate_metadata(step=10_000), {})
        after = saver.get_tuple(resumed)
        assert after is not None and after.parent_config == newest.config
    finally:
        saver.close()


class Said(TypedDict):
    said: Annotated[list[str], lambda old, new: [*old, *new]]


def calling_graph(saver: SessionStoreSaver) -> Any:
    """A graph whose node calls a subgraph, which asks before it answers."""
    from langgraph.types import interrupt

    inner = StateGraph(Said)
    inner.add_node("answer", lambda s: {"said": [f"answer to {interrupt('go on?')}"]})
    inner.add_edge(START, "answer")
    inner.add_edge("answer", END)
    builder = StateGraph(Said)
    builder.add_node("call", inner.compile())
    builder.add_edge(START, "call")
    builder.add_edge("call", END)
    return builder.compile(checkpointer=saver)


def test_a_subgraph_calls_namespace_goes_with_the_root_checkpoint_it_started_from() -> None:
    """Each call of a subgraph writes a namespace of its own: a prune keeps the one the
    thread's kept root checkpoints started (the interrupted call, which resumes), and
    drops those of calls started from root checkpoints it removes, as LangGraph's
    Postgres saver does, so a thread does not keep a piece of every call it made."""
    from langgraph.types import Command

    saver = SessionStoreSaver(Kernel(InMemoryStorage(), Registry()))
    graph = calling_graph(saver)
    config: Any = {"configurable": {"thread_id": "calls"}}
    for n in range(4):
        graph.invoke({"said": [f"question {n}"]}, config)
        graph.invoke(Command(resume=f"yes {n}"), config)
    graph.invoke({"said": ["question 4"]}, config)  # the call waits at its interrupt

    def namespaces() -> list[str]:
        found = saver.kernel.document("calls", INDEX, INDEX_KEY)["namespaces"]
        return sorted(ns for ns, checkpoints in found.items() if checkpoints)

    assert len(namespaces()) == 6  # the root and five calls
    saver.prune_by(["calls"], KeepLatest(1))
    (root, waiting) = namespaces()
    assert root == "" and waiting.startswith("call:")
    final = graph.invoke(Command(resume="yes 4"), config)
    assert final["said"][-2:] == ["question 4", "answer to yes 4"]
    saver.prune_by(["calls"], KeepLatest(1))
    assert namespaces() == [""]
    saver.close()
