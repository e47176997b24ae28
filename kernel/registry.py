"""The Registry: task definitions by ``(kind, version)`` and document kinds.

A task whose definition is missing, too old, or fails to migrate is *blocked*:
a condition derived from the registry at the moment we look, never stored. Its
state is kept as it is and it runs again once a compatible definition exists.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .documents import DocumentKind, Migrate
from .environment import BLOCKED_DOCUMENT, Needs
from .errors import NotRegistered
from .records import Status, Task
from .tasks import Transition

JSON = Any
# A phase handler takes the task's :class:`kernel.run.Run`. The parameter is typed
# loosely on purpose: the registry sits below the runtime (a run commits through the
# builder, which resolves definitions here), so it must not import it.
Handler = Callable[[Any], Transition]
TaskMigrate = Callable[[int, JSON, JSON], tuple[JSON, JSON]]

RESERVED = frozenset(
    {"migrate", "on_cancel", "on_end", "initial", "queue", "max_restarts", "decisions",
     "needs", "no_restart", "no_restart_ended"}
)


@dataclass(frozen=True)
class Receipt:
    """The evidence an operator may give with a decision: a JSON object of text fields,
    ``required`` ones and ``optional`` ones, nothing else. With ``needed`` the decision
    is refused without one."""

    required: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    needed: bool = False
    max_length: int = 500

    def check(self, receipt: JSON) -> None:
        """ValueError naming the field (``receipt.<name>``) if ``receipt`` has another
        shape; None is a receipt not given."""
        if receipt is None:
            if self.needed:
                raise ValueError("receipt: this decision needs one")
            return
        if not isinstance(receipt, dict):
            raise ValueError(f"receipt: an object, not {type(receipt).__name__}")
        allowed = (*self.required, *self.optional)
        for name in self.required:
            if name not in receipt:
                raise ValueError(f"receipt.{name}: required")
        for name, value in receipt.items():
            if name not in allowed:
                raise ValueError(f"receipt.{str(name)[:100]}: not a field of this receipt "
                                 f"(its fields: {', '.join(allowed)})")
            if not isinstance(value, str) or not 1 <= len(value) <= self.max_length:
                raise ValueError(f"receipt.{name}: text of 1 to {self.max_length} characters")

    def schema(self) -> JSON:
        """The same shape as a JSON schema, for what an API publishes."""
        text = {"type": "string", "minLength": 1, "maxLength": self.max_length}
        return {
            "type": "object", "additionalProperties": False,
            "required": list(self.required),
            "properties": {name: text for name in (*self.required, *self.optional)},
        }


@dataclass(frozen=True)
class Decision:
    """One answer an operator may give a task that waits on a signal (an uncertain step).

    ``name`` is what an API or a form sends; ``value`` is what the task finds under
    ``"decision"`` in the signal's payload; ``label`` is the words on the button.
    ``may_repeat`` says what may happen twice when this answer is wrong (say "the
    operation is performed again"); None when the answer repeats no external work.
    ``receipt`` is the evidence the answer takes (the task finds it under ``"receipt"``);
    None: it takes none, and one sent with it is refused.
    """

    name: str
    label: str
    value: str
    may_repeat: str | None = None
    description: str = ""
    receipt: Receipt | None = None

    def check_receipt(self, receipt: JSON) -> None:
        """ValueError naming the field if ``receipt`` is not what this answer takes."""
        if self.receipt is None:
            if receipt is not None:
                raise ValueError(f"receipt: the decision {self.name!r} takes none")
            return
        self.receipt.check(receipt)


@dataclass(frozen=True)
class TaskDefinition:
    kind: str
    version: int
    phases: dict[str, Handler]
    initial: str
    migrate: TaskMigrate | None = None
    on_cancel: Handler | None = None
    on_end: Callable[[Any, Any], None] | None = None
    """``on_end(run, finish)``: called when the kernel ends the task itself (cancelled,
    past the restart limit, a phase that raised or faulted); its writes go in the
    commit that ends the task. A task that ends by its own transition does not need it."""
    max_restarts: int = 3
    queue: str = "default"
    decisions: tuple[Decision, ...] = ()
    needs: Needs | None = None
    """``needs(input, checkpoint)``: what of this process's environment a task needs
    (:mod:`kernel.environment`); None: nothing beyond its definition and the kernel."""
    no_restart: str | None = None
    """Why a task of this kind cannot start again from a phase it entered
    (:meth:`kernel.commit.Draft.restart` is refused, saying so); None: it can."""
    no_restart_ended: str | None = None
    """Why a task of this kind that has ended cannot start again from a phase (its end
    was answered where a restart would answer again); None: it can."""
    host: str | None = None
    """The framework whose code a task of this kind runs (``"langgraph"``), for what
    treats such tasks alike (the control plane starts a graph run in a thread); None:
    the kernel's own phases."""

    def __post_init__(self) -> None:
        if self.initial not in self.phases:
            raise ValueError(f"task {self.kind!r}: initial phase {self.initial!r} has no handler")
        for attribute in ("name", "value"):
            seen = [getattr(d, attribute) for d in self.decisions]
            if len(set(seen)) != len(seen):
                raise ValueError(f"task {self.kind!r}: two decisions share a {attribute}: {seen}")


@dataclass(frozen=True)
class Resolved:
    """A definition able to run a task, with the task's input and checkpoint migrated to it."""

    definition: TaskDefinition
    input: JSON
    checkpoint: JSON


@dataclass(frozen=True)
class Blocked:
    """Why a task cannot run with the definitions registered now."""

    reason: str


@dataclass
class Registry:
    _tasks: dict[str, dict[int, TaskDefinition]] = field(default_factory=dict)
    _documents: dict[str, DocumentKind] = field(default_factory=dict)
    tool_replay: dict[str, str] = field(default_factory=dict)
    """The replay policy (``safe`` / ``unsafe``) of each tool an agent registered here
    offers, by tool name: what a reader shows for a call whose task recorded none."""

    def __post_init__(self) -> None:
        self.document(BLOCKED_DOCUMENT)  # where workers report environments that differ

    # -- tasks -------------------------------------------------------------

    def add(self, definition: TaskDefinition) -> TaskDefinition:
        versions = self._tasks.setdefault(definition.kind, {})
        if definition.version in versions:
            raise ValueError(f"task {definition.kind!r} v{definition.version} already registered")
        versions[definition.version] = definition
        return definition

    def task(
        self, kind: str, *, version: int = 1, max_restarts: int = 3, queue: str = "default"
    ) -> Callable[[type], type]:
        """Register a class whose public methods are its phases (DESIGN §12).

        ``initial`` names the first phase; optional ``migrate(from_version, input,
        checkpoint)``, ``on_cancel(run)`` and ``on_end(run, finish)`` methods are picked up
        by name, and so is
        ``decisions``: the :class:`Decision` tuple an operator answers its signals with.
        """

        def register(cls: type) -> type:
            instance = cls()
            phases = {
                name: getattr(instance, name)
                for name, member in inspect.getmembers(cls, callable)
                if not name.startswith("_") and name not in RESERVED
            }
            self.add(
                TaskDefinition(
                    kind=kind,
                    version=version,
                    phases=phases,
                    initial=cls.initial,  # type: ignore[attr-defined]
                    migrate=getattr(instance, "migrate", None),
                    on_cancel=getattr(instance, "on_cancel", None),
                    on_end=getattr(instance, "on_end", None),
                    max_restarts=getattr(cls, "max_restarts", max_restarts),
                    queue=getattr(cls, "queue", queue),
                    decisions=tuple(getattr(cls, "decisions", ())),
                    needs=getattr(instance, "needs", None),
                    no_restart=getattr(cls, "no_restart", None),
                    no_restart_ended=getattr(cls, "no_restart_ended", None),
                )
            )
            return cls

        return register

    def latest(self, kind: str) -> TaskDefinition:
        versions = self._tasks.get(kind)
        if not versions:
            raise NotRegistered(f"no task definition for kind {kind!r}")
        return versions[max(versions)]

    def kinds(self) -> frozenset[str]:
        return frozenset(self._tasks)

    def hosted_by(self, host: str) -> list[str]:
        """The kinds whose newest definition runs ``host``'s code, sorted."""
        return sorted(kind for kind in self._tasks if self.latest(kind).host == host)

    def versions(self) -> frozenset[tuple[str, int]]:
        """The ``(kind, version)`` pairs registered: a task stored at one of them runs as
        stored (:meth:`resolve` needs no migration and cannot find it blocked)."""
        return frozenset((kind, v) for kind, versions in self._tasks.items() for v in versions)

    def resolve(self, task: Task) -> Resolved | Blocked:
        """The definition that runs ``task`` now, or why none can."""
        versions = self._tasks.get(task.kind)
        if not versions:
            return Blocked(f"no definition registered for task kind {task.kind!r}")
        if task.version in versions:
            return Resolved(versions[task.version], task.input, task.checkpoint)
        newest = versions[max(versions)]
        if task.version > newest.version:
            return Blocked(
                f"stored version {task.version} of {task.kind!r} is newer than the "
                f"registered version {newest.version}"
            )
        if newest.migrate is None:
            return Blocked(
                f"{task.kind!r} v{newest.version} cannot migrate stored version {task.version}"
            )
        try:
            new_input, new_checkpoint = newest.migrate(task.version, task.input, task.checkpoint)
        except Exception as exc:  # a failing migration blocks the task, it never kills it
            return Blocked(
                f"migrating {task.kind!r} from v{task.version} to v{newest.version} failed: "
                f"{type(exc).__name__}: {exc}"
            )
        return Resolved(newest, new_input, new_checkpoint)

    def decisions(self, task: Task) -> tuple[Decision, ...]:
        """The answers an operator may give ``task`` now: its definition's decisions while
        it waits on a signal, none otherwise (or while no definition can run it)."""
        if task.status != Status.WAITING or "signal" not in (task.wait or {}):
            return ()
        resolved = self.resolve(task)
        return () if isinstance(resolved, Blocked) else resolved.definition.decisions

    # -- documents ---------------------------------------------------------

    def document(
        self, name: str, *, version: int = 1, migrate: Migrate | None = None, initial: JSON = None,
        panel: str | None = None,
    ) -> DocumentKind:
        kind = DocumentKind(name=name, version=version, migrate=migrate, initial=initial,
                            panel=panel)
        self._documents[name] = kind
        return kind

    def document_kinds(self, panel: str) -> list[str]:
        """The names of the document kinds an application asked to be shown in ``panel``."""
        return sorted(name for name, kind in self._documents.items() if kind.panel == panel)

    def document_kind(self, name: str) -> DocumentKind:
        kind = self._documents.get(name)
        if kind is None:
            raise NotRegistered(f"no document kind {name!r} registered")
        return kind
