"""LangGraph's own conformance suite for checkpoint savers (langgraph-checkpoint-conformance),
run against the Session Store saver on both storages: every capability the suite knows
must be detected and pass."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES
from langgraph.checkpoint.conformance.report import ProgressCallbacks

from kernel import InMemoryStorage, Kernel, Registry, Storage
from kernel.hosts.langgraph import SessionStoreSaver


def every_test_of_the_suite() -> int:
    from langgraph.checkpoint.conformance.spec import (
        test_copy_thread,
        test_delete_for_runs,
        test_delete_thread,
        test_get_tuple,
        test_list,
        test_prune,
        test_put,
        test_put_writes,
    )

    lists = [
        test_put.ALL_PUT_TESTS, test_put_writes.ALL_PUT_WRITES_TESTS,
        test_get_tuple.ALL_GET_TUPLE_TESTS, test_list.ALL_LIST_TESTS,
        test_delete_thread.ALL_DELETE_THREAD_TESTS,
        test_delete_for_runs.ALL_DELETE_FOR_RUNS_TESTS,
        test_copy_thread.ALL_COPY_THREAD_TESTS, test_prune.ALL_PRUNE_TESTS,
    ]
    return sum(len(tests) for tests in lists)


def test_the_saver_passes_every_capability_of_langgraphs_conformance_suite(
    storage: Callable[[], Storage],
) -> None:
    savers: list[SessionStoreSaver] = []

    @checkpointer_test(name="SessionStoreSaver")
    async def session_store_saver() -> AsyncIterator[SessionStoreSaver]:
        saver = SessionStoreSaver(Kernel(storage(), Registry()))
        savers.append(saver)
        yield saver
        saver.close()

    failures: list[str] = []

    def on_result(capability: str, test: str, passed: bool, error: str | None) -> None:
        if not passed:
            failures.append(f"{capability}/{test}:\n{error}")

    report = asyncio.run(
        validate(session_store_saver, progress=ProgressCallbacks(on_test_result=on_result))
    )
    report.print_report()
    assert not failures, "\n".join(failures)
    assert {name for name, r in report.results.items() if r.detected} == {
        c.value for c in ALL_CAPABILITIES
    }
    assert report.conformance_level() == "FULL"
    assert sum(r.tests_passed for r in report.results.values()) == every_test_of_the_suite()
    assert len(savers) == len(ALL_CAPABILITIES)  # a fresh saver per capability, as the suite asks


def held(storage: Storage, session_id: str) -> tuple[int, int, int]:
    """What a session holds in storage: (commit rows, documents, document versions)."""
    if isinstance(storage, InMemoryStorage):
        heads = [h for h in storage._heads.values() if h.session_id == session_id]
        return (len(storage._commits.get(session_id, [])), len(heads),
                sum(len(storage._versions.get(h.id, [])) for h in heads))
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(
            "SELECT (SELECT count(*) FROM kernel_commit WHERE session_id = %(s)s), "
            "(SELECT count(*) FROM kernel_document WHERE session_id = %(s)s), "
            "(SELECT count(*) FROM kernel_document_version v JOIN kernel_document d "
            "ON d.id = v.document_id WHERE d.session_id = %(s)s)", {"s": session_id})
        return tuple(cur.fetchone())


def test_a_thread_pruned_as_it_grows_holds_rows_bounded_by_the_policy(
    storage: Callable[[], Storage],
) -> None:
    """The same rows after every prune, at 100 checkpoints as at 600, on both storages;
    the newest checkpoint reads back with its writes (the 10,000-checkpoint run:
    tests/unit/test_langgraph_prune.py)."""
    from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_metadata

    from kernel.hosts.langgraph import KeepLatest

    store = storage()
    saver = SessionStoreSaver(Kernel(store, Registry()))
    try:
        config: dict = {"configurable": {"thread_id": "grows", "checkpoint_ns": ""}}
        after = []
        for n in range(600):
            checkpoint = generate_checkpoint(channel_values={"n": n}, channel_versions={"n": n})
            config = saver.put(config, checkpoint, generate_metadata(step=n), {"n": n})
            saver.put_writes(config, [("n", n + 1)], f"task-{n}")
            if n % 100 == 99:
                saver.prune_by(["grows"], KeepLatest(5))
                after.append(held(store, "grows"))
        commits, documents, versions = zip(*after, strict=True)
        assert set(commits) == {0} and set(documents) == {6}  # the 5 kept, the index
        # The index writes a baseline once the ops since its last one outweigh 4 kB: a
        # few dozen of its versions come and go; the kept checkpoints have one or two.
        assert max(versions) <= 100, after
        newest = saver.get_tuple({"configurable": {"thread_id": "grows"}})
        assert newest is not None and newest.checkpoint["channel_values"] == {"n": 599}
        assert [w[2] for w in newest.pending_writes] == [600]
        assert len(list(saver.list({"configurable": {"thread_id": "grows"}}))) == 5
    finally:
        saver.close()


def test_a_tasks_writes_saved_again_keep_the_first_regular_write_as_langgraphs_savers_do(
    storage: Callable[[], Storage],
) -> None:
    """A task's writes saved twice (its step retried after some were saved): a regular
    channel's write keeps the first value, a special one (an error, an interrupt) the
    last, as InMemorySaver keeps them; the same sequences through both savers read back
    the same pending writes."""
    from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_metadata
    from langgraph.checkpoint.memory import InMemorySaver

    sequences: list[list[tuple[str, list[tuple[str, Any]]]]] = [
        [("t", [("a", 1)]), ("t", [("a", 2), ("b", 3)])],
        [("t", [("__error__", "first")]), ("t", [("__error__", "second")])],
        [("t", [("a", 1), ("__interrupt__", "one")]), ("t", [("a", 9), ("__interrupt__", "two")])],
        [("t", [("a", 1)]), ("u", [("a", 2)]), ("t", [("b", 3), ("a", 4)])],
    ]
    ours = SessionStoreSaver(Kernel(storage(), Registry()))
    theirs = InMemorySaver()
    try:
        for n, sequence in enumerate(sequences):
            read = []
            for saver in (ours, theirs):
                config: dict = {"configurable": {"thread_id": f"again-{n}", "checkpoint_ns": ""}}
                config = saver.put(config, generate_checkpoint(), generate_metadata(step=0), {})
                for task_id, writes in sequence:
                    saver.put_writes(config, writes, task_id)
                got = saver.get_tuple(config)
                assert got is not None
                read.append(sorted(got.pending_writes or []))
            assert read[0] == read[1], sequence
    finally:
        ours.close()
