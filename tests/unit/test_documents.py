"""Document ops are total and baselines are written only when ops outweigh them."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernel import CommitRejected
from kernel.artifacts import IN_PLACE_OF, is_stand_in
from kernel.documents import apply_ops, check_op, copied, encoded_size, needs_baseline, weight

keys = st.sampled_from(["a", "b", "c"])
paths = st.lists(keys, min_size=1, max_size=3)
# Text a storage can hold: NUL and lone surrogates are refused by check_op (below).
storable_text = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"),
                        max_size=5)
values = st.one_of(st.integers(), storable_text, st.none())
ops = st.one_of(
    st.builds(lambda p, v: {"op": "set", "path": p, "value": v}, paths, values),
    st.builds(lambda p: {"op": "remove", "path": p}, paths),
    st.builds(lambda p, v: {"op": "append", "path": p, "value": v}, paths, values),
    st.builds(lambda p, n: {"op": "incr", "path": p, "value": n}, paths, st.integers(-5, 5)),
    st.builds(lambda p, v: {"op": "setdefault", "path": p, "value": v}, paths, values),
)


@given(st.lists(ops, max_size=20))
def test_ops_apply_to_any_value_without_touching_it(sequence: list[dict]) -> None:
    start = {"a": {"b": 1}, "c": [1]}
    result = apply_ops(start, sequence)
    assert start == {"a": {"b": 1}, "c": [1]}
    assert isinstance(result, dict)
    for op in sequence:
        check_op(op)


@pytest.mark.parametrize("text", ["a\x00b", "\ud800"])
def test_an_op_holding_text_no_storage_can_hold_is_refused(text: str) -> None:
    with pytest.raises(CommitRejected, match="document op"):
        check_op({"op": "set", "path": ["a"], "value": text})


@given(st.lists(ops, max_size=20), st.integers(min_value=0, max_value=20))
def test_applying_in_two_steps_equals_applying_at_once(sequence: list[dict], cut: int) -> None:
    assert apply_ops(apply_ops({}, sequence[:cut]), sequence[cut:]) == apply_ops({}, sequence)


def test_op_semantics() -> None:
    value = apply_ops(
        {},
        [
            {"op": "set", "path": ["r", "x@example.com"], "value": {"state": "pending"}},
            {"op": "append", "path": ["log"], "value": 1},
            {"op": "append", "path": ["log"], "value": 2},
            {"op": "remove", "path": ["missing", "deep"]},
            {"op": "set", "path": ["r", "x@example.com", "state"], "value": "sent"},
            {"op": "incr", "path": ["tokens", "in"], "value": 5},
            {"op": "incr", "path": ["tokens", "in"], "value": 7},
            {"op": "setdefault", "path": ["first"], "value": "one"},
            {"op": "setdefault", "path": ["first"], "value": "two"},
            {"op": "setdefault", "path": ["nil"], "value": None},
            {"op": "setdefault", "path": ["nil"], "value": 3},
        ],
    )
    assert value == {
        "r": {"x@example.com": {"state": "sent"}},
        "log": [1, 2],
        "missing": {},
        "tokens": {"in": 12},
        "first": "one",
        "nil": None,
    }
    assert apply_ops({"a": 1}, [{"op": "set", "path": [], "value": {"b": 2}}]) == {"b": 2}


@pytest.mark.parametrize(
    "op",
    [
        {"op": "frobnicate", "path": ["a"]},
        {"op": "set", "path": "a", "value": 1},
        {"op": "set", "path": [1], "value": 1},
        {"op": "set", "path": ["a"]},
        {"op": "remove", "path": []},
        {"op": "set", "path": ["a"], "value": {1, 2}},
        {"op": "incr", "path": ["a"], "value": "1"},
        {"op": "incr", "path": ["a"], "value": True},
        {"op": "setdefault", "path": ["a"]},
        {"op": "setdefault", "path": [], "value": 1},
    ],
)
def test_malformed_ops_are_rejected(op: dict) -> None:
    with pytest.raises(CommitRejected):
        check_op(op)


def test_a_baseline_is_due_once_ops_outweigh_the_last_one() -> None:
    assert not needs_baseline(100, 300_000)
    assert not needs_baseline(300_000, 300_000)
    assert needs_baseline(300_001, 300_000)
    assert needs_baseline(5000, 10)  # small documents still batch a few KB of ops


# JSON as storable returns it: any text (non-ASCII too), numbers, nesting; and stand-ins
# (the mark of a value stored apart), whose size weight() adds.
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False,
              allow_infinity=False), st.text(max_size=8), st.just(IN_PLACE_OF)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(st.text(max_size=5), st.just(IN_PLACE_OF)), inner,
                        max_size=4),
        st.builds(lambda n, v: {"artifact": "sha256:" + "0" * 64, "bytes": n,
                                IN_PLACE_OF: "document d/k", "excerpt": v},
                  st.integers(0, 10**6), inner),
    ),
    max_leaves=30,
)


def containers(value: Any) -> list[int]:
    found = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict | list):
            found.append(id(item))
            stack.extend(item.values() if isinstance(item, dict) else item)
    return found


@given(json_values)
def test_an_ops_value_is_copied_as_deepcopy_copies_it(value: Any) -> None:
    copy_ = copied(value)
    assert copy_ == copy.deepcopy(value)
    assert json.dumps(copy_) == json.dumps(value)  # the same types and key order
    assert not set(containers(copy_)) & set(containers(value))


@given(json_values)
def test_sizes_are_those_of_the_sorted_compact_json(value: Any) -> None:
    """What the sizes were defined as: sorted keys change no length, and a value with
    no stand-in's mark in its JSON weighs its length."""
    stored = len(json.dumps(value, separators=(",", ":"), sort_keys=True).encode())
    assert encoded_size(value) == stored
    stand_ins, stack = 0, [value]
    while stack:
        item = stack.pop()
        if is_stand_in(item):
            stand_ins += int(item.get("bytes") or 0)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    assert weight(value) == stored + stand_ins


def test_an_owned_value_takes_the_ops_in_place_and_others_are_left_untouched() -> None:
    mine = {"a": {"b": 1}}
    assert apply_ops(mine, [{"op": "set", "path": ["a", "c"], "value": 2}], owned=True) is mine
    assert mine == {"a": {"b": 1, "c": 2}}


def test_a_baseline_rebuilt_after_a_migration_leaves_what_the_migration_returned_alone() -> None:
    """The builder applies a commit's ops in place to the value it replayed (its own
    copy), but not to what a migration returned, which may be the application's own
    object (here, one shared default)."""
    from kernel import Draft, Kernel, ManualClock, Registry
    from kernel.memory import InMemoryStorage

    default = {"settings": {"mode": "on"}}
    storage = InMemoryStorage()
    first = Registry()
    first.document("prefs")
    kernel = Kernel(storage, first, ManualClock())
    handle = kernel.create_session()
    draft = Draft(actor="user:x")
    draft.set("prefs", "p", ["old"], 1)
    handle.commit(draft)

    second = Registry()
    second.document("prefs", version=2, migrate=lambda _, value: default)
    upgraded = Kernel(storage, second, ManualClock())
    draft = Draft(actor="user:x")
    draft.set("prefs", "p", ["settings", "mode"], "off")
    upgraded.open(handle.id).commit(draft)
    assert default == {"settings": {"mode": "on"}}
    assert upgraded.document(handle.id, "prefs", "p") == {"settings": {"mode": "off"}}
