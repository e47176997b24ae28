"""The crash property of tests/unit/test_crash_property.py, on the Postgres storage.

Fewer examples than on the reference storage (each one is a few hundred real
transactions), same trees, same crash points, same assertions.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.storage import PostgresStorage
from tests.unit.crash_trees import compare_runs, trees


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(trees(), st.sets(st.integers(min_value=1, max_value=40), min_size=1, max_size=3))
def test_crashes_change_nothing_that_was_committed_on_postgres(
    tree: dict[str, Any], crash_at: set[int]
) -> None:
    compare_runs(tree, crash_at, lambda fault: PostgresStorage(fault=fault))
