"""The environment a run was started under, and whether a worker still offers it
(DESIGN §14).

A task whose definition declares what it needs (``needs(input, checkpoint)``: a map of
names to fingerprints, e.g. its model, or its tool's parameter schema and replay policy)
records, when it is created, what the creating process offered: that, the kernel's
version and its definition's kind and version, under :data:`ENVIRONMENT` in its
checkpoint. A worker about to run it compares what the task recorded with what it
offers now (:func:`differences`): something the run needs that is missing here or
different is a difference, and the worker leaves the run blocked with the differences
stated (:mod:`kernel.worker`), as for a missing definition; something offered beyond
what was recorded (a tool added) is compatible. An operator then migrates the run to
the environment the worker offers (:meth:`kernel.commit.Draft.migrate_environment`,
a commit naming who and why) or starts it again from a phase (:mod:`kernel.forks`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from typing import Any

JSON = Any

KERNEL_VERSION = "1"
"""The kernel's own version, as a run records it: a run recorded under another one does
not continue silently."""

ENVIRONMENT = "_environment"
"""The checkpoint key under which a task keeps the environment it was started under."""

BLOCKED_DOCUMENT = "@environment"
"""The document, one per task (keyed by its id), in which a worker that found a task's
environment different says so: which worker, the differences, what it offers, and the
task's ``updated_seq`` then (a report older than the task's last change is stale)."""

NOT_COMPARED = frozenset({"definition"})
"""Recorded but not compared here: a definition of another version is migrated or found
blocked by the registry (:meth:`kernel.registry.Registry.resolve`)."""

Needs = Callable[[JSON, JSON], dict[str, JSON]]
"""A definition's ``needs(input, checkpoint)``: what this process offers of what a task
with this input and checkpoint needs, by name (None for something it lacks)."""


def fingerprint(value: JSON) -> str:
    """A short digest of a JSON value (a parameter schema, say), key order aside."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def offered(kind: str, version: int, needs: Needs | None, input: JSON,
            checkpoint: JSON) -> dict[str, JSON]:
    """What this process offers a task of ``kind`` v``version`` with this input and
    checkpoint: the kernel, the definition, and what the definition says it needs."""
    found: dict[str, JSON] = {"kernel": KERNEL_VERSION, "definition": f"{kind} v{version}"}
    if needs is not None:
        try:
            found.update(needs(input, checkpoint))
        except Exception as exc:  # input its phases will refuse: they say why, not this
            found["needs"] = f"unreadable ({type(exc).__name__})"
    return found


def recorded(checkpoint: JSON) -> dict[str, JSON] | None:
    """The environment a task's checkpoint recorded (None: it recorded none)."""
    found = checkpoint.get(ENVIRONMENT) if isinstance(checkpoint, dict) else None
    return found if isinstance(found, dict) else None


def differences(was: Mapping[str, JSON], now: Mapping[str, JSON]) -> list[str]:
    """What the run needs (``was``) that ``now`` lacks or offers otherwise, in words;
    what ``now`` offers beyond it (a need, or a detail of one) is compatible and not
    listed."""
    found = []
    for name in sorted(was):
        if name in NOT_COMPARED:
            continue
        before, after = was[name], now.get(name)
        if before is None:
            continue  # it needed nothing here when it started
        if after is None:
            found.append(f"{name}: missing here (it was started with {_said(before)})")
        elif not _meets(after, before):
            found.append(f"{name}: {_said(after)} here, it was started with {_said(before)}")
    return found


def _meets(after: JSON, before: JSON) -> bool:
    """Whether ``after`` offers what ``before`` recorded: equal, or for a need described
    by details, every detail it recorded the same (a detail described beyond them, which
    a later kernel may record, is compatible, as a need added is)."""
    if isinstance(before, dict) and isinstance(after, dict):
        return all(key in after and after[key] == value for key, value in before.items())
    return bool(after == before)


def _said(value: JSON) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in sorted(value.items()))
    return str(value)
