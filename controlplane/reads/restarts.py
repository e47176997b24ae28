"""Where a task may start again (the phases it entered, from the commit log) and what a
restart from one of them would do: which phases stay, which run again, and the
external calls made after that point, which a restart makes anew under new operation
ids (:mod:`kernel.forks`).

Which tasks may start again: one no phase of which can be running or winding down. A
task that ended (any outcome), that is blocked, or that is pending, asleep or waiting
may; one that is running, completing or being cancelled may not (cancel it and let it
end first), nor one that owns subtasks still open, nor an owned subtask whose owner has
ended (start the owner again). The commit checks this under the session's lock
(:meth:`kernel.commit.Draft.restart`); the preview says it beforehand.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from controlplane import models
from controlplane.process.kernel import process_kernel
from controlplane.reads import environments
from controlplane.reads.pages import pruned_before
from controlplane.reads.snapshot import rows as sql_rows
from kernel import Blocked, Status, Task, UnknownRecord
from kernel.forks import RESTARTED, PhaseEntry, no_restart, operation_id

JSON = Any
MAX_POINTS = 2000

POINTS_SQL = """
SELECT c.seq, extract(epoch FROM c.at)::float8, c.actor, i->>'phase', i->'checkpoint',
       (i->>'version')::int, (i->>'restart_of')::int
FROM kernel_commit c JOIN kernel_session s ON s.id = c.session_id
CROSS JOIN LATERAL jsonb_array_elements(c.summary) i
WHERE c.session_id = %s AND c.seq > s.pruned_seq AND c.summary @> %s::jsonb
  AND i->>'type' = 'task' AND i->>'id' = %s AND i ? 'checkpoint'
ORDER BY c.seq LIMIT %s
"""
"""The summary items that record the task entering a phase, with where it stood, after
the session's ``pruned_seq``: a keyed commit a trim kept below it (an operator's
restart, say) is no restart point, since the phases entered after it up to there, and
the calls they made, are gone with their commits (a preview could not say what a
restart from it repeats)."""


@dataclass(frozen=True)
class RestartPoint:
    """A phase the task entered, and the checkpoint it entered it with."""

    seq: int
    at: datetime
    actor: str
    phase: str
    checkpoint: JSON
    version: int | None
    restart_of: int | None

    def entry(self, task_id: str) -> PhaseEntry:
        return PhaseEntry(task_id, self.seq, self.phase, self.checkpoint, self.version,
                          self.restart_of)


@dataclass(frozen=True)
class Call:
    """An external call made after the restart point: it stays as it is in the history;
    the restart's own calls are new ones, under new operation ids."""

    task_id: str
    kind: str
    name: str
    operation_id: str | None
    replay: str
    """``safe``, ``unsafe``, or ``unknown`` (a subtask that recorded no intent)."""
    new_operation_id: str | None
    """The id the task's own call goes out under after the restart; None for a subtask's
    call (the restart makes a new subtask, with an id of its own)."""


@dataclass
class RestartPreview:
    task: Task
    point: RestartPoint
    stays: list[RestartPoint]
    runs_again: list[RestartPoint]
    calls: list[Call] = field(default_factory=list)
    refused: str | None = None
    """Why the task's state refuses a restart now (None: it allows one)."""
    environment: dict[str, Any] | None = None
    """A worker's current report that it does not offer the run's environment: the
    restart runs under what that worker offers (:mod:`controlplane.reads.environments`)."""

    @property
    def expected_seq(self) -> int:
        return self.task.updated_seq

    @property
    def expected_report(self) -> str | None:
        """The identity of :attr:`environment` the restart carries (None: no report)."""
        return None if self.environment is None else environments.identity(self.environment)

    @property
    def environment_reason(self) -> str | None:
        return None if self.environment is None else environments.reason(self.environment)

    @property
    def unsafe_calls(self) -> list[Call]:
        return [c for c in self.calls if c.replay != "safe"]

    def may_repeat(self) -> list[str]:
        """What the restart makes happen again, in words (the action's ``may_repeat``)."""
        phases = ", ".join(dict.fromkeys(p.phase for p in self.runs_again)) or self.point.phase
        said = [f"phases {phases} of {self.task.kind} run again from phase "
                f"{self.point.phase!r} as entered at #{self.point.seq}"]
        said += [f"{c.replay} call {c.name} ({c.operation_id or c.task_id}) is made again as a "
                 f"new call" + (f" under {c.new_operation_id}" if c.new_operation_id else "")
                 for c in self.unsafe_calls]
        return said


