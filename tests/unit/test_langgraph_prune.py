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
from kernel.hosts.langgraph import KeepLatest, KeepSince, SessionStoreSaver
from kernel.hosts.langgraph.layout import CHECKPOINT, INDEX, INDEX_KEY


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


def test_a_10000_checkpoint_thread_keeps_a_current_state_bounded_by_the_policy() -> None:
    """What the thread holds now (its listed checkpoints and the checkpoint documents not
    emptied) stays within the policy. The rows of its history (each emptied document's
    versions) stay until the session's retention removes them."""
    from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_metadata

    storage = InMemoryStorage()
    kernel = Kernel(storage, Registry())
    saver = SessionStoreSaver(kernel)
    try:
        config: dict[str, Any] = {"configurable": {"thread_id": "long", "checkpoint_ns": ""}}
        listed = []
        for n in range(10_000):
            checkpoint = generate_checkpoint(channel_values={"n": n}, channel_versions={"n": n})
            config = saver.put(config, checkpoint, generate_metadata(step=n), {"n": n})
            if n % 500 == 499:
                saver.prune_by(["long"], KeepLatest(10))
                index = kernel.document("long", INDEX, INDEX_KEY)
                listed.append(len(index["namespaces"][""]))
        assert listed == [10] * 20
        kept = [key for (session, kind, key) in storage._heads
                if session == "long" and kind == CHECKPOINT
                and kernel.document("long", CHECKPOINT, key)]
        assert len(kept) == 10
        newest = saver.get_tuple({"configurable": {"thread_id": "long"}})
        assert newest is not None and newest.checkpoint["channel_values"] == {"n": 9999}
    finally:
        saver.close()
