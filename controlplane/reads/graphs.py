"""A LangGraph thread as the session page shows it: the thread's checkpoints in order
(a timeline of the graph's super-steps, with the branches that forks started), the
interrupts that wait for a resume value, and the graph runs of the session.

A session is a thread when its index document exists (``kernel.hosts.langgraph.layout``):
the saver writes it with a thread's first checkpoint, an operator's start with the run
it names. Everything here reads documents and task records, never LangGraph itself.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Q

from controlplane import models
from controlplane.process.kernel import process_kernel
from controlplane.reads import sessions as session_reads
from controlplane.storage.schema import TASK
from kernel.errors import UnknownRecord
from kernel.hosts.langgraph.interrupts import interrupted, resume_schema
from kernel.hosts.langgraph.layout import (
    FORKS,
    HOST,
    INDEX,
    INDEX_KEY,
    NODE,
    STARTS,
    register_documents,
)
from kernel.records import Outcome, Task

JSON = Any
ENDED = frozenset(str(outcome) for outcome in Outcome)
"""The shown statuses of a run that has ended: every outcome (a faulted run too, which
nothing would end again: a terminal task cannot be cancelled)."""
ROOT = ""
"""The root namespace: the graph's own checkpoints (a subgraph's have a namespace)."""
CHECKPOINTS_SHOWN = 100
"""The page lists the thread's newest checkpoints: a long thread's older ones are counted."""
SUBGRAPHS_SHOWN = 20
"""The page lists the subgraph namespaces with the newest checkpoints: the rest are
counted (each call of a subgraph node writes a namespace of its own)."""
SUBGRAPH_TIMELINE = 10
"""Of each subgraph listed, the page shows the newest checkpoints on a timeline of its
own: the rest are counted (:func:`timeline` reads them all)."""


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint of the thread's root namespace."""

    id: str
    step: int | None
    source: str
    parent: str | None
    at: datetime | None
    branch: int
    """Which branch it is on: 0 the first run's, n the n-th fork's."""
    fork_of: str | None
    """The checkpoint a fork went on from, when this one starts a branch."""
    latest: bool
    """The thread's newest (what a run with no checkpoint id goes on from)."""
    ends_branch: bool
    """No checkpoint follows it."""

    @property
    def short(self) -> str:
        return self.id[-12:]


