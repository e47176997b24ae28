"""The differential state machine: one random program, three storages in lockstep.

Each step is one operation through the kernel's real API - a client's commit
(``SessionHandle.commit`` with a :class:`~kernel.Draft`), a worker's ``advance``,
``advance_queue`` or ``run_claimed``, a claim, renewal or release through the
``Storage`` protocol, the dispatcher's sweep - run in each world in turn:
the in-memory reference, Postgres with every fast path on, Postgres with them off
(:mod:`.worlds`). After each step the three must agree on the operation's outcome (its
value, or the type of the error it raised), on every record their storages hold, on what
their brokers were sent, on what the phases did, on the leases their workers hold and
on the faults still armed. A disagreement raises ``<What>Disagree`` (an
``AssertionError``; one class per kind of record, so that hypothesis tells them apart)
naming the step and what differs.

Beside the comparison, invariants that issue 30 asks of every storage
(``InvariantViolation``): no dispatch row outlives its task's end; a phase runs under a
lease its worker holds; a worker holds no lease once its operation has returned.

The tasks are of one kind whose input is a script (:func:`script`): each phase plays it
from its checkpoint (:meth:`.worlds.World.play`), so one program makes each world's
phases continue inline, end, spawn and join children (``all_settled``, ``fail_fast``),
wait on other tasks, on signals or for a time, append entries, write documents (values
above the artifact threshold too, read back in a later phase), commit an intent, take an
agent's steps (phases that each write an entry and a document and continue inline),
raise, and meddle while they run: cancel or signal a task (their own too: a cancel racing
the task's own ending), let their own lease run out and another worker take it, lose
their database connection, take long (a queue message's worker then commits the endings
it holds first), or wake a paused holder of a lease.

Families of steps can be left out, to look past a disagreement already known:
``PROPERTY_EXCLUDE`` is a comma-separated list of ``refused`` (values Postgres refuses),
``faults`` (the fault hook, reconnects), ``lose`` (connections lost in a phase),
``lapse`` (paused holders, leases that run out under them, stolen leases),
``trim`` (trims of a session's history, with a document emptied first), ``prune``
(prunes of the finished sessions a retention policy says are due, and the reads of
retained history compared after them) and ``invariants`` (only the comparison).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import timedelta
from typing import Any, ClassVar

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from kernel import Draft, Status, StorageUnavailable, Task
from kernel.dispatch import SweepReport
from kernel.records import SETTLED_SUBMISSIONS, Submission, SubmissionStatus, WriteSet
from kernel.retention import RetentionPolicy
from tests.unit.crashes import Crash

from .worlds import (
    DOCUMENT,
    KIND,
    LEASE,
    MONOTONIC,
    QUEUE,
    START,
    STATS,
    WORKERS,
    World,
    differences,
    empty_database,
    large_text,
    memory_world,
    postgres_world,
    retained,
    snapshot,
    write_large,
)

FAMILIES = frozenset({"refused", "faults", "lose", "lapse", "trim", "prune", "invariants"})
EXCLUDED = frozenset(
    f.strip() for f in os.environ.get("PROPERTY_EXCLUDE", "").split(",") if f.strip()
)
if EXCLUDED - FAMILIES:
    raise ValueError(f"PROPERTY_EXCLUDE: no family {sorted(EXCLUDED - FAMILIES)}; "
                     f"families: {sorted(FAMILIES)}")


def enabled(family: str) -> bool:
    return family not in EXCLUDED


# -- scripts -----------------------------------------------------------------------------------

REFUSED_KINDS = ("nul", "surrogate", "nan", "datetime")
BAD = st.sampled_from((None,) * 12 + REFUSED_KINDS)
"""Mostly an ordinary value; sometimes one Postgres refuses (:func:`.worlds.refused_value`)."""
MEDDLES = ("cancel", "cancel", "signal", "expire", "steal", "lose", "slow", "resume")
INDEX = st.integers(min_value=0, max_value=1000)

POLICIES = (
    RetentionPolicy(days=0),
    RetentionPolicy(days=60 / 86400),
    RetentionPolicy(by_status={"failed": 0, "faulted": 0, "cancelled": 0}),
    RetentionPolicy(days=0, by_status={"succeeded": None}),
)
"""Retention policies in the machine's time: due once the clock has passed the last
commit (or 60 seconds after it); by status; everything but succeeded sessions."""


def _plain_step() -> st.SearchStrategy[dict[str, Any]]:
    return st.builds(
        lambda op, bad: {"op": op, "bad": bad},
        st.sampled_from(("next", "next", "next", "intent", "succeed", "succeed", "fail",
                         "raise", "append", "doc", "large_append", "large_doc")),
        BAD,
    )


def step(depth: int) -> st.SearchStrategy[dict[str, Any]]:
    """One step of a script. ``target``/``ids`` are indexes into the session's tasks at
    creation (:meth:`Differential.resolve` makes them ids; a target of None is the task
    itself)."""
    options = [
        _plain_step(),
        st.builds(lambda s: {"op": "sleep", "s": s}, st.sampled_from((5, 60))),
        st.builds(lambda n, bad: {"op": "steps", "n": n, "bad": bad},
                  st.integers(min_value=2, max_value=3), BAD),
        st.just({"op": "signal"}),
        st.builds(lambda what, target: {"op": "meddle", "what": what, "target": target},
                  st.sampled_from(MEDDLES), st.one_of(st.none(), INDEX)),
        st.builds(lambda ids: {"op": "wait_on", "ids": ids},
                  st.lists(INDEX, min_size=1, max_size=2)),
    ]
    if depth == 0:
        options.append(st.builds(
            lambda children, wait: {"op": "spawn", "children": children, "wait": wait},
            st.lists(script(depth + 1), min_size=1, max_size=3),
            st.sampled_from((None, "all_settled", "all_settled", "fail_fast")),
        ))
    return st.one_of(options)


def script(depth: int = 0) -> st.SearchStrategy[list[dict[str, Any]]]:
    """A task's program; its end succeeds. A third are empty: tasks that end in their
    first phase, the quick endings a queue message's worker holds back and commits together."""
    steps = st.lists(step(depth), min_size=1, max_size=4)
    return st.one_of(st.just([]), steps, steps)


