"""Artifacts: large values stored once, immutable, named by their content's hash.

A tool result (or any value a record would hold) larger than a threshold is stored as
an artifact, and the record holds a *reference* instead: the artifact's digest
(``sha256:<hex>``), its size and media type, and an excerpt for readers (a model) that
need only the gist. The same bytes are stored once, whoever stores them.

Order is what makes a reference safe: the artifact is stored completely (its store
says so) before the commit that writes the reference is built, so a committed record
never references half a file. A process that dies between the two leaves an artifact
that nothing references; :meth:`ArtifactStore.sweep` removes such objects once they are
older than a grace period longer than any phase (a phase that stored one and is still
about to commit its reference keeps it). Reading checks the hash: stored bytes that do
not hash to their name are refused (:class:`CorruptArtifact`), never returned.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from .errors import KernelError
from .records import Task
from .values import storable

JSON = Any
REFERENCE = "artifact"
"""The key that marks a value as a reference to an artifact (its digest)."""
IN_PLACE_OF = "in_place_of"
"""The key that marks a reference as a *stand-in*: a value a record holds apart, that
every read replaces by the value (:mod:`kernel.large_values`), unlike a tool's result
reference, which is what the model is meant to see. It says what the value is."""
HOLDS = "holds"
"""A stand-in's list of the digests its value references itself: the text a sweep
searches for references must name them, or they would be swept from under it."""
DEFAULT_THRESHOLD = 16_384
"""Bytes of JSON above which a tool's result is stored as an artifact."""
EXCERPT = 1_000
"""Characters of a large value's JSON that its reference keeps for readers."""
GRACE = timedelta(hours=1)
"""How old an unreferenced artifact must be before a sweep removes it."""
TASK_FIELDS = ("input", "checkpoint", "signals")
"""The fields of a task that has not ended whose references a sweep keeps: what its
later phases read (a value :meth:`~kernel.run.Run.store_large` stored, kept in its
checkpoint, passed in a child's input or a signal), after a sleep, a wait or a crash of
any length; and the outcome of each ended child of such a task, which its join reads
(:meth:`~kernel.run.Run.outcomes`), however long before its siblings it ended. Other
ended tasks' records are not read: they are kept for display, and a prune never removes
a task, so keeping what they name would keep every such artifact forever."""


class ArtifactError(KernelError):
    pass


class MissingArtifact(ArtifactError):
    """No artifact has this digest (it was never stored, or it was swept)."""


class CorruptArtifact(ArtifactError):
    """The stored bytes do not hash to the artifact's name: refused, never returned."""


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def check(digest: str, data: bytes) -> bytes:
    """``data`` if it hashes to ``digest``; CorruptArtifact naming both otherwise."""
    found = digest_of(data)
    if found != digest:
        raise CorruptArtifact(
            f"artifact {digest} is corrupt: its {len(data)} stored bytes hash to {found}"
        )
    return data


class ArtifactStore(Protocol):
    def put(self, data: bytes, media_type: str) -> str:
        """Store ``data`` completely, once, and return its digest; storing the same bytes
        again changes nothing. Returns only once the whole object is durable."""
        ...

    def get(self, digest: str) -> bytes:
        """The bytes named ``digest``, their hash checked (CorruptArtifact,
        MissingArtifact)."""
        ...

    def media_type(self, digest: str) -> str: ...

    def sweep(self, referenced: Callable[[Iterable[str]], set[str]], now: datetime,
              grace: timedelta = GRACE) -> int:
        """Remove the artifacts stored before ``now - grace`` that ``referenced`` (given
        candidates, answering which of them some record references) does not keep;
        how many were removed."""
        ...


@dataclass(frozen=True)
class _Stored:
    data: bytes
    media_type: str
    at: datetime


class InMemoryArtifacts:
    """The reference store: a dict under a lock. ``clock`` dates each object."""

    def __init__(self, clock: Callable[[], datetime]) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._objects: dict[str, _Stored] = {}

    def put(self, data: bytes, media_type: str) -> str:
        digest = digest_of(data)
        with self._lock:
            # Stored again: whole (over whatever a dead writer left), and the grace period
            # starts over, so a sweep cannot remove it before its reference commits.
            self._objects[digest] = _Stored(bytes(data), media_type, self._clock())
        return digest

    def get(self, digest: str) -> bytes:
        with self._lock:
            found = self._objects.get(digest)
        if found is None:
            raise MissingArtifact(f"no artifact {digest}")
        return check(digest, found.data)

    def media_type(self, digest: str) -> str:
        with self._lock:
            found = self._objects.get(digest)
        if found is None:
            raise MissingArtifact(f"no artifact {digest}")
        return found.media_type

    def sweep(self, referenced: Callable[[Iterable[str]], set[str]], now: datetime,
              grace: timedelta = GRACE) -> int:
        with self._lock:
            old = [d for d, o in self._objects.items() if o.at < now - grace]
        kept = referenced(old)
        removed = 0
        with self._lock:
            for digest in old:
                found = self._objects.get(digest)
                if digest not in kept and found is not None and found.at < now - grace:
                    del self._objects[digest]
                    removed += 1
        return removed

    def corrupt(self, digest: str, data: bytes) -> None:
        """Replace an object's bytes behind the store's back (what a test simulates)."""
        with self._lock:
            stored = self._objects[digest]
            self._objects[digest] = _Stored(data, stored.media_type, stored.at)


