"""A draft of each shape a storage could commit a shorter way than the general one: what a
test of an expectation the general commit alone can check puts the expectation beside."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from kernel import Draft, Outcome, SessionHandle
from kernel.records import Task
from kernel.tasks import Finish, Next

from .world import World

SHAPES = ["alone", "creates", "documents", "keyed", "next alone", "next writing", "ends alone"]
"""An append alone; tasks created alone; documents written alone; a keyed append; one
phase's ``Next`` keeping its lease, alone or with an append; one phase's ending alone."""


def shaped(world: World, handle: SessionHandle, shape: str, conversation: str, field: str,
           value: Any, *, actor: str, key: str) -> tuple[Draft, Task | None]:
    """A draft of ``shape`` writing ``{field: value}`` where it writes anything (``key``
    when keyed), and the task copy a phase's commit is built from (None for the others:
    a ``napper`` task is created and claimed for those)."""
    known = None
    made = Draft(actor=actor, key=key if shape == "keyed" else None)
    if shape in ("alone", "keyed"):
        made.append(conversation, "note", {field: value})
    elif shape == "creates":
        made.create_task("step", {"name": "made"})
    elif shape == "documents":
        made.set("plan", "other", [field], value)
    else:
        created = Draft()
        made_id = created.create_task("napper", {})
        handle.commit(created)
        now = world.clock.now()
        known = world.storage.claim(made_id, "w1", now, now + timedelta(seconds=30))
        assert known is not None
        transition: Any
        if shape == "ends alone":
            transition = Finish(Outcome.SUCCEEDED, "done")
        else:
            transition = Next("wake", {field: value}, keep_lease=True,
                              lease_until=now + timedelta(seconds=30))
        if shape == "next writing":
            made.append(conversation, "note", {field: value})
        made.transition(made_id, known.epoch, transition, owner="w1")
    return made, known