# -- outcomes ------------------------------------------------------------------------------------


def normal(value: Any) -> Any:
    """An operation's return value, as the worlds must agree on it."""
    if isinstance(value, WriteSet):
        return ("commit", value.commit.seq, [t.id for t in value.new_tasks])
    if isinstance(value, Task):
        return ("task", value.id, value.epoch, str(value.status))
    if isinstance(value, Submission):
        return ("submission", value.id, str(value.status))
    if isinstance(value, SweepReport):
        return ("sweep", value.delivered, value.failed)
    if isinstance(value, list | tuple):
        return [normal(v) for v in value]
    return value


class Disagreement(AssertionError):
    """A world disagrees with the reference."""


class InvariantViolation(AssertionError):
    """A world breaks a rule every storage must keep."""


_KINDS: dict[str, type[Disagreement]] = {}


def disagreement(what: str) -> type[Disagreement]:
    """One class per kind of record (``TasksDisagree``, ``OutcomeDisagree``...)."""
    name = "".join(w.capitalize() for w in what.split()) + "Disagree"
    if name not in _KINDS:
        _KINDS[name] = type(name, (Disagreement,), {"__module__": __name__})
    return _KINDS[name]


class Differential(RuleBasedStateMachine):
    aliases: ClassVar[tuple[str, str]] = ("default", "property_general")
    """The databases of the fast-path world and of the general one (set by the test)."""

    def __init__(self) -> None:
        super().__init__()
        from kernel import ManualClock

        fast, general = self.aliases
        empty_database(fast)
        empty_database(general)
        MONOTONIC.now = 0.0
        self.clock = ManualClock(START)
        self.worlds = [
            memory_world(self.clock),
            postgres_world("postgres-fast", self.clock, fast, fast_paths=True),
            postgres_world("postgres-general", self.clock, general, fast_paths=False),
        ]
        for world in self.worlds:
            world.refused = enabled("refused")
            world.lapse = enabled("lapse")
        self.reference = self.worlds[0]
        self.sessions: list[tuple[str, str]] = []  # (session id, its conversation)
        self.steps = 0
        STATS["examples"] += 1

    def teardown(self) -> None:
        for world in self.worlds:
            world.close()

    # -- running a step in each world ------------------------------------------------------

    def each(self, label: str, op: Callable[[World], Any], *, worker: str | None = None,
             lose: bool = False) -> Any:
        """Run ``op`` in each world, compare, and return the reference's value."""
        self.steps += 1
        STATS["steps"] += 1
        values: list[Any] = []
        outcomes: list[tuple[Any, ...]] = []
        for world in self.worlds:
            with world.active(lose=lose and enabled("lose")):
                try:
                    value = op(world)
                    values.append(value)
                    outcomes.append(("ok", normal(value)))
                except Crash:
                    values.append(None)
                    outcomes.append(("crash",))
                    if worker is not None:
                        world.restart(worker)  # the process died: nothing it held survives
                except Exception as exc:
                    values.append(None)
                    outcomes.append(("error", type(exc).__name__))
        self.compare(label, outcomes)
        return values[0]

    def compare(self, label: str, outcomes: list[Any]) -> None:
        where = f"step {self.steps} ({label})"
        reference = self.reference
        for outcome in outcomes[1:]:
            if outcome != outcomes[0]:
                STATS["disagreements"] += 1
                raise disagreement("outcome")(
                    f"{where}: outcomes differ: " + ", ".join(
                        f"{w.name} {o}" for w, o in zip(self.worlds, outcomes, strict=True)))
        shots = [snapshot(w) for w in self.worlds]
        for world, shot in zip(self.worlds[1:], shots[1:], strict=True):
            found = differences(shots[0], shot)
            if found:
                STATS["disagreements"] += 1
                what, lines = next(iter(found.items()))
                detail = "\n".join(f"  [{k}] {line}" for k, ls in found.items() for line in ls)
                raise disagreement(what)(
                    f"{where}: {world.name} disagrees with {reference.name} on {what}:\n"
                    f"{detail}")
        for what, view in (
            ("broker", lambda w: w.broker.log),
            ("effects", lambda w: w.effects),
            ("workers", lambda w: {i: sorted((t, lease.task.epoch) for t, lease in
                                             wk.held.items()) for i, wk in w.workers.items()}),
            ("paused", lambda w: [(i, t.id, t.epoch) for i, t in w.paused]),
            ("faults", lambda w: sorted(w.faults.armed)),
        ):
            mine = view(reference)
            for world in self.worlds[1:]:
                theirs = view(world)
                if theirs != mine:
                    STATS["disagreements"] += 1
                    raise disagreement(what)(
                        f"{where}: {world.name} disagrees with {reference.name} on {what}:\n"
                        f"  reference {_tail(mine)}\n  {world.name} {_tail(theirs)}")
        if enabled("invariants"):
            for world, shot in zip(self.worlds, shots, strict=True):
                broken = _broken(world, shot)
                if broken:
                    STATS["invariant violations"] += 1
                    raise InvariantViolation(f"{where}: {world.name}: " + "; ".join(broken))

    # -- what the reference holds, to choose from ---------------------------------------------

    def tasks(self, session: str | None = None) -> list[Task]:
        memory = self.reference.memory
        assert memory is not None
        if session is None:
            return list(memory._tasks.values())
        return [memory._tasks[i] for i in memory._session_tasks.get(session, [])]

    def task_at(self, index: int, want: Callable[[Task], bool] | None = None,
                session: str | None = None) -> Task:
        found = self.tasks(session)
        preferred = [t for t in found if want(t)] if want is not None else []
        pool = preferred or found
        return pool[index % len(pool)]

    def session_at(self, index: int) -> tuple[str, str]:
        return self.sessions[index % len(self.sessions)]

    def resolve(self, program: list[dict[str, Any]], session: str) -> list[dict[str, Any]]:
        """A script's indexes made the ids of the session's tasks (see :func:`step`)."""
        ids = [t.id for t in self.tasks(session)]

        def fix(s: dict[str, Any]) -> dict[str, Any]:
            s = dict(s)
            if s["op"] == "meddle":
                target = s.get("target")
                s["target"] = ids[target % len(ids)] if target is not None and ids else None
            if s["op"] == "wait_on":
                if not ids:
                    return {"op": "next", "bad": None}
                s["ids"] = list(dict.fromkeys(ids[i % len(ids)] for i in s["ids"]))
            if s["op"] == "spawn":
                s["children"] = [[fix(c) for c in child] for child in s["children"]]
            return s

        return [fix(s) for s in program]

    def signal_name(self, task: Task) -> str:
        return (task.wait or {}).get("signal", "s0")

    def now_and_until(self) -> tuple[Any, Any]:
        now = self.clock.now()
        return now, now + timedelta(seconds=LEASE)

    # -- rules: sessions and clients --------------------------------------------------------

    def _new_session(self, retention_days: float | None = None) -> None:
        metadata = None if retention_days is None else {"retention_days": retention_days}

        def op(world: World) -> tuple[str, str]:
            handle = world.kernel.create_session(metadata=metadata)
            draft = Draft(actor="user:client")
            conversation = draft.create_conversation()
            handle.commit(draft)
            return handle.id, conversation

        made = self.each("new session", op)
        if made is not None:
            self.sessions.append(made)

    @initialize()
    def start(self) -> None:
        self._new_session()

    @precondition(lambda self: len(self.sessions) < 3)
    @rule()
    def new_session(self) -> None:
        self._new_session()

    @precondition(lambda self: bool(self.sessions))
    @rule(session=INDEX, programs=st.lists(script(), min_size=1, max_size=4), bad=BAD,
          key=st.sampled_from((None,) * 5 + ("k1", "k2")), cancel_writes=st.booleans())
    def create(self, session: int, programs: list[Any], bad: str | None, key: str | None,
               cancel_writes: bool) -> None:
        """A client's commit that only creates tasks (several: a burst of burst rows)."""
        session_id, conversation = self.session_at(session)
        resolved = [self.resolve(p, session_id) for p in programs]

        def op(world: World) -> WriteSet:
            draft = Draft(actor="user:client", key=key)
            for program in resolved:
                draft.create_task(KIND, {"script": program, "conv": conversation,
                                         "cancel_writes": cancel_writes,
                                         "note": world.value(bad, "input")})
            return world.kernel.open(session_id).commit(draft)

        self.each("create", op)

    @precondition(lambda self: bool(self.sessions))
    @rule(session=INDEX, request=st.sampled_from(("r1", "r2", "r3")), bad=BAD)
    def submit(self, session: int, request: str, bad: str | None) -> None:
        session_id, conversation = self.session_at(session)
        self.each("submit", lambda w: w.kernel.open(session_id).submit(
            conversation, request, {"text": w.value(bad, "hello")}))

    def _client(self, label: str, session_id: str, fill: Callable[[World, Draft], None],
                key: str | None = None) -> None:
        def op(world: World) -> WriteSet:
            draft = Draft(actor="user:op", key=key)
            fill(world, draft)
            return world.kernel.open(session_id).commit(draft)

        self.each(label, op)

    @rule(session=INDEX, shape=st.sampled_from(("field", "whole", "inside", "append")),
          bad=BAD)
    def large(self, session: int, shape: str, bad: str | None) -> None:
        """A client's commit of a value above the artifact threshold (an entry payload or
        a field of one, a document value, a key inside one stored apart before, an append
        of one), then every large value of the session read back, stand-ins opened: what
        each world reads is compared, and must be what was written."""
        session_id, conversation = self.session_at(session)
        tag = f"l{self.steps}"

        def op(world: World) -> Any:
            keys = sorted(world.kernel.document(session_id, DOCUMENT, "large"))
            draft = Draft(actor="user:op")
            if shape == "append":
                draft.update_document(DOCUMENT, "large", {
                    "op": "append", "path": ["log"], "value": large_text(tag)})
            else:
                write_large(draft, conversation, tag, shape, world.value(bad, tag), keys)
            world.kernel.open(session_id).commit(draft)
            document = world.kernel.document(session_id, DOCUMENT, "large")
            return world.read_large(world.kernel.entries(conversation), document), document

        self.each("large", op)

    @precondition(lambda self: bool(self.tasks()))
    @rule(task=INDEX, logged=st.booleans())
    def cancel(self, task: int, logged: bool) -> None:
        target = self.task_at(task, lambda t: not t.terminal)

        def fill(world: World, draft: Draft) -> None:
            draft.cancel(target.id, "operator stop")
            if logged:
                draft.record_operation("cancel", {"task": target.id, "reason": "stop"})

        self._client("cancel", target.session_id, fill)

    @precondition(lambda self: bool(self.tasks()))
    @rule(task=INDEX, bad=BAD)
    def signal(self, task: int, bad: str | None) -> None:
        target = self.task_at(task, lambda t: t.status is Status.WAITING)
        name = self.signal_name(target)
        self._client("signal", target.session_id, lambda w, d: d.signal(
            target.id, name, {"v": w.value(bad, "payload")}))

    @precondition(lambda self: bool(self.tasks()))
    @rule(task=INDEX, stale=st.booleans())
    def resolve_step(self, task: int, stale: bool) -> None:
        """A signal with the epoch of the step it answers (an operator's resolution)."""
        target = self.task_at(task, lambda t: "signal" in (t.wait or {}))
        name, epoch = self.signal_name(target), target.epoch - (1 if stale else 0)
        self._client("resolve", target.session_id, lambda w, d: d.signal(
            target.id, name, {"decision": "go"}, step_epoch=epoch))

    @precondition(lambda self: bool(self.tasks()))
    @rule(task=INDEX, seen=st.sampled_from((None, "right", "stale")))
    def retry(self, task: int, seen: str | None) -> None:
        """An operator's retry, expecting the task as they saw it (its ``updated_seq``,
        or one before: retried and failed again since) or not."""
        target = self.task_at(task, lambda t: (t.outcome or {}).get("kind") in
                              ("failed", "faulted"))
        expected = None if seen is None else target.updated_seq - (seen == "stale")
        self._client("retry", target.session_id,
                     lambda w, d: d.retry(target.id, expected_seq=expected))
        STATS[f"retry: {seen or 'unexpected'}"] += 1

    @precondition(lambda self: bool(self.tasks()))
    @rule(task=INDEX)
    def wake(self, task: int) -> None:
        target = self.task_at(task, lambda t: t.status is Status.SLEEPING)
        self._client("wake", target.session_id, lambda w, d: d.wake(target.id))

    @precondition(lambda self: bool(self.tasks()))
    @rule(session=INDEX, actions=st.lists(
        st.tuples(st.sampled_from(("cancel", "retry", "signal", "wake", "create")), INDEX),
        min_size=2, max_size=5), key=st.sampled_from((None, None, "bulk-1")))
    def bulk(self, session: int, actions: list[tuple[str, int]], key: str | None) -> None:
        """An operator's bulk action: one commit acting on several tasks."""
        session_id, conversation = self.session_at(session)
        if not self.tasks(session_id):
            session_id = self.tasks()[0].session_id
        targets = [(kind, self.task_at(i, session=session_id)) for kind, i in actions]

        def fill(world: World, draft: Draft) -> None:
            for kind, target in targets:
                if kind == "cancel":
                    draft.cancel(target.id, "bulk")
                elif kind == "retry":
                    draft.retry(target.id)
                elif kind == "signal":
                    draft.signal(target.id, self.signal_name(target), {"bulk": True})
                elif kind == "wake":
                    draft.wake(target.id)
                else:
                    draft.create_task(KIND, {"script": [], "conv": target.input.get("conv")})
            draft.record_operation("bulk", {"count": len(targets)})

        self._client("bulk", session_id, fill, key)

    # -- rules: workers -------------------------------------------------------------------------

    @precondition(lambda self: bool(self.tasks()))
    @rule(worker=st.sampled_from(WORKERS), task=INDEX)
    def advance(self, worker: str, task: int) -> None:
        now = self.clock.now()
        target = self.task_at(task, lambda t: t.runnable_at(now))
        self.each("advance", lambda w: w.workers[worker].advance(target.id), worker=worker,
                  lose=True)

    @precondition(lambda self: bool(self.tasks()))
    @rule(worker=st.sampled_from(WORKERS), most=st.integers(min_value=2, max_value=6))
    def work(self, worker: str, most: int) -> None:
        """A worker advances the tasks runnable now, one after another (messages that
        arrive in a row): most steps of a program should run phases."""
        now = self.clock.now()
        ready = [t.id for t in self.tasks() if t.runnable_at(now)][:most]

        def op(world: World) -> list[bool]:
            return [world.workers[worker].advance(task_id) for task_id in ready]

        self.each("work", op, worker=worker, lose=True)

    @rule(worker=st.sampled_from(WORKERS), batch=st.sampled_from((1, 2, 3, 10)))
    def run_queue(self, worker: str, batch: int) -> None:
        """A queue message's worker: claims the tasks of burst rows, holds their endings back."""
        self.each("run queue", lambda w: w.workers[worker].advance_queue(
            QUEUE, batch=batch, budget=1e9), worker=worker)

    @precondition(lambda self: enabled("lapse") and bool(self.tasks()))
    @rule(worker=st.sampled_from(WORKERS), task=INDEX,
          how=st.sampled_from(("claim", "claim", "burst", "batch")),
          then=st.sampled_from(("pause", "pause", "pause", "blocked", 1, 7)))
    def claim(self, worker: str, task: int, how: str, then: str | int) -> None:
        """A worker claims and pauses before its phase (a stopped VM, SIGSTOP); or finds
        what it claimed blocked here and gives it back as a worker does
        (``Worker._hold``): released, its rows marked blocked and counted as delivered
        now ``then`` times (``"blocked"``: marked only, as ``Worker.advance`` marks the
        rows of a task it did not claim)."""
        now, until = self.now_and_until()
        target = self.task_at(task, lambda t: t.runnable_at(now))

        def op(world: World) -> Any:
            storage = world.storage
            if how == "claim":
                claimed = [storage.claim(target.id, worker, now, until)]
            elif how == "burst":
                claimed = [storage.claim_burst(QUEUE, worker, now, until)]
            else:  # every runnable one: the order of a batch is the storage's own
                claimed = sorted(storage.claim_batch(worker, now, until, 1000, [KIND]),
                                 key=lambda t: t.id)
            held = [t for t in claimed if t is not None]
            if then == "pause":
                world.paused.extend((worker, t) for t in held)
                return claimed
            released = []
            for t in held:
                released.append(storage.release(t.id, worker, t.epoch, now))
                if isinstance(then, int):
                    storage.block_dispatches(t.id, delivered_at=now, attempts=then)
                else:
                    storage.block_dispatches(t.id)
            return claimed, released

        self.each(f"claim ({how}, then {then})", op)
        if then != "pause":
            STATS[f"given back blocked: {then}"] += 1

    @precondition(lambda self: bool(self.reference.paused))
    @rule(slot=INDEX)
    def resume(self, slot: int) -> None:
        """A paused holder wakes up and runs its phase, however long it was away."""
        index = slot % len(self.reference.paused)
        worker = self.reference.paused[index][0]

        def op(world: World) -> None:
            owner, claimed = world.paused.pop(index)
            world.workers[owner].run_claimed(claimed)

        self.each("resume", op, worker=worker, lose=True)

    @precondition(lambda self: bool(self.reference.paused))
    @rule(slot=INDEX)
    def renew(self, slot: int) -> None:
        index = slot % len(self.reference.paused)
        _, until = self.now_and_until()

        def op(world: World) -> bool:
            owner, claimed = world.paused[index]
            return bool(world.storage.renew(claimed.id, owner, claimed.epoch, until))

        self.each("renew", op)

    @precondition(lambda self: bool(self.reference.paused))
    @rule(slot=INDEX, interrupted=st.booleans())
    def release(self, slot: int, interrupted: bool) -> None:
        index = slot % len(self.reference.paused)
        now = self.clock.now()

        def op(world: World) -> Task | None:
            owner, claimed = world.paused.pop(index)
            return world.storage.release(claimed.id, owner, claimed.epoch, now,
                                         interrupted=interrupted)

        self.each("release", op)

    @precondition(lambda self: bool(self.sessions))
    @rule(session=INDEX, writes=st.lists(st.tuples(
        st.sampled_from(("d0", "d1", "d2")),
        st.sampled_from(("set", "set", "incr", "append", "remove", "replace", "big",
                         "setdefault")), BAD),
        min_size=1, max_size=4),
        odd=st.sampled_from((None,) * 8 + ("expected", "stale", "unregistered", "nul key")),
        read=st.sampled_from((None, "right", "stale")),
        lose=st.sampled_from((False,) * 5 + (True,)))
    def documents(self, session: int, writes: list[tuple[str, str, str | None]],
                  odd: str | None, read: str | None, lose: bool) -> None:
        """A client's commit that only writes documents (``CommitKind.DOCUMENTS_ONLY``):
        ops of every kind, whole values, ops large enough that a baseline comes due
        (refused by the one statement, written by the general commit), values Postgres
        refuses, a version expected (the general kind) of a document written or only read
        (``Draft.expect_document``: right, or stale, the one the documents-only statement
        would guess, never written, among them), a kind not registered, a key with NUL, and
        the connection lost just before it is sent."""
        session_id, _ = self.session_at(session)
        memory = self.reference.memory
        assert memory is not None
        first = (DOCUMENT, writes[0][0])
        head = memory._heads.get((session_id, *first))
        expected = (head.version if head is not None else 0) + (odd == "stale")
        written = {key for key, _, _ in writes}
        unwritten = next((k for k in ("d0", "d1", "d2") if k not in written), "d3")
        head_read = memory._heads.get((session_id, DOCUMENT, unwritten))
        read_version = head_read.version if head_read is not None else 0
        if read == "stale":
            read_version = 0 if read_version else 1

        def op(world: World) -> WriteSet:
            draft = Draft(actor="user:client")
            for key, what, bad in writes:
                value = world.value(bad, f"{what}@{self.steps}")
                if what == "set":
                    draft.set(DOCUMENT, key, ["v", str(len(draft.document_ops))], value)
                elif what == "incr":
                    draft.update_document(DOCUMENT, key, {"op": "incr", "path": ["n"],
                                                          "value": 1})
                elif what == "append":
                    draft.update_document(DOCUMENT, key, {"op": "append", "path": ["log"],
                                                          "value": value})
                elif what == "remove":
                    draft.update_document(DOCUMENT, key, {"op": "remove", "path": ["v"]})
                elif what == "setdefault":
                    draft.update_document(DOCUMENT, key, {"op": "setdefault", "path": ["first"],
                                                          "value": value})
                elif what == "replace":
                    draft.set(DOCUMENT, key, [], {"whole": value})
                else:
                    draft.set(DOCUMENT, key, ["big"], "x" * 1500)
            if odd in ("expected", "stale"):
                draft.expected_versions[first] = expected
            if read is not None:
                draft.expect_document(DOCUMENT, unwritten, read_version)
            elif odd == "unregistered":
                draft.set("unregistered", "u", ["v"], 1)
            elif odd == "nul key" and world.refused:
                draft.set(DOCUMENT, "bad \u0000 key", ["v"], 1)
            handle = world.kernel.open(session_id)
            if lose and enabled("lose"):
                world.lose_connection()
            return handle.commit(draft)

        self.each("documents", op)
        lost = lose and enabled("lose")
        STATS[f"documents: {odd or 'plain'}{' (lost connection)' if lost else ''}"] += 1
        if read is not None:
            STATS[f"documents: one only read, {read}"] += 1

    @precondition(lambda self: bool(self.sessions) and enabled("trim"))
    @rule(session=INDEX, back=st.integers(min_value=0, max_value=4), empty=st.booleans())
    def trim(self, session: int, back: int, empty: bool) -> None:
        """A live session's history is trimmed up to a few commits before its head
        (kernel.retention), after a client's commit that writes a document and empties
        it (``empty``): its keyed commits are still refused after it, and its tasks go on
        from what is left."""
        session_id, _ = self.session_at(session)
        emptied = f"emptied-{self.steps}"

        def op(world: World) -> Any:
            if empty:
                draft = Draft(actor="user:client")
                draft.set(DOCUMENT, emptied, ["v"], 1)
                draft.set(DOCUMENT, emptied, [], {})
                world.kernel.open(session_id).commit(draft)
            head = world.kernel.storage.session(session_id)
            assert head is not None
            return world.kernel.trim(session_id, head.head_seq - back, forget=[DOCUMENT])

        self.each("trim", op)

    # -- rules: time, sweeps, faults -----------------------------------------------------------

    @rule(seconds=st.sampled_from((1, 5, 20, 31, 31, 61, 301, -1, -5)))
    def clock_step(self, seconds: int) -> None:
        """The shared clock moves (backwards too: a clock that is stepped)."""
        self.clock.advance(seconds)
        STATS["steps"] += 1
        self.steps += 1

    @rule()
    def sweep(self) -> None:
        """Beat's sweep: expired leases get rows, due rows are delivered (bursts woken)."""
        self.each("sweep", lambda w: w.dispatcher.sweep())

    @precondition(lambda self: enabled("faults"))
    @rule(point=st.sampled_from(("before_write", "after_write", "after_commit")),
          error=st.sampled_from(("unavailable", "crash")))
    def fault(self, point: str, error: str) -> None:
        """The next commit to reach ``point`` fails there: a lost connection, or the
        process dying (``Crash``)."""
        for world in self.worlds:
            world.faults.armed[point] = (
                StorageUnavailable("connection lost (injected)") if error == "unavailable"
                else Crash())
        STATS["steps"] += 1
        self.steps += 1

    @precondition(lambda self: enabled("faults"))
    @rule()
    def reconnect(self) -> None:
        """Postgres connections are closed between operations (each reconnects)."""
        def op(world: World) -> None:
            if world.alias is not None:
                from django.db import connections

                connections[world.alias].close()

        self.each("reconnect", op)


    # Weights: hypothesis picks evenly among the rules an example enables; the steps
    # that make and run work come up more often under a second name (each is one rule
    # to the feature flags of an example, and printed under its own name).
    create_more = create
    work_more = work
    work_again = work
    run_queue_more = run_queue
    claim_more = claim


