"""What a storage can hold: JSON values and text without NUL, in UTF-8.

Every value a draft writes passes through here when it enters the draft, so that both
storages refuse the same values with the same error, before anything is sent: Postgres
cannot store ``\\u0000`` in ``jsonb`` or ``text``, a lone surrogate (no UTF-8 holds it),
nor a value JSON does not encode (a ``datetime``, ``NaN``, a set), and the in-memory
reference would otherwise keep them.
A value that passes is returned as storage will give it back (tuples as lists, keys
as strings), so a reader sees the same thing on either storage.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from json.encoder import encode_basestring, encode_basestring_ascii
from typing import Any

from .errors import UnstorableValue

# The C encoder json.dumps uses (None on an interpreter without it: json.dumps then).
_c_make_encoder: Any = getattr(json.encoder, "c_make_encoder", None)
JSON = Any
_DEFAULT = json.JSONEncoder().default


def dumps(
    *, ensure_ascii: bool = True, allow_nan: bool = True,
    separators: tuple[str, str] = (", ", ": "),
) -> Callable[[JSON], str]:
    """``json.dumps`` with these options, as a function that gives the same text and
    raises the same errors: it calls the C encoder that ``json.dumps`` ends in, without
    building a ``JSONEncoder`` on every call (the commit path encodes every value
    several times)."""
    if _c_make_encoder is None:
        def slow(value: JSON) -> str:
            return json.dumps(value, ensure_ascii=ensure_ascii, allow_nan=allow_nan,
                              separators=separators)
        return slow
    encode = _c_make_encoder
    strings = encode_basestring_ascii if ensure_ascii else encode_basestring
    item, key = separators

    def fast(value: JSON) -> str:
        # A fresh markers dict per call, as json.dumps has: circular values are refused.
        return "".join(encode({}, _DEFAULT, strings, None, key, item, False, False,
                              allow_nan)(value, 0))
    return fast


_storable_text = dumps(ensure_ascii=False, allow_nan=False)

# ``\u0000`` in encoded JSON that is an escape of NUL, not an escaped backslash
# followed by the text "u0000".
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def storable(value: JSON, what: str) -> JSON:
    """``value`` as a storage holds it, or :class:`UnstorableValue` naming ``what`` (the
    record and its field, e.g. ``"task t1 checkpoint"``) and where in it the problem is."""
    try:
        encoded = _storable_text(value)
    except (TypeError, ValueError, RecursionError):
        raise UnstorableValue(_explain(value, what)) from None
    if "\\u0000" in encoded and _NUL_ESCAPE.search(encoded):
        raise UnstorableValue(_explain(value, what))
    try:
        encoded.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: no UTF-8 text holds it
        raise UnstorableValue(_explain(value, what)) from None
    return json.loads(encoded)


def storable_text(text: str | None, what: str) -> str | None:
    """``text`` if a text column can hold it, or :class:`UnstorableValue` naming ``what``."""
    if text is not None:
        problem = _text_problem(text)
        if problem is not None:
            raise UnstorableValue(f"{what} cannot be stored: the text holds {problem}")
    return text


NAME_BYTES = 1024
"""The most UTF-8 bytes a name a storage finds a record by may take: a document's kind or
key, a commit's idempotency key, a submission's request id. Postgres indexes each with
its session (a document's with its kind) in one index entry, which holds about 2.7 KB
at most: a longer name is refused before anything is written, on every storage alike,
rather than by one database's error at commit."""


def storable_name(name: str, what: str) -> str:
    """``name`` if a storage may find a record by it (:data:`NAME_BYTES`), or
    :class:`UnstorableValue` naming ``what`` and the name's start."""
    storable_text(name, what)
    size = len(name.encode("utf-8"))
    if size > NAME_BYTES:
        raise UnstorableValue(
            f"{what} {name[:40]!r}... cannot be stored: it is {size} bytes in UTF-8, "
            f"longer than the {NAME_BYTES} it may take")
    return name


def _text_problem(text: str) -> str | None:
    if "\x00" in text:
        return "NUL (\\x00)"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"a lone surrogate ({text[exc.start]!r}), which UTF-8 cannot encode"
    return None


def _explain(value: JSON, what: str) -> str:
    found = _first_problem(value, [], 0)
    where, problem = found if found is not None else ([], "it is not JSON")
    at = f" at {where}" if where else ""
    return f"{what} cannot be stored:{at} {problem}"


def _first_problem(value: JSON, path: list[Any], depth: int) -> tuple[list[Any], str] | None:
    if depth > 500:
        return path, "it is nested too deeply"
    if value is None or isinstance(value, bool | int):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else (path, f"{value!r} is not a JSON number")
    if isinstance(value, str):
        problem = _text_problem(value)
        return None if problem is None else (path, f"a string holds {problem}")
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = _first_problem(item, [*path, index], depth + 1)
            if found is not None:
                return found
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str | int | float | bool) and key is not None:
                return path, f"the key {key!r} ({type(key).__name__}) is not a JSON key"
            problem = _text_problem(key) if isinstance(key, str) else None
            if problem is not None:
                return path, f"a key holds {problem}"
            found = _first_problem(item, [*path, key], depth + 1)
            if found is not None:
                return found
        return None
    return path, f"a {type(value).__name__} is not JSON"