def points(task: Task) -> list[RestartPoint]:
    """The phases ``task`` entered, oldest first (those the log still holds)."""
    contains = json.dumps([{"type": "task", "id": task.id}])
    found = []
    for seq, t, actor, phase, checkpoint, version, restart_of in sql_rows(
        POINTS_SQL, [task.session_id, contains, task.id, MAX_POINTS]
    ):
        if isinstance(checkpoint, str):
            checkpoint = json.loads(checkpoint)
        found.append(RestartPoint(seq, datetime.fromtimestamp(t, UTC), actor, phase,
                                  checkpoint, version, restart_of))
    return found


def point(task: Task, seq: int) -> RestartPoint:
    """The phase ``task`` entered at commit ``seq``; UnknownRecord if it entered none then."""
    return _chosen(task, seq, points(task))


def _chosen(task: Task, seq: int, found: list[RestartPoint]) -> RestartPoint:
    """The point of ``found`` at ``seq``, or UnknownRecord saying why there is none."""
    chosen = next((p for p in found if p.seq == seq), None)
    if chosen is not None:
        return chosen
    pruned = pruned_before(task.session_id, seq)
    if pruned:
        raise UnknownRecord(
            f"retention removed the commits of session {task.session_id} up to #{pruned}: "
            f"task {task.id} does not start again from #{seq} (see its restart points)")
    raise UnknownRecord(f"task {task.id} entered no phase at #{seq} (see its restart points)")


def refusal(task: Task) -> str | None:
    """Why ``task``'s own state refuses a restart (the commit checks the rest)."""
    if task.cancel is not None and not task.terminal:
        return f"task {task.id} is being cancelled: wait for it to end"
    if task.status in (Status.RUNNING, Status.COMPLETING):
        return (f"task {task.id} is {task.status}: a phase of it may be running; cancel it "
                "and wait for it to end first")
    return kind_refuses(task)


def kind_refuses(task: Task) -> str | None:
    """Why ``task``'s kind never starts again from a phase (a hosted agent's turn), in
    words; None when it may."""
    resolved = process_kernel().registry.resolve(task)
    return None if isinstance(resolved, Blocked) else no_restart(task, resolved.definition)


def preview(task: Task, seq: int) -> RestartPreview:
    found = points(task)
    chosen = _chosen(task, seq, found)
    shown = RestartPreview(
        task, chosen,
        stays=[p for p in found if p.seq < seq],
        runs_again=[p for p in found if p.seq >= seq],
        refused=refusal(task),
        environment=environments.report(task),
    )
    restarts = len(task.checkpoint.get(RESTARTED, [])) if isinstance(task.checkpoint, dict) else 0
    new_id = operation_id(task.id, {RESTARTED: [None] * (restarts + 1)})
    seen: set[str] = set()
    for later in [*shown.runs_again, None]:
        checkpoint = later.checkpoint if later is not None else task.checkpoint
        for call in _own_calls(task, checkpoint, new_id):
            if call.operation_id not in seen:
                seen.add(call.operation_id or "")
                shown.calls.append(call)
    shown.calls += _subtask_calls(task, seq)
    return shown


def _own_calls(task: Task, checkpoint: JSON, new_id: str) -> list[Call]:
    """Intents the task recorded in its checkpoint (a tool task's ``intent``, a hosted
    agent's ``intents`` by call)."""
    if not isinstance(checkpoint, dict):
        return []
    calls = []
    intent = checkpoint.get("intent")
    if isinstance(intent, dict) and intent.get("operation_id"):
        name = str(((task.input or {}).get("call") or {}).get("name") or task.kind)
        calls.append(Call(task.id, task.kind, name, intent["operation_id"],
                          str(intent.get("replay", "unsafe")), new_id))
    intents = checkpoint.get("intents")
    if isinstance(intents, dict):
        for call_id, found in intents.items():
            if isinstance(found, dict):
                calls.append(Call(task.id, task.kind, str(found.get("name", call_id)),
                                  found.get("operation_id"), str(found.get("replay", "unsafe")),
                                  None))
    return calls


def _subtask_calls(task: Task, seq: int) -> list[Call]:
    """The calls of subtasks the task made at or after ``seq``: the phases that run again
    make new subtasks, whose calls are new ones."""
    made = models.Task.objects.filter(parent_id=task.id, created_seq__gte=seq).order_by(
        "created_seq", "id").values_list("id", "kind", "input", "checkpoint")[:MAX_POINTS]
    calls = []
    for task_id, kind, input, checkpoint in made:
        intent = (checkpoint or {}).get("intent") if isinstance(checkpoint, dict) else None
        name = ((input or {}).get("call") or {}).get("name") if isinstance(input, dict) else None
        calls.append(Call(
            task_id, kind, str(name or kind),
            (intent or {}).get("operation_id"),
            str((intent or {}).get("replay", "unknown")), None,
        ))
    return calls
