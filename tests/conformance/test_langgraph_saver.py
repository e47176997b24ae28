"""LangGraph's own conformance suite for checkpoint savers (langgraph-checkpoint-conformance),
run against the Session Store saver on both storages: every capability the suite knows
must be detected and pass."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES
from langgraph.checkpoint.conformance.report import ProgressCallbacks

from kernel import InMemoryStorage, Kernel, Registry, Storage
from kernel.hosts.langgraph import SessionStoreSaver


@pytest.fixture(
    params=["memory", pytest.param("postgres", marks=pytest.mark.django_db(transaction=True))]
)
def storage(request: pytest.FixtureRequest) -> Iterator[Callable[[], Storage]]:
    if request.param == "memory":
        memory = InMemoryStorage()
        yield lambda: memory
        return
    from django.db import connection

    from controlplane.storage import PostgresStorage

    yield PostgresStorage
    connection.close()


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