class Operators(Differential):
    """The differential machine with operators' actions that name what the operator saw
    (a cancel the task's run, a wake its seq, a resubmission its original's seq, a
    compaction the conversation's newest entry), now and then stale: the commit checks it
    under the session's lock, and every storage refuses the same ones. A machine of its
    own, so that the programs :class:`Differential` generates from a fixed seed (the fast
    paths' test) stay what they were."""

    @precondition(lambda self: bool(self.tasks()))
    @rule(task=INDEX, stale=st.booleans())
    def cancel_seen(self, task: int, stale: bool) -> None:
        target = self.task_at(task, lambda t: not t.terminal)
        run = target.run + (1 if stale else 0)
        self._client("cancel seen", target.session_id, lambda w, d: d.cancel(
            target.id, "operator stop", expected_run=run))

    @precondition(lambda self: bool(self.tasks()))
    @rule(task=INDEX, stale=st.booleans())
    def wake_seen(self, task: int, stale: bool) -> None:
        target = self.task_at(task, lambda t: t.status is Status.SLEEPING)
        seq = target.updated_seq - (1 if stale else 0)
        self._client("wake seen", target.session_id, lambda w, d: d.wake(
            target.id, expected_seq=seq))

    @precondition(lambda self: bool(self.sessions))
    @rule(session=INDEX, seen=st.sampled_from(("right", "right", "stale")),
          shape=st.sampled_from(("append", "create", "documents")))
    def compact_seen(self, session: int, seen: str, shape: str) -> None:
        """An operator's commit naming the newest entry of the conversation they saw
        (``Draft.expect_newest_entry``), right or stale (one before it, or none), beside
        an entry, a task or a document write, each of which alone a storage would commit
        a shorter way: every storage refuses the same ones."""
        session_id, conversation = self.session_at(session)
        memory = self.reference.memory
        assert memory is not None
        entries = memory.conversation_entries(conversation)
        newest = entries[-1].id if entries else None
        if seen == "stale":
            newest = entries[-2].id if len(entries) > 1 else (None if entries else "entry_x")

        def fill(world: World, draft: Draft) -> None:
            draft.expect_newest_entry(conversation, newest)
            if shape == "append":
                draft.append(conversation, "note", {"seen": newest})
            elif shape == "create":
                draft.create_task(KIND, {"script": [], "conv": conversation})
            else:
                draft.set(DOCUMENT, "d0", ["seen"], newest)

        self._client("compact seen", session_id, fill)
        STATS[f"newest entry expected: {seen}"] += 1

    def submissions(self) -> list[Submission]:
        memory = self.reference.memory
        assert memory is not None
        return list(memory._submissions.values())

    @precondition(lambda self: bool(self.submissions()))
    @rule(submission=INDEX, stale=st.booleans())
    def resubmit(self, submission: int, stale: bool) -> None:
        found = self.submissions()
        original = found[submission % len(found)]
        seq, again = original.updated_seq - (1 if stale else 0), f"again-{self.steps}"

        def fill(world: World, draft: Draft) -> None:
            draft.submit(original.conversation_id, again, original.input,
                         resubmit_of=original.id, expected_seq=seq)

        self._client("resubmit", original.session_id, fill)


