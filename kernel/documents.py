"""Versioned JSON documents stored as ops plus occasional full baselines.

A document is a tree of JSON objects. Each commit that changes it stores only the
ops it applied; a full *baseline* value is stored once the ops written since the
last baseline outweigh that baseline. So a commit writes bytes proportional to
what it changed (amortised), and reading any version replays at most about one
document's worth of ops on top of the nearest baseline.

Ops are total: they apply to any value, so validating a draft never needs to load
the document. Paths are lists of object keys.

- ``{"op": "set", "path": [...], "value": v}``: missing objects on the way are created.
- ``{"op": "remove", "path": [...]}``: removing what is absent changes nothing.
- ``{"op": "append", "path": [...], "value": v}``: appends to the list there
  (a missing or non-list value becomes ``[v]``).
- ``{"op": "incr", "path": [...], "value": n}``: adds ``n`` to the number there (missing
  or not a number counts as 0). Counters need no read, so concurrent commits never
  conflict over them.
- ``{"op": "setdefault", "path": [...], "value": v}``: sets ``v`` only where nothing is
  (a first write wins without reading the document first).

A large op value is stored apart and the document holds its stand-in
(:mod:`kernel.large_values`): applying ops carries stand-ins as they are, and reads one
back (``open_one``) only where an op reaches inside it.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .artifacts import IN_PLACE_OF, MissingArtifact, is_stand_in
from .errors import CommitRejected, NotRegistered
from .values import dumps, storable

JSON = Any
Migrate = Callable[[int, JSON], JSON]
Open = Callable[[JSON], JSON]
"""Puts back the value a stand-in stands for (its artifact read, its hash checked)."""

OPS = ("set", "remove", "append", "incr", "setdefault")
MIN_BASELINE_BYTES = 4096


def encoded_size(value: JSON) -> int:
    """Bytes of ``value`` as stored (compact JSON). Keys are not sorted: their order
    changes no length. ASCII-escaped, so the text is as long as its bytes."""
    return len(_compact(value))


_compact = dumps(separators=(",", ":"))
_STAND_IN_KEY = json.dumps(IN_PLACE_OF)


def weight(value: JSON) -> int:
    """Bytes of ``value`` with each stand-in in it counted as the value it stands for:
    what a replay from it may cost, that decides when the next baseline is due."""
    text = _compact(value)
    total = len(text)
    if _STAND_IN_KEY not in text:
        return total  # no object in it has a stand-in's mark: nothing to add
    stack = [value]
    while stack:
        item = stack.pop()
        if is_stand_in(item):
            total += int(item.get("bytes") or 0)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return total


def check_op(op: JSON, what: str = "document op") -> JSON:
    """Reject a malformed op before it reaches storage; the op as storage holds it
    (:func:`~kernel.values.storable`, whose error names ``what``)."""
    if not isinstance(op, dict) or op.get("op") not in OPS:
        raise CommitRejected(f"document op must be one of {OPS}: {op!r}")
    path = op.get("path")
    if not isinstance(path, list) or not all(isinstance(p, str) for p in path):
        raise CommitRejected(f"document op path must be a list of keys: {op!r}")
    if op["op"] in ("set", "append", "incr", "setdefault") and "value" not in op:
        raise CommitRejected(f"document op {op['op']!r} needs a value")
    if op["op"] == "incr" and (
        isinstance(op["value"], bool) or not isinstance(op["value"], int | float)
    ):
        raise CommitRejected(f"document op 'incr' needs a number: {op!r}")
    if op["op"] != "set" and not path:
        raise CommitRejected(f"document op {op['op']!r} needs a non-empty path")
    return storable(op, what)


def copied(value: JSON) -> JSON:
    """A deep copy of an op's value (or of a list of ops), as :func:`copy.deepcopy`
    makes it, without its bookkeeping: objects and lists are copied, strings, numbers,
    booleans and null kept (they are immutable), anything else left to ``deepcopy``.
    For values :func:`~kernel.values.storable` returned (what a draft's ops hold),
    where no object or list appears twice, so there is no sharing to keep."""
    kind = type(value)
    if kind is dict:
        return {key: copied(item) for key, item in value.items()}
    if kind is list:
        return [copied(item) for item in value]
    if kind is str or kind is int or kind is float or kind is bool or value is None:
        return value
    return copy.deepcopy(value)


def apply_ops(
    value: JSON, ops: Iterable[JSON], open_one: Open | None = None, *, owned: bool = False
) -> JSON:
    """Return ``value`` with ``ops`` applied; ``value`` itself is left untouched, unless
    ``owned`` (the caller's own fresh value, which nothing else holds: applied in place,
    without a copy). ``open_one`` reads back a stand-in an op reaches inside (none
    without it)."""
    # An empty object (a new document's usual start) needs no deepcopy's bookkeeping.
    result = value if owned else {} if type(value) is dict and not value \
        else copy.deepcopy(value)
    for op in ops:
        result = _apply(result, op, open_one)
    return result


def _opened(value: JSON, open_one: Open | None) -> JSON:
    if not is_stand_in(value):
        return value
    if open_one is None:
        raise MissingArtifact(
            f"an op reaches inside {value.get('in_place_of')}, stored apart as artifact "
            f"{value['artifact']}: reading it needs the kernel's artifact store")
    return open_one(value)


def _apply(value: JSON, op: JSON, open_one: Open | None = None) -> JSON:
    path: list[str] = op["path"]
    if not path:
        return copied(op["value"])
    value = _opened(value, open_one)
    root = value if isinstance(value, dict) else {}
    node = root
    for key in path[:-1]:
        child = _opened(node.get(key), open_one)
        if not isinstance(child, dict):
            child = {}
        node[key] = child
        node = child
    last = path[-1]
    if op["op"] == "set":
        node[last] = copied(op["value"])
    elif op["op"] == "remove":
        node.pop(last, None)
    elif op["op"] == "setdefault":
        if last not in node:
            node[last] = copied(op["value"])
    elif op["op"] == "incr":
        current = _opened(node.get(last), open_one)
        number = (
            current if isinstance(current, int | float) and not isinstance(current, bool) else 0
        )
        node[last] = number + op["value"]
    else:
        current = _opened(node.get(last), open_one)
        node[last] = (
            [*current, copied(op["value"])]
            if isinstance(current, list)
            else [copied(op["value"])]
        )
    return root


def replacing(ops: list[JSON]) -> int | None:
    """The index of the last op that replaces the whole value (a ``set`` at the root),
    or None: from there on, the ops make the value without the one before them."""
    return next((i for i in range(len(ops) - 1, -1, -1) if not ops[i]["path"]), None)


def needs_baseline(ops_bytes_since_baseline: int, baseline_bytes: int) -> bool:
    """Write a full value once the ops since the last one outweigh it."""
    return ops_bytes_since_baseline > max(baseline_bytes, MIN_BASELINE_BYTES)


@dataclass(frozen=True)
class DocumentKind:
    """An application-registered document type with a schema version.

    ``migrate(from_version, value)`` upgrades a value stored under an older version
    to this one; documents are migrated when they are next read or written.
    ``panel`` names where an operator's view shows a session's documents of this kind
    (the dashboard's ``"plans"``); the kernel itself never reads it.
    """

    name: str
    version: int = 1
    migrate: Migrate | None = None
    initial: JSON = None
    panel: str | None = None

    def initial_value(self) -> JSON:
        return copy.deepcopy(self.initial) if self.initial is not None else {}

    def upgrade(self, stored_version: int, value: JSON) -> JSON:
        if stored_version == self.version:
            return value
        if stored_version > self.version:
            raise NotRegistered(
                f"document kind {self.name!r}: stored version {stored_version} is newer "
                f"than the registered version {self.version}"
            )
        if self.migrate is None:
            raise NotRegistered(
                f"document kind {self.name!r}: no migration from version {stored_version}"
            )
        return self.migrate(stored_version, copy.deepcopy(value))


def opened(value: JSON, open_one: Open) -> JSON:
    """``value`` with every stand-in inside it (a document's value) put back; the
    containers holding one are changed in place (a replay's value is its own copy)."""
    if is_stand_in(value):
        return open_one(value)
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, child in item.items():
                if is_stand_in(child):
                    item[key] = open_one(child)
                elif isinstance(child, dict | list):
                    stack.append(child)
        elif isinstance(item, list):
            for index, child in enumerate(item):
                if is_stand_in(child):
                    item[index] = open_one(child)
                elif isinstance(child, dict | list):
                    stack.append(child)
    return value
