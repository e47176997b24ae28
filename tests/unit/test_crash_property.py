"""Property: crashing the scheduler anywhere changes nothing that was committed.

Random task trees (fan-out, both join policies, sleeps, external signals,
operator cancels) run twice on the in-memory reference storage: once without
faults, once with the process "dying" at random points - inside a phase before
or after its external work, and inside storage before the write, after the
write, or after the commit. After each death everything in memory is dropped
and a new scheduler resumes from storage alone.

Both runs must end with the same outcomes, every committed effect applied
exactly once (the per-task logs are equal), and a gapless ``seq``.

Determinism of the trees: under a ``fail_fast`` join at most one child fails,
and it fails at once; its siblings first sleep >= 100 s or wait for a signal, so
they are still running when it fails, however the crashes reorder the work (a
crashed lease expires after 30 s, and at most three crashes are injected).
Signals and cancels are delivered only when the tree is otherwise idle.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.unit.crash_trees import compare_runs, drive, leaf, trees


@settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(trees(), st.sets(st.integers(min_value=1, max_value=40), min_size=1, max_size=3))
def test_crashes_change_nothing_that_was_committed(
    tree: dict[str, Any], crash_at: set[int]
) -> None:
    reference, crashed = compare_runs(tree, crash_at)
    event(f"crashes: {crashed.crashes}")
    event(f"tasks: {min(len(reference.outcomes), 9) // 3 * 3}+")


def test_the_property_sees_real_crashes() -> None:
    """Guard against a harness that never actually crashes anything."""
    tree = leaf("r", False, 5, "deliver")
    tree.update(children=[leaf("r.0", False, 0, None), leaf("r.1", True, 0, None)])
    reference = drive(tree, set())
    crashed = drive(tree, {2, 9, 15})
    assert crashed.crashes == 3
    assert crashed.outcomes == reference.outcomes == {"r": "failed", "r.0": "succeeded",
                                                      "r.1": "failed"}
    assert crashed.logs == reference.logs
