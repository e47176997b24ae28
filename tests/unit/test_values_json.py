"""kernel.values.dumps: the text and the errors of json.dumps with the same options."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernel.values import dumps

OPTIONS = [
    {},
    {"separators": (",", ":")},
    {"ensure_ascii": False, "separators": (",", ":")},
    {"ensure_ascii": False, "allow_nan": False},
]
keys = st.one_of(st.text(max_size=6), st.integers(), st.booleans(), st.none(),
                 st.floats(allow_nan=False))
values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.tuples(inner, inner),
                            st.dictionaries(keys, inner, max_size=4)),
    max_leaves=30,
)


def outcome(encode: Any, value: Any) -> tuple[str, str]:
    try:
        return "text", encode(value)
    except (TypeError, ValueError) as exc:
        return type(exc).__name__, str(exc)


@pytest.mark.parametrize("options", OPTIONS)
@given(values)
def test_the_same_text_or_error_as_json_dumps(options: dict[str, Any], value: Any) -> None:
    assert outcome(dumps(**options), value) == outcome(
        lambda v: json.dumps(v, **options), value)


@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("value", [
    "top-level text \u00e9\ud800", 1.5, float("nan"), float("inf"), 10**30, {1, 2},
    {"when": object()}, {(1, 2): 3}, {"a": b"bytes"},
])
def test_the_same_for_what_json_refuses_or_escapes(options: dict[str, Any], value: Any) -> None:
    assert outcome(dumps(**options), value) == outcome(
        lambda v: json.dumps(v, **options), value)


def test_a_circular_value_is_refused_as_json_dumps_refuses_it() -> None:
    value: list[Any] = []
    value.append(value)
    with pytest.raises(ValueError, match="Circular reference"):
        dumps()(value)
    assert dumps()([1]) == "[1]"  # and the next call starts afresh
