"""The long-histories benchmark, run small against the test database: its code must not
rot between runs of ``make bench BENCH_ARGS=history``. Checks shapes, never speed."""

from __future__ import annotations

import pytest

from benchmarks import history
from benchmarks._support import machine_state

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_workload_and_the_rebuilds_run_and_render(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(history, "MESSAGES", 2)
    monkeypatch.setattr(history, "CALLS_PER_MESSAGE", 2)
    monkeypatch.setattr(history, "WINDOW", 6_000)  # small enough to be compacted
    persisted = history.run_workload()
    assert persisted.model_calls == 2 * 3
    assert persisted.summaries >= 1 and persisted.summary_calls >= persisted.summaries
    assert persisted.grown["kernel_entry"] > 0 and persisted.logical["entry payloads"] > 0
    assert persisted.logical["values stored apart (artifacts)"] == 0  # all below it
    monkeypatch.setattr(history, "RECENT_TURNS", 5)
    rebuilds, whole, size = history.run_rebuilds(3, lengths=(30, 60))
    assert {turns: len(s) for turns, s in rebuilds.items()} == {30: 3, 60: 3}
    assert size == 1 + 5 * 3  # the summary, then the newest turns' three messages each
    pages = history.run_pages(2, lengths=(30, 60), tasks=20)
    assert {name: (page.count, cpu.count) for name, (page, cpu) in pages[0].items()} == {
        "a conversation of 30 turns": (2, 2), "a conversation of 60 turns": (2, 2),
        "20 tasks (`benchmarks.ui`'s page)": (2, 2)}
    assert pages[1].count == 3
    section = history.render(persisted, rebuilds, whole, size, ("1.0", "1.0"), pages)
    assert section.startswith(history.HEADING) and machine_state("1.0") in section
    assert "60 against 30 turns" in section and "| a conversation of 60 turns | 2 |" in section


def test_values_stored_apart_are_counted_in_the_bytes_persisted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Responses and tool outputs above the artifact threshold go to ``kernel_artifact``,
    which the bytes persisted count (an in-memory store would hide them)."""
    monkeypatch.setattr(history, "MESSAGES", 1)
    monkeypatch.setattr(history, "CALLS_PER_MESSAGE", 1)
    monkeypatch.setattr(history, "RESPONSE_TEXT", history.DEFAULT_THRESHOLD + 1_000)
    monkeypatch.setattr(history, "TOOL_OUTPUT", history.DEFAULT_THRESHOLD + 1_000)
    persisted = history.run_workload()
    apart = persisted.logical["values stored apart (artifacts)"]
    assert apart > 3 * history.DEFAULT_THRESHOLD  # two responses and a tool's result
    assert persisted.grown["kernel_artifact"] > 0
    assert persisted.logical["entry payloads"] < apart
