"""Which checkpoints of a thread a prune keeps: a policy's choice, plus what those need.

A policy picks checkpoints per namespace (the newest N, those younger than a cutoff).
:func:`retained` then adds every ancestor a kept checkpoint needs to be restored: the
saver stores each checkpoint with all its channel values, so an ordinary channel needs
nothing older, but a LangGraph ``DeltaChannel`` stores no value between its snapshots
and is rebuilt from its ancestors' writes back to the nearest ancestor that stores one
(``get_delta_channel_history``). Those ancestors, with their writes, stay.

Which channels are delta channels is read from the checkpoint's metadata
(``counters_since_delta_snapshot``, which LangGraph keeps for exactly those).

A subgraph call writes its checkpoints in a namespace of its own (``node:task id``), new
for every call: kept by the policy like the root's, a thread would keep some of every
call it ever made. So, as LangGraph's Postgres saver does, a call's namespace goes whole
with the root checkpoint the call started from (its metadata's ``parents[""]``), once
that one is in the thread and not kept: restoring or forking a kept root checkpoint never
reads a call started from an older one. A ``checkpointer=True`` subgraph's namespace
(no task id: its state outlives each call) is kept by the policy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

JSON = Any
Index = Mapping[str, Mapping[str, JSON]]
"""Namespace -> checkpoint id -> index entry (``parent``, ``metadata``, ``values``, ``ts``)."""


class Policy(Protocol):
    def choose(self, checkpoints: Mapping[str, JSON]) -> set[str]:
        """The ids of one namespace's checkpoints to keep (before their needs are added)."""
        ...


@dataclass(frozen=True)
class KeepLatest:
    """The newest ``count`` checkpoints of each namespace (0: none)."""

    count: int

    def __post_init__(self) -> None:
        if self.count < 0:
            raise ValueError(f"keep latest: a count of at least 0, not {self.count}")

    def choose(self, checkpoints: Mapping[str, JSON]) -> set[str]:
        return set(sorted(checkpoints, reverse=True)[: self.count])


@dataclass(frozen=True)
class KeepSince:
    """Checkpoints written at or after ``cutoff``, and always the newest one of each
    namespace (so that the thread can go on)."""

    cutoff: datetime

    def choose(self, checkpoints: Mapping[str, JSON]) -> set[str]:
        if not checkpoints:
            return set()
        young = {cid for cid, entry in checkpoints.items()
                 if entry.get("ts") and datetime.fromisoformat(entry["ts"]) >= self.cutoff}
        return young | {max(checkpoints)}


def delta_channels(entry: JSON) -> set[str]:
    counters = (entry.get("metadata") or {}).get("counters_since_delta_snapshot") or {}
    return set(counters)


def needs(checkpoints: Mapping[str, JSON], checkpoint_id: str) -> set[str]:
    """The ancestors of ``checkpoint_id`` its delta channels are rebuilt from."""
    entry = checkpoints[checkpoint_id]
    missing = delta_channels(entry) - set(entry.get("values", ()))
    found: set[str] = set()
    parent = entry.get("parent")
    while missing and parent is not None and parent in checkpoints and parent not in found:
        found.add(parent)
        ancestor = checkpoints[parent]
        missing -= set(ancestor.get("values", ()))
        parent = ancestor.get("parent")
    return found


def started_from(checkpoints: Mapping[str, JSON]) -> str | None:
    """The root checkpoint a subgraph call's namespace started from (its newest
    checkpoint's ``parents[""]``), or None."""
    if not checkpoints:
        return None
    newest = checkpoints[max(checkpoints)]
    root = ((newest.get("metadata") or {}).get("parents") or {}).get("")
    return root if isinstance(root, str) else None


def retained(index: Index, policy: Policy) -> dict[str, set[str]]:
    """Per namespace, the checkpoints a prune by ``policy`` keeps."""
    kept: dict[str, set[str]] = {}
    for ns, checkpoints in index.items():
        chosen = policy.choose(checkpoints)
        for checkpoint_id in list(chosen):
            chosen |= needs(checkpoints, checkpoint_id)
        kept[ns] = chosen
    roots = index.get("", {})
    for ns, checkpoints in index.items():
        root = started_from(checkpoints) if ":" in ns else None
        if root is not None and root in roots and root not in kept.get("", set()):
            kept[ns] = set()
    return kept