def task_values(tasks: Iterable[Task]) -> list[JSON]:
    """What of ``tasks`` a sweep reads for references (:data:`TASK_FIELDS`): the fields of
    those that have not ended, and the outcomes of the ended children of those."""
    every = list(tasks)
    live = {t.id for t in every if not t.terminal}
    return [
        [getattr(t, name) for name in TASK_FIELDS] if t.id in live else t.outcome
        for t in every if t.id in live or t.parent_id in live
    ]


def is_reference(value: JSON) -> bool:
    return isinstance(value, dict) and isinstance(value.get(REFERENCE), str) and \
        value[REFERENCE].startswith("sha256:")


def offload(store: ArtifactStore, value: JSON, threshold: int, what: str = "value") -> JSON:
    """``value`` itself when its JSON is at most ``threshold`` bytes; otherwise stored as
    an artifact (completely, before this returns) and a reference in its place.

    A value no storage holds is refused first, naming ``what`` (the record and its field),
    as the record would refuse it: measuring it must not fail otherwise, nor store it."""
    value = storable(value, what)
    data = encoded(value)
    if len(data) <= threshold:
        return value
    found = _reference(store.put(data, "application/json"), len(data),
                       data[:EXCERPT * 4].decode(errors="ignore")[:EXCERPT])
    return _holding(found, value, data)


def encoded(value: JSON) -> bytes:
    """An artifact's bytes for a JSON value (the same value, the same bytes)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"),
                      sort_keys=True).encode()


def _reference(digest: str, size: int, excerpt: str) -> JSON:
    return {
        REFERENCE: digest,
        "bytes": size,
        "media_type": "application/json",
        "excerpt": excerpt,
        "note": f"the full value ({size:,} bytes) is stored as artifact {digest}; "
                "this is its beginning",
    }


def stand_in(store: ArtifactStore, value: JSON, data: bytes, what: str) -> JSON:
    """Store ``value`` (already storable; ``data``: its :func:`encoded` bytes) as an
    artifact, completely, and return the stand-in a record holds in its place
    (:func:`stand_in_shape`)."""
    return stand_in_shape(store.put(data, "application/json"), value, data, what)


_REFERENCE_KEY = encoded(REFERENCE) + b":"


def stand_in_shape(digest: str, value: JSON, data: bytes, what: str) -> JSON:
    """The stand-in of ``value`` stored as artifact ``digest``: a reference marked
    :data:`IN_PLACE_OF` ``what``, naming the artifacts ``value`` references itself
    (:data:`HOLDS`). A string's excerpt is its beginning as text."""
    excerpt = value[:EXCERPT] if isinstance(value, str) else data[:EXCERPT * 4].decode(
        errors="ignore")[:EXCERPT]
    found = _reference(digest, len(data), excerpt)
    found[IN_PLACE_OF] = what
    return _holding(found, value, data)


def _holding(reference: JSON, value: JSON, data: bytes) -> JSON:
    """``reference`` to ``value`` (its bytes ``data``), listing under :data:`HOLDS` the
    artifacts ``value`` references itself, if any."""
    # A reference is an object with the key REFERENCE, which the encoded bytes then hold;
    # without them there is nothing to walk (a large history, say, referencing nothing).
    inner = sorted(set(references(value))) if _REFERENCE_KEY in data else []
    if inner:
        reference[HOLDS] = inner
    return reference


def is_stand_in(value: JSON) -> bool:
    return is_reference(value) and isinstance(value.get(IN_PLACE_OF), str)


def load(store: ArtifactStore, reference: JSON) -> JSON:
    """The value a reference stands for, its hash checked."""
    return json.loads(store.get(reference[REFERENCE]))


def references(value: JSON) -> list[str]:
    """The digests of every artifact referenced anywhere inside ``value``."""
    found: list[str] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if is_reference(item):
            found.append(item[REFERENCE])
            found.extend(d for d in item.get(HOLDS) or () if isinstance(d, str))
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return found