class Pruning(Operators):
    """The differential machine with retention's prune between its other steps (the
    family ``prune``): sessions with a retention of their own, submissions settled (so
    that sessions with them finish), prunes, and the reads of what is retained compared.
    A machine of its own, so that the programs :class:`Differential` generates from a
    fixed seed (the fast paths' test) stay what they were."""

    @precondition(lambda self: len(self.sessions) < 3 and enabled("prune"))
    @rule(retention_days=st.sampled_from((0, 1)))
    def new_kept_session(self, retention_days: float) -> None:
        """A session with its own retention (``metadata["retention_days"]``)."""
        self._new_session(retention_days)

    @precondition(lambda self: enabled("prune") and bool(self.sessions))
    @rule(session=INDEX, request=st.sampled_from(("r1", "r2", "r3")),
          status=st.sampled_from(sorted(SETTLED_SUBMISSIONS)), answered=st.booleans())
    def settle(self, session: int, request: str, status: SubmissionStatus,
               answered: bool) -> None:
        """A turn settles a submission (its answer an entry of the same commit, or
        none), so that a session with submissions can be finished and pruned."""
        session_id, conversation = self.session_at(session)
        memory = self.reference.memory
        assert memory is not None
        found = memory.submission_by_request(session_id, request)
        if found is None:
            return

        def op(world: World) -> WriteSet:
            draft = Draft(actor="agent:turn")
            answer = draft.append(conversation, "answer", {"to": request}) if answered else None
            draft.update_submission(found.id, status, answer_entry_id=answer,
                                    unless_settled=True)
            return world.kernel.open(session_id).commit(draft)

        self.each("settle", op)

    @precondition(lambda self: bool(self.sessions) and enabled("prune"))
    @rule(policy=st.sampled_from(POLICIES), dry_run=st.sampled_from((False, False, True)),
          later=st.sampled_from((0, 0, 400)))
    def prune(self, policy: RetentionPolicy, dry_run: bool, later: int) -> None:
        """Retention's prune (kernel.retention) at the clock's now, or ``later`` days
        on, when Postgres can drop the partition of the clock's month whole
        (:func:`.worlds.empty_database`): the finished sessions the policy says are due
        lose their history. Then what each world reads of every session is compared
        (:func:`.worlds.retained`); later steps go on in pruned sessions: new commits,
        a submission's request id and a commit's key repeated."""
        def op(world: World) -> Any:
            now = self.clock.now() + timedelta(days=later)
            report = world.storage.prune(policy, now, dry_run=dry_run)
            if not dry_run:
                STATS[f"{world.name}:pruned sessions"] += report.sessions
                STATS[f"{world.name}:partitions dropped"] += len(report.partitions)
            counts = (report.sessions, report.commits + report.partition_commits,
                      report.entries, report.document_versions, report.skipped)
            return counts, retained(world, self.sessions)

        self.each(f"prune{' (dry run)' if dry_run else ''}, {later} days on", op)

    @precondition(lambda self: bool(self.sessions) and enabled("prune") and enabled("trim"))
    @rule(session=INDEX, policy=st.sampled_from(POLICIES), later=st.sampled_from((0, 400)))
    def trim_to_head_then_prune(self, session: int, policy: RetentionPolicy,
                                later: int) -> None:
        """A session trimmed up to its head (its head commit goes; its keyed commits
        and entries stay), then retention's prune at the clock's now or ``later`` days
        on: a finished session is still dated (``last_commit_at``) and pruned when due."""
        session_id, _ = self.session_at(session)

        def op(world: World) -> Any:
            head = world.kernel.storage.session(session_id)
            assert head is not None
            trimmed = world.kernel.trim(session_id, head.head_seq)
            report = world.storage.prune(policy, self.clock.now() + timedelta(days=later))
            STATS[f"{world.name}:pruned sessions after a trim to the head"] += report.sessions
            counts = (trimmed.commits, report.sessions,
                      report.commits + report.partition_commits, report.entries,
                      report.document_versions, report.skipped)
            return counts, retained(world, self.sessions)

        self.each(f"trim to the head, then prune {later} days on", op)

    @precondition(lambda self: bool(self.sessions) and enabled("prune"))
    @rule()
    def read_retained(self) -> None:
        """What each world reads of every session (:func:`.worlds.retained`), at any
        time: after the commits that follow a prune or a trim too."""
        self.each("read", lambda w: retained(w, self.sessions))

    # Weights (see Differential's): a prune comes up more often under a second name.
    prune_more = prune


def _tail(value: Any, items: int = 8) -> str:
    if isinstance(value, list) and len(value) > items:
        return f"... {value[-items:]!r} (last {items} of {len(value)})"
    return repr(value)


def _broken(world: World, shot: dict[str, Any]) -> list[str]:
    """What ``world`` breaks of the rules every storage keeps (see the module docstring)."""
    found = list(dict.fromkeys(world.violations))
    world.violations.clear()
    ended = {i for i, t in shot["tasks"].items() if t["status"] == "terminal"}
    orphans = sorted({r["task_id"] for r in shot["dispatch rows"].values()
                      if r["task_id"] in ended})
    if orphans:
        found.append(f"dispatch rows outlive the end of their tasks: {orphans}")
    for worker_id, worker in world.workers.items():
        if worker.held:
            found.append(f"worker {worker_id} still holds {sorted(worker.held)} with no phase "
                         "running (a heartbeat would renew them forever)")
    return found
