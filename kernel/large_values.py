"""Large values of a commit kept apart, as artifacts (:mod:`kernel.artifacts`), and read
back in place.

Before any kind of commit reaches storage (:meth:`~kernel.session.SessionHandle.commit`
calls :func:`prepare` before it picks the storage's method), each entry payload and
each document op's value whose JSON passes the kernel's threshold is stored as an
artifact, completely, and the record holds a *stand-in* in its place: a reference
marked with what it stands for (:func:`kernel.artifacts.stand_in`). So a record never
names an artifact that is not whole, and both storages hold the same stand-ins.

- An entry payload that is a JSON object keeps its small fields: its largest fields go
  apart one at a time until the rest fits, so what reads a record's small fields in
  SQL (a response's turn and usage, a result's call id, an operation's target) finds
  them still. A payload that is not an object, or whose fields are all small, goes
  apart whole.
- A document op's value (``set``, ``append``) goes apart whole; the document holds the
  stand-in where the op put it, in its later ops' replays and baselines too (a baseline
  stays small). An op that reaches inside a stand-in (a key below it, an append to it)
  reads its value first (:func:`kernel.documents.apply_ops`); a baseline built then
  holds that part whole.

Reads put the values back (:func:`opened_entry`, :func:`opened`), each artifact's hash
checked: a corrupt or missing one is refused with its error, prefixed by the record and
field it stands for.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from .artifacts import (
    IN_PLACE_OF,
    REFERENCE,
    ArtifactError,
    ArtifactStore,
    encoded,
    is_stand_in,
    stand_in,
    stand_in_shape,
)
from .commit import Draft
from .documents import Open, opened
from .records import Entry
from .values import dumps

__all__ = ["Open", "opened", "opened_entry", "opener", "prepare", "size"]

JSON = Any


def size(value: JSON) -> int:
    """Bytes of ``value``'s JSON as an artifact holds it (key order changes no length)."""
    return len(_compact(value).encode())


_compact = dumps(ensure_ascii=False, separators=(",", ":"))


def prepare(draft: Draft, store: ArtifactStore, threshold: int | None) -> Draft:
    """``draft`` with its entry payloads and document op values above ``threshold``
    bytes stored as artifacts (completely, before this returns) and stand-ins in their
    place; ``draft`` itself when nothing is above it (or ``threshold`` is None). The
    caller's draft is left as it was."""
    if threshold is None:
        return draft
    entries = draft.entries
    for index, (entry_id, conversation_id, kind, payload) in enumerate(draft.entries):
        kept = _payload(store, payload, threshold, f"entry {entry_id} ({kind}) payload")
        if kept is not payload:
            if entries is draft.entries:
                entries = list(draft.entries)
            entries[index] = (entry_id, conversation_id, kind, kept)
    document_ops = draft.document_ops
    for (kind, key), ops in draft.document_ops.items():
        changed = [_op(store, op, threshold, f"document {kind}/{key}") for op in ops]
        if any(new is not old for new, old in zip(changed, ops, strict=True)):
            if document_ops is draft.document_ops:
                document_ops = dict(draft.document_ops)
            document_ops[(kind, key)] = changed
    if entries is draft.entries and document_ops is draft.document_ops:
        return draft
    return replace(draft, entries=entries, document_ops=document_ops)


def _payload(store: ArtifactStore, payload: JSON, threshold: int, what: str) -> JSON:
    total = size(payload)
    if total <= threshold:
        return payload
    if isinstance(payload, dict):
        # Plan first, store after: a plan that ends by storing the payload whole leaves
        # no artifact of a field behind.
        planned: dict[str, tuple[JSON, bytes]] = {}
        for field_size, key in sorted(((size(v), k) for k, v in payload.items()),
                                      key=lambda pair: -pair[0]):
            if total <= threshold:
                break
            data = encoded(payload[key])
            smaller = field_size - size(_shape(payload[key], data, f"{what} field {key!r}"))
            if smaller <= 0:
                break
            planned[key] = (payload[key], data)
            total -= smaller
        if total <= threshold:
            return {k: stand_in(store, v, planned[k][1], f"{what} field {k!r}")
                    if k in planned else v for k, v in payload.items()}
    return stand_in(store, payload, encoded(payload), what)


def _shape(value: JSON, data: bytes, what: str) -> JSON:
    """What :func:`stand_in` would return for ``value``, without storing it (to weigh
    it: every digest is as long)."""
    return stand_in_shape(UNSTORED, value, data, what)


UNSTORED = "sha256:" + "0" * 64


def _op(store: ArtifactStore, op: JSON, threshold: int, document: str) -> JSON:
    if op["op"] not in ("set", "append"):
        return op
    data = encoded(op["value"])  # as long as size() says, and what a stand-in stores
    if len(data) <= threshold:
        return op
    where = "/".join(op["path"]) or "(the whole value)"
    return {**op, "value": stand_in(store, op["value"], data,
                                    f"{document} {op['op']} value at {where}")}


def opener(store: ArtifactStore, record: str) -> Open:
    """Puts back stand-ins of ``record`` (named in a refusal) from ``store``."""

    def open_one(found: JSON) -> JSON:
        try:
            return json.loads(store.get(found[REFERENCE]))
        except ArtifactError as exc:
            raise type(exc)(f"{found.get(IN_PLACE_OF) or record}: {exc}") from exc

    return open_one


def opened_entry(entry: Entry, store: ArtifactStore) -> Entry:
    """``entry`` with its payload whole: a stand-in of it, or of any of its fields, read
    back (CorruptArtifact, MissingArtifact naming the entry)."""
    payload = entry.payload
    if not isinstance(payload, dict):
        return entry
    if is_stand_in(payload):
        return replace(entry, payload=opener(store, f"entry {entry.id}")(payload))
    if not any(is_stand_in(v) for v in payload.values()):
        return entry
    open_one = opener(store, f"entry {entry.id}")
    return replace(entry, payload={k: open_one(v) if is_stand_in(v) else v
                                   for k, v in payload.items()})
