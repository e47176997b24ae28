"""Artifacts on the reference store: a large tool result stored once, content-addressed,
its reference in the transcript and an excerpt for the model; a corrupt one refused; a
writer that dies mid-write never leaves a reference to half a file; the sweep removes
only old unreferenced objects."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernel import InMemoryStorage, Kernel, ManualClock, Registry, Scheduler
from kernel.agent import (
    Replay,
    ScriptedProvider,
    Tool,
    Toolbox,
    register_agent,
)
from kernel.artifacts import (
    GRACE,
    HOLDS,
    REFERENCE,
    CorruptArtifact,
    InMemoryArtifacts,
    MissingArtifact,
    digest_of,
    encoded,
    is_reference,
    load,
    offload,
    references,
    stand_in_shape,
)
from tests.unit.crashes import Crash, DiesMidWrite
from tests.unit.report_agent import REPORT, ask, reader, result_of, world


def test_a_large_result_is_stored_once_and_the_model_gets_its_reference_and_excerpt() -> None:
    clock = ManualClock()
    store = InMemoryArtifacts(clock.now)
    kernel, provider = world(store, clock)
    handle, conversation = ask(kernel)
    Scheduler(kernel, "w").run_until_idle()
    reference = result_of(kernel, conversation)
    assert is_reference(reference)
    assert reference[REFERENCE] == digest_of(store.get(reference[REFERENCE]))
    assert load(store, reference) == REPORT  # round trip, its hash checked on the way
    assert reference["bytes"] > 4_096 and len(reference["excerpt"]) == 1_000
    told = [m for m in provider.requests[-1].messages if m["role"] == "tool"][-1]
    assert told["content"]["result"]["excerpt"] == reference["excerpt"]
    assert told["content"]["result"][REFERENCE] == reference[REFERENCE]
    assert "rows" not in told["content"]["result"]  # the whole value is not sent
    # The same bytes from another session are the same artifact, stored once.
    other, again = ask(kernel, "again")
    Scheduler(kernel, "w").run_until_idle()
    assert result_of(kernel, again)[REFERENCE] == reference[REFERENCE]
    assert len(store._objects) == 1


def test_a_value_at_or_below_the_threshold_stays_in_the_record() -> None:
    clock = ManualClock()
    store = InMemoryArtifacts(clock.now)
    assert offload(store, {"ok": 1}, 4_096) == {"ok": 1}
    assert offload(store, REPORT, 10**9) == REPORT
    assert not store._objects


def test_a_corrupt_artifact_is_refused_with_a_clear_error() -> None:
    clock = ManualClock()
    store = InMemoryArtifacts(clock.now)
    digest = store.put(b'{"a":1}', "application/json")
    store.corrupt(digest, b'{"a":2}')
    with pytest.raises(CorruptArtifact) as refused:
        store.get(digest)
    found = digest_of(b'{"a":2}')
    assert str(refused.value) == f"artifact {digest} is corrupt: its 7 stored bytes hash to {found}"
    with pytest.raises(MissingArtifact, match="no artifact sha256:00"):
        store.get("sha256:" + "0" * 64)


def test_a_writer_that_dies_mid_write_leaves_no_reference_and_the_retry_stores_it_whole(
) -> None:
    clock = ManualClock()
    store = DiesMidWrite(clock.now)
    kernel, _ = world(store, clock)
    handle, conversation = ask(kernel)
    with pytest.raises(Crash):
        Scheduler(kernel, "w0").run_until_idle()
    [half] = list(store._objects)
    with pytest.raises(CorruptArtifact):
        store.get(half)
    # What the dead process left is referenced by nothing.
    assert all(half not in references(e.payload) for e in kernel.entries(conversation))
    Scheduler(kernel, "w1").run_until_idle(advance_clock=True)  # a new process: runs again
    reference = result_of(kernel, conversation)
    assert reference[REFERENCE] == half
    assert load(store, reference) == REPORT


def test_the_sweep_removes_only_old_unreferenced_artifacts() -> None:
    clock = ManualClock()
    store = InMemoryArtifacts(clock.now)
    kernel, _ = world(store, clock)
    handle, conversation = ask(kernel)
    Scheduler(kernel, "w").run_until_idle()
    kept = result_of(kernel, conversation)[REFERENCE]
    orphan = store.put(b"left by a dead writer", "text/plain")

    def referenced(digests: Any) -> set[str]:
        named = {d for e in kernel.entries(conversation) for d in references(e.payload)}
        return {d for d in digests if d in named}

    assert store.sweep(referenced, clock.now()) == 0  # too young: its reference may come
    clock.advance(GRACE + timedelta(seconds=1))
    assert store.sweep(referenced, clock.now()) == 1
    assert load(store, result_of(kernel, conversation)) == REPORT
    with pytest.raises(MissingArtifact):
        store.get(orphan)
    assert store.get(kept)


def test_a_value_storage_refuses_is_refused_naming_its_field_before_any_offload() -> None:
    """A tool that stores large results returning a value no storage holds (a datetime)
    is refused as every record's value is, naming the record and the field: not a
    TypeError from measuring it, and nothing stored."""
    from datetime import UTC, datetime

    from kernel import UnstorableValue

    clock = ManualClock()
    store = InMemoryArtifacts(clock.now)
    with pytest.raises(UnstorableValue, match=r"task t1 result cannot be stored: at \['at'\]"):
        offload(store, {"at": datetime(2026, 12, 3, tzinfo=UTC)}, 4_096, "task t1 result")
    with pytest.raises(UnstorableValue, match="NUL"):
        offload(store, {"text": "a\x00b" * 5_000}, 4_096, "task t1 result")
    assert not store._objects


def test_a_tool_whose_large_result_storage_refuses_ends_naming_the_result() -> None:
    from datetime import UTC, datetime

    clock = ManualClock()
    store = InMemoryArtifacts(clock.now)
    provider = ScriptedProvider(reader)
    toolbox = Toolbox()
    toolbox.add(Tool("report", "A large report", {"type": "object"}, Replay.SAFE,
                     run=lambda run, args: {"at": datetime(2026, 12, 3, tzinfo=UTC)},
                     artifact_above=4_096))
    registry = Registry()
    register_agent(registry, {"scripted": provider}, toolbox, "scripted")
    kernel = Kernel(InMemoryStorage(), registry, clock, artifacts=store)
    handle, conversation = ask(kernel)
    Scheduler(kernel, "w").run_until_idle()
    told = [e.payload for e in kernel.entries(conversation) if e.kind == "tool_result"]
    [payload] = told
    assert "tool 'report' result cannot be stored: at ['at'] a datetime" in payload["error"]
    assert "TypeError" not in payload["error"]
    assert not store._objects


# Values whose references sit anywhere, and text that looks like one: a key or a string
# holding the reference key's own text.
_digests = st.text("0123456789abcdef", min_size=1, max_size=4).map(lambda h: "sha256:" + h)
_referencing = st.recursive(
    st.one_of(st.none(), st.integers(), st.sampled_from(["artifact", '"artifact":', "x"]),
              st.text(max_size=6)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(st.text(max_size=4), st.sampled_from(
            ["artifact", 'a"artifact', HOLDS])), inner, max_size=4),
        st.builds(lambda d, held, v: {REFERENCE: d, HOLDS: held, "excerpt": v},
                  _digests, st.lists(_digests, max_size=2), inner),
    ),
    max_leaves=20,
)


@given(_referencing)
def test_a_stand_in_names_every_artifact_its_value_references(value: Any) -> None:
    """Whether the value's bytes are walked for references or not, the stand-in holds
    the same digests as a walk of it finds."""
    shape = stand_in_shape("sha256:" + "0" * 64, value, encoded(value), "a value")
    assert shape.get(HOLDS, []) == sorted(set(references(value)))
