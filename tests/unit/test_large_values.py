"""Values stored apart before a commit (:mod:`kernel.large_values`), on the reference
storage: what goes apart and what stays in the record, the caller's draft left as it
was, a baseline built through a value stored apart, and the refusals."""

from __future__ import annotations

import pytest

from kernel import Draft, InMemoryStorage, Kernel, ManualClock, Registry
from kernel.artifacts import IN_PLACE_OF, InMemoryArtifacts, MissingArtifact, encoded, is_stand_in
from kernel.documents import apply_ops, weight
from kernel.large_values import prepare

ABOVE = 4_096


def text(tag: str, words: int = 1_000) -> str:
    return " ".join(f"{tag}{n}" for n in range(words))


def world(above: int | None = ABOVE) -> tuple[Kernel, InMemoryArtifacts]:
    clock = ManualClock()
    store = InMemoryArtifacts(clock.now)
    registry = Registry()
    registry.document("plan")
    return Kernel(InMemoryStorage(), registry, clock, artifacts=store,
                  artifact_above=above), store


def test_the_callers_draft_is_left_as_it_was_and_nothing_small_is_stored() -> None:
    kernel, store = world()
    draft = Draft()
    draft.append("conv_x", "note", {"text": text("a")})
    draft.set("plan", "p", ["big"], text("b"))
    draft.set("plan", "p", ["small"], 1)
    prepared = prepare(draft, store, ABOVE)
    assert draft.entries[0][3] == {"text": text("a")}
    assert draft.document_ops[("plan", "p")][0]["value"] == text("b")
    assert is_stand_in(prepared.entries[0][3]["text"])
    assert is_stand_in(prepared.document_ops[("plan", "p")][0]["value"])
    assert prepared.document_ops[("plan", "p")][1] is draft.document_ops[("plan", "p")][1]
    assert len(store._objects) == 2
    small = Draft()
    small.append("conv_x", "note", {"text": "hi"})
    assert prepare(small, store, ABOVE) is small
    assert prepare(draft, store, None) is draft
    assert len(store._objects) == 2


def test_a_payload_whose_fields_are_all_small_goes_apart_whole() -> None:
    kernel, store = world()
    payload = {f"k{n}": "x" * 500 for n in range(20)}  # 10 KB in fields of 500 bytes
    draft = Draft()
    draft.append("conv_x", "note", payload)
    kept = prepare(draft, store, ABOVE).entries[0][3]
    assert is_stand_in(kept) and kept[IN_PLACE_OF].endswith("(note) payload")
    assert len(store._objects) == 1  # no field's artifact left behind by the plan


def test_no_threshold_keeps_every_value_in_its_record() -> None:
    kernel, store = world(above=None)
    handle = kernel.create_session()
    draft = Draft()
    conversation = draft.create_conversation()
    draft.append(conversation, "note", {"text": text("a")})
    handle.commit(draft)
    assert kernel.storage.conversation_entries(conversation)[0].payload == {"text": text("a")}
    assert not store._objects


def test_a_baseline_built_through_a_value_stored_apart_reads_it_whole() -> None:
    kernel, store = world()
    handle = kernel.create_session()
    big = {f"k{n}": text(f"v{n}-", 40) for n in range(30)}
    draft = Draft()
    draft.set("plan", "p", ["big"], big)
    handle.commit(draft)
    expected = {"big": dict(big)}
    head = kernel.storage.document_head(handle.id, "plan", "p")
    assert head.baseline_bytes == weight({"big": prepare(
        draft, store, ABOVE).document_ops[("plan", "p")][0]["value"]})
    # Ops that reach inside it, until they outweigh it and a baseline is due: the
    # builder reads the value stored apart to build it.
    number = 0
    while kernel.storage.document_head(handle.id, "plan", "p").baseline_version == 1:
        draft = Draft()
        draft.set("plan", "p", ["big", f"k{number % 30}"], f"changed {number} " * 20)
        expected["big"][f"k{number % 30}"] = f"changed {number} " * 20
        handle.commit(draft)
        number += 1
    assert number > 10
    assert kernel.document(handle.id, "plan", "p") == expected
    head = kernel.storage.document_head(handle.id, "plan", "p")
    [newest] = kernel.storage.document_versions(head.id, head.baseline_version)[:1]
    assert newest.baseline == expected  # a baseline built so holds that part whole
    assert len(encoded(expected)) > ABOVE


def test_an_op_reaching_inside_a_value_stored_apart_needs_the_store() -> None:
    kernel, store = world()
    draft = Draft()
    draft.set("plan", "p", ["big"], {"rows": text("r")})
    [op] = prepare(draft, store, ABOVE).document_ops[("plan", "p")]
    value = apply_ops({}, [op])
    assert is_stand_in(value["big"])  # placed as it is, not read
    with pytest.raises(MissingArtifact, match="reaches inside document plan/p set value at "
                                              "big, stored apart as artifact sha256:"):
        apply_ops(value, [{"op": "set", "path": ["big", "seen"], "value": 1}])