@dataclass(frozen=True)
class Subgraph:
    """The checkpoints a subgraph wrote in its namespace (``node:task id``, nested ones
    joined by ``|``)."""

    namespace: str
    checkpoints: int
    newest: Checkpoint
    timeline: list[Checkpoint]
    """Its newest :data:`SUBGRAPH_TIMELINE` checkpoints, oldest first, each on its branch."""

    @property
    def anchor(self) -> str:
        """An HTML id for the namespace (which may hold any character), the same while
        its checkpoints come: the page keeps an open timeline open by it."""
        return "subgraph-" + hashlib.sha256(self.namespace.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Interrupt:
    """A graph run waiting for a resume value at ``checkpoint_id``."""

    task_id: str
    kind: str
    checkpoint_id: str
    values: list[JSON]
    """Each interrupt's value, as the node gave it."""
    ids: list[str]
    """Each interrupt's id (in the order of ``values``): what a resume of several names."""
    schema: JSON
    """The JSON schema the resume value must meet, when a node declared one (with
    several interrupts: the object giving each its answer by id)."""
    refused: str | None = None
    """Why the node refused the last resume value it was given (its ``response_schema``
    validation), when it waits again for that reason."""

    @property
    def by_id(self) -> list[tuple[str, JSON]]:
        """Each interrupt's id with its value."""
        return list(zip(self.ids, self.values, strict=True))


@dataclass(frozen=True)
class Run:
    task_id: str
    kind: str
    shown_status: str
    fork_of: str | None
    """The checkpoint a forked run went on from."""


@dataclass(frozen=True)
class Thread:
    session_id: str
    checkpoints: list[Checkpoint]
    """The newest :data:`CHECKPOINTS_SHOWN`, oldest first."""
    total: int
    branches: int
    namespaces: int
    """Subgraph namespaces besides the root."""
    subgraphs: list[Subgraph]
    """The :data:`SUBGRAPHS_SHOWN` namespaces with the newest checkpoints, newest first."""
    interrupts: list[Interrupt]
    runs: list[Run]
    kind: str | None
    """The task kind a fork runs unless the operator names another (the thread's newest
    run's)."""
    graphs: list[str]
    """The graphs registered in this process: what an operator may start on the thread."""
    version: int
    """The version of the thread's index, which every checkpoint written, deleted or
    pruned and every run an operator starts or forks moves: what a start or a fork sends
    back, so that it is refused when the thread changed since it was shown."""

    @property
    def earlier(self) -> int:
        return self.total - len(self.checkpoints)

    @property
    def open_runs(self) -> list[Run]:
        """Runs not ended: a fork waits for them (each goes on from the thread's newest
        checkpoint, which a fork's run would move)."""
        return [r for r in self.runs if r.shown_status not in ENDED]


def versioned_index(session_id: str) -> tuple[dict[str, dict[str, JSON]], int]:
    """The thread's live checkpoints by namespace (the saver's index; empty when the
    session holds no thread) and the index's version."""
    found, version = _index(session_id)
    return found.get("namespaces", {}), version


def _index(session_id: str) -> tuple[dict[str, JSON], int]:
    """The thread's index document and its version (``{}`` and 0 when there is none)."""
    kernel = process_kernel()
    register_documents(kernel.registry)  # this process may host no graph itself
    found, version = kernel.versioned_document(session_id, INDEX, INDEX_KEY)
    return (found if isinstance(found, dict) else {}), version


def _moment(text: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(text) if isinstance(text, str) else None
    except ValueError:
        return None


def checkpoints(entries: dict[str, JSON]) -> list[Checkpoint]:
    """Every checkpoint of a namespace, oldest first (checkpoint ids sort by time), each
    on its branch: a checkpoint whose parent already has an earlier child starts one."""
    ordered = sorted(entries)
    latest = ordered[-1] if ordered else None
    parents = {entries[cid].get("parent") for cid in ordered}
    branch_of: dict[str, int] = {}
    has_child: set[str] = set()
    branches = 0
    found = []
    for cid in ordered:
        entry = entries[cid]
        parent = entry.get("parent")
        fork_of = None
        if parent in has_child:
            branches += 1
            branch = branches
            fork_of = parent
        else:
            branch = branch_of.get(parent, 0) if parent is not None else 0
        if parent is not None:
            has_child.add(parent)
        branch_of[cid] = branch
        metadata = entry.get("metadata") or {}
        step = metadata.get("step")
        found.append(Checkpoint(
            cid, step if isinstance(step, int) else None, str(metadata.get("source", "")),
            parent, _moment(entry.get("ts")), branch, fork_of, cid == latest,
            cid not in parents))
    return found


def subgraphs(namespaces: dict[str, dict[str, JSON]]) -> list[Subgraph]:
    """Each subgraph namespace that holds a checkpoint, the one with the newest first."""
    found = []
    for ns, entries in namespaces.items():
        if ns == ROOT or not entries:
            continue
        listed = checkpoints(entries)
        found.append(Subgraph(ns, len(entries), listed[-1], listed[-SUBGRAPH_TIMELINE:]))
    return sorted(found, key=lambda s: s.newest.id, reverse=True)


@dataclass(frozen=True)
class Timeline:
    """The checkpoints of one namespace of a thread, oldest first."""

    namespace: str
    total: int
    checkpoints: list[Checkpoint]
    """The newest of them (as many as asked for), oldest first."""


def timeline(session_id: str, namespace: str, limit: int) -> Timeline:
    """The newest ``limit`` checkpoints of one namespace of the thread (:data:`ROOT`: the
    graph's own; a subgraph's ``node:task id``), oldest first, each on its branch;
    :class:`UnknownRecord` (404) when the session holds no thread, or the thread no
    checkpoint in that namespace."""
    if not _holds_thread(session_id):
        required_thread(session_id)  # raises, saying which
    namespaces, _ = versioned_index(session_id)
    entries = namespaces.get(namespace)
    if not entries:
        raise UnknownRecord(f"the thread of session {session_id} holds no checkpoint in "
                            f"namespace {namespace!r}")
    listed = checkpoints(entries)
    return Timeline(namespace, len(listed), listed[-limit:])


def _interrupt(task: Task) -> Interrupt | None:
    waiting = interrupted(task)
    if waiting is None:
        return None
    values = [i.get("value") for i in waiting.get("interrupts", [])]
    ids = [str(i.get("id")) for i in waiting.get("interrupts", [])]
    return Interrupt(task.id, task.kind, waiting["checkpoint_id"], values, ids,
                     resume_schema(waiting), waiting.get("refused"))


def runs(session_id: str, index: dict[str, JSON] | None = None) -> list[Task]:
    """The session's graph runs (task records), oldest first: tasks of the kinds that
    have committed a checkpoint of the thread, were started as a fork of it, or are
    named in the thread's index (the run an operator last started or retried, before
    its first checkpoint)."""
    if index is None:
        index, _ = _index(session_id)
    named = [*index.get(FORKS, {}), *index.get(STARTS, {})]
    in_session = models.Task.objects.filter(session_id=session_id)
    kinds = set(in_session.filter(Q(checkpoint__has_key="langgraph") | Q(input__has_key="fork")
                                  | Q(id__in=named))
                .values_list("kind", flat=True).distinct())
    if not kinds:
        return []
    rows = in_session.filter(kind__in=kinds).order_by("created_seq", "id")
    return [TASK.record(values) for values in rows.values(*TASK.columns)]


def thread(session_id: str) -> Thread | None:
    """The session's thread, or None when the session holds no graph thread (no index:
    a run started other than by an operator shows once it has its first checkpoint)."""
    if not _holds_thread(session_id):
        return None
    index, version = _index(session_id)
    namespaces = index.get("namespaces", {})
    tasks = runs(session_id, index)
    listed = checkpoints(namespaces.get(ROOT, {}))
    shown = [Run(t.id, t.kind, t.shown_status,
                 ((t.input or {}).get("fork") or {}).get("checkpoint_id")
                 if isinstance(t.input, dict) else None) for t in tasks]
    waiting = [i for i in map(_interrupt, tasks) if i is not None]
    nested = subgraphs(namespaces)
    return Thread(
        session_id, listed[-CHECKPOINTS_SHOWN:], len(listed),
        1 + max((c.branch for c in listed), default=0),
        len(nested), nested[:SUBGRAPHS_SHOWN],
        waiting, shown, tasks[-1].kind if tasks else None,
        registered(), version,
    )


def registered() -> list[str]:
    """The graphs registered in this process: what an operator may start or fork."""
    return process_kernel().registry.hosted_by(HOST)


def nodes(kind: str) -> list[str]:
    """The nodes of graph ``kind`` registered here, by name (LangGraph's own left out):
    what its runs record they need of this process (:meth:`GraphHost.needs`), but its
    subgraphs' (``<subgraph>|<node>``), which write no state of the graph itself."""
    definition = process_kernel().registry.latest(kind)
    needs = definition.needs(None, None) if definition.needs is not None else {}
    return sorted(name.removeprefix(NODE) for name in needs
                  if name.startswith(NODE) and "|" not in name)


def required_thread(session_id: str) -> Thread:
    """The session's thread; :class:`UnknownRecord` (404) when there is no such session
    or it holds no graph thread."""
    found = thread(session_id)
    if found is None:
        session_reads.session(session_id)  # no such session: its own 404
        raise UnknownRecord(f"session {session_id} holds no graph thread (yet: start a "
                            "graph run on it)")
    return found


def _holds_thread(session_id: str) -> bool:
    """One indexed probe: what a session page pays for not being a thread."""
    return models.Document.objects.filter(session_id=session_id, kind=INDEX,
                                          key=INDEX_KEY).exists()


def changed(session_id: str, after: int) -> bool:
    """Whether the commits after ``after`` may have changed what :func:`thread` shows:
    the index, or, in a thread, a task of the session (a graph run's status, its wait)."""
    index = models.Document.objects.filter(session_id=session_id, kind=INDEX, key=INDEX_KEY)
    found = index.values_list("updated_seq", flat=True).first()
    return found is not None and (
        found > after
        or models.Task.objects.filter(session_id=session_id, updated_seq__gt=after).exists())
