"""The three worlds of the differential test, and what it compares between them.

A :class:`World` is one storage with everything above it: a kernel with the scripted
task kind, a dispatcher attached to it (as ``controlplane.worker.runtime`` attaches its own)
delivering to a :class:`Broker` that records what it was given, three workers, and the
leases the test holds paused. The worlds share one :class:`~kernel.ManualClock`; their ids
come from a counter of their own (:func:`deterministic_ids`), so the same program makes
the same ids in each, and their records can be compared as they are.

What counts as storage-specific noise, and nothing else, is left out of the comparison
(:func:`snapshot`): the ids of commit and dispatch rows (serials of each database), and
what a Postgres transaction adds to a kept lease for the time it spent (``TASK_UPDATE``,
``inline_commit``: ``clock_timestamp() - transaction_timestamp()``, a few milliseconds).
For the latter, leases last :data:`LEASE` seconds, half a second off the whole-second
times the clock takes, and every time (and every ISO time in a JSON value: a cancel's
``revoked_until``, a summary's ``until``) is compared to the second below it: a decision
on a lease (``lease_until < now``) is then the same in each world, and so is what it
records.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import re
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from functools import partial
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest
from django.db import connections, transaction

import kernel.commit
import kernel.records
import kernel.session
import kernel.worker
from controlplane.storage import PostgresStorage, partitions, schema
from controlplane.storage import statements as sql
from kernel import (
    Draft,
    InMemoryStorage,
    JoinPolicy,
    Kernel,
    ManualClock,
    Registry,
    Run,
    StorageUnavailable,
    Task,
    Transition,
    Worker,
)
from kernel.dispatch import Dispatcher
from kernel.endings import HeldEndings
from kernel.records import Entry
from tests.conformance.world import Faults

LEASE = 30.5
"""Seconds a lease lasts: half a second off the clock's whole seconds (see above)."""
WORKERS = ("w1", "w2", "w3")
QUEUE = "default"
KIND = "scripted"
DOCUMENT = "notes"
MESSAGES = 1
"""The dispatcher's burst size: more rows of a queue at once are delivered by queue messages."""

STATS: Counter[str] = Counter()
"""What the runs did, across examples: printed at the end of a run, and what the
fast-path test asserts on (``<world>:<path>`` counts)."""


# -- ids and the worker's monotonic clock, deterministic per world -------------------------


class Ids:
    """A world's ids: the prefix :func:`kernel.records.new_id` would give, then a counter."""

    def __init__(self) -> None:
        self._counter = itertools.count(1)

    def __call__(self, prefix: str) -> str:
        return f"{prefix}_{next(self._counter):016x}"


_ACTIVE: list[World] = []
"""The world whose operation runs now (the ids it makes come from its counter)."""


def _new_id(prefix: str) -> str:
    if not _ACTIVE:
        raise AssertionError(f"an id ({prefix}) was made outside a world's operation")
    return _ACTIVE[-1].ids(prefix)


class FakeMonotonic:
    """``time.monotonic`` for ``kernel.worker``: it moves only when a phase says it took
    long (the ``slow`` meddle), so how long a kind took (``QUICK_SECONDS``) and a woken
    worker's budget decide the same in each world, whatever the machine's load."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


MONOTONIC = FakeMonotonic()


@contextlib.contextmanager
def deterministic_ids() -> Iterator[None]:
    """Ids from the active world's counter; the worker's monotonic clock from
    :data:`MONOTONIC`. For the duration of a test."""
    with pytest.MonkeyPatch.context() as patch:
        for module in (kernel.records, kernel.commit, kernel.session, kernel.worker):
            patch.setattr(module, "new_id", _new_id)
        patch.setattr(kernel.worker, "time", SimpleNamespace(monotonic=MONOTONIC.monotonic))
        yield


@contextlib.contextmanager
def claim_window(rows: int | None) -> Iterator[int]:
    """The burst claim's window scaled down to ``rows`` (``statements.CLAIM_WINDOW`` is
    64), so that a random program of a few dozen steps can fill it; the statement is
    otherwise the one the storage runs. ``None`` (or a statement without the window)
    leaves it as it is. Yields the window in effect."""
    window = getattr(sql, "CLAIM_WINDOW", None)
    limit = f"LIMIT {window}"
    if rows is None or window is None or limit not in sql.CLAIM_BURST:
        yield window or 0
        return
    with pytest.MonkeyPatch.context() as patch:
        for name in ("CLAIM_BURST", "FORGET_DEAD_BURST"):
            patch.setattr(sql, name, getattr(sql, name).replace(limit, f"LIMIT {rows}"))
        yield rows


# -- values Postgres refuses -----------------------------------------------------------------


def refused_value(kind: str) -> Any:
    """A value the in-memory storage holds and Postgres does not: text with NUL (jsonb
    and text columns refuse it), a lone surrogate (not UTF-8), NaN (not JSON), a datetime
    (not JSON at all)."""
    if kind == "nul":
        return "tool output \u0000 from a binary file"
    if kind == "surrogate":
        return "half a pair \ud800"
    if kind == "nan":
        return float("nan")
    if kind == "datetime":
        return datetime(2026, 1, 1, tzinfo=UTC)
    raise ValueError(kind)


# -- what the worlds deliver --------------------------------------------------------------------


class Broker:
    """The dispatcher's broker: records each message and queue message, in order."""

    def __init__(self) -> None:
        self.log: list[tuple[str, ...]] = []

    def deliver(self, task_id: str, queue: str) -> None:
        self.log.append(("deliver", task_id, queue))

    def wake(self, queue: str) -> None:
        self.log.append(("wake", queue))


class Breakable:
    """The in-memory storage behind a connection that can be lost: while ``broken``,
    every call raises :class:`StorageUnavailable`, as every statement on a terminated
    Postgres connection fails until the connection is closed (at the end of the
    operation, as a worker's task boundary closes it)."""

    def __init__(self, inner: InMemoryStorage) -> None:
        self._inner = inner
        self.broken = False

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._inner, name)
        if not callable(value):
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            if self.broken:
                raise StorageUnavailable("connection lost")
            return value(*args, **kwargs)

        return call


# -- the scripted task kind ----------------------------------------------------------------------


def scripted_registry(world: World) -> Registry:
    """One task kind whose input is a script: each phase plays it from the checkpoint's
    ``pc`` (see :meth:`World.play`)."""
    registry = Registry()
    registry.document(DOCUMENT)

    @registry.task(KIND, queue=QUEUE)
    class Scripted:
        initial = "go"

        def go(self, run: Run) -> Transition:
            return world.play(run)

        def on_cancel(self, run: Run) -> None:
            world.effects.append(("on_cancel", run.task_id, run.task.epoch))
            if run.input.get("cancel_writes"):
                run.append(run.input["conv"], "cancelled", {"task": run.task_id})

    return registry


LARGE_ABOVE = 1_024
"""The worlds' artifact threshold: low, so that large values stay cheap to make."""


def large_text(tag: str) -> str:
    return " ".join(f"{tag}:{n}" for n in range(150))


def large_value(seen: Any) -> Any:
    """What a large entry payload read as ``seen`` was written as (None: not one)."""
    if isinstance(seen, list) and seen:
        return [seen[0], large_text(str(seen[0]))]
    if isinstance(seen, dict) and isinstance(seen.get("tag"), str):
        return {"tag": seen["tag"], "text": large_text(seen["tag"]), "v": seen.get("v")}
    return None


def write_large(writer: Any, conversation: str, tag: str, shape: str, value: Any,
                keys: list[str]) -> None:
    """Write a value above the threshold through ``writer`` (a Run or a Draft: both
    append and set): an entry payload with a large field (``field``) or a large list
    (``whole``); a document value, after a key inside the newest one written before
    (``inside``: it reaches inside a value stored apart)."""
    if shape == "field":
        writer.append(conversation, "large", {"tag": tag, "text": large_text(tag), "v": value})
    elif shape == "whole":
        writer.append(conversation, "large", [tag, large_text(tag)])
    else:
        earlier = [k for k in keys if k != "log"]
        if earlier:
            writer.set(DOCUMENT, "large", [earlier[-1], "seen"], tag)
        writer.set(DOCUMENT, "large", [tag], {"text": large_text(tag), "v": value})


def _short(values: list[Any]) -> str:
    return repr(values[:2])[:300]


class World:
    """One storage under test and everything above it (see the module's docstring)."""

    def __init__(
        self, name: str, clock: ManualClock, storage: Any, faults: Faults, *,
        alias: str | None = None, memory: InMemoryStorage | None = None,
    ) -> None:
        self.name = name
        self.faults = faults
        """The storage's fault hook: armed by the test, the same in each world."""
        self.clock = clock
        self.alias = alias
        self.memory = memory
        self.storage = storage
        self.ids = Ids()
        self.broker = Broker()
        self.effects: list[tuple[Any, ...]] = []
        self.violations: list[str] = []
        self.paused: list[tuple[str, Task]] = []
        """Leases claimed by the test for a worker that has not run them yet (its holder
        is alive but paused): (worker id, the claimed task)."""
        self.lose_allowed = False
        self.refused = True
        """Whether scripts' refused values are used (off: an ordinary value instead)."""
        self.lapse = True
        """Whether scripts' meddles with leases (expire, steal, resume) are played."""
        self.kernel = Kernel(storage, scripted_registry(self), clock,
                             artifact_above=LARGE_ABOVE)
        self.dispatcher = Dispatcher(
            self.kernel, self.broker.deliver, advance_queue=self.broker.wake, messages=MESSAGES
        )
        self.dispatcher.attach()
        self.workers: dict[str, Worker] = {}
        for worker_id in WORKERS:
            self.restart(worker_id)
        self._admin: psycopg.Connection | None = None

    def __repr__(self) -> str:
        return f"<World {self.name}>"

    # -- operations --------------------------------------------------------------------

    @contextlib.contextmanager
    def active(self, *, lose: bool = False) -> Iterator[None]:
        _ACTIVE.append(self)
        self.lose_allowed = lose
        try:
            yield
        finally:
            self.lose_allowed = False
            _ACTIVE.pop()
            self.settle()

    def settle(self) -> None:
        """An operation's end: a lost connection is closed (the next one reconnects), as
        Django's clean-up at a Celery task's boundary closes it."""
        if self.alias is None:
            self.storage.broken = False
            return
        db = connections[self.alias]
        raw = db.connection
        if raw is not None and (raw.broken or raw.closed):
            db.close()
        else:
            db.close_if_unusable_or_obsolete()

    def restart(self, worker_id: str) -> Worker:
        """A worker process that starts (again, after a crash): nothing held, no handles."""
        worker = Worker(self.kernel, worker_id, LEASE)
        self.workers[worker_id] = worker
        self.paused = [(w, t) for w, t in self.paused if w != worker_id]
        _spy_worker(self, worker)
        return worker

    def lose_connection(self) -> None:
        """The connection is lost: Postgres terminates the backend (and waits until it has
        gone); the in-memory storage breaks (:class:`Breakable`)."""
        if self.alias is None:
            self.storage.broken = True
            return
        db = connections[self.alias]
        db.ensure_connection()
        pid = db.connection.info.backend_pid
        if self._admin is None:
            settings = db.settings_dict
            self._admin = psycopg.connect(
                dbname=settings["NAME"], user=settings["USER"] or "postgres",
                host=settings["HOST"] or None, port=settings["PORT"] or None,
                password=settings["PASSWORD"] or None, autocommit=True,
            )
        self._admin.execute("SELECT pg_terminate_backend(%s, 5000)", [pid])

    def close(self) -> None:
        if self._admin is not None:
            self._admin.close()
            self._admin = None

    # -- the scripted phases -----------------------------------------------------------

    def value(self, bad: str | None, plain: Any) -> Any:
        return refused_value(bad) if bad and self.refused else plain

    def check_held(self, run: Run, when: str) -> None:
        """A phase runs under a lease its worker holds (and so renews, with a heartbeat)."""
        task = run.task
        worker = self.workers.get(task.lease_owner or "")
        lease = worker.held.get((task.id, task.epoch)) if worker is not None else None
        if lease is None or lease.task.epoch != task.epoch:
            self.violations.append(
                f"{when} of the phase of {task.id} at epoch {task.epoch}: worker "
                f"{task.lease_owner} does not hold its lease (held: "
                f"{None if lease is None else lease.task.epoch}), so nothing renews it"
            )

    def play(self, run: Run) -> Transition:
        """Play the task's script from its checkpoint's ``pc`` until a step that ends the
        phase (the end of the script succeeds). Steps: see ``machine.step``."""
        task = run.task
        self.check_held(run, "start")
        pc = int(run.checkpoint.get("pc", 0))
        self.effects.append(("phase", task.id, pc, task.epoch, task.restarts))
        script = run.input["script"]
        try:
            while pc < len(script):
                step = script[pc]
                op = step["op"]
                value = self.value(step.get("bad"), f"{op}@{pc}")
                if op == "next":
                    return run.next("go", {"pc": pc + 1, "v": value})
                if op == "steps":  # an agent's steps: each a phase with an entry and a document
                    left = int(run.checkpoint.get("left") or step["n"])
                    run.append(run.input["conv"], "note", {"v": value, "left": left})
                    run.set(DOCUMENT, "n", [task.id], left)
                    if left > 1:
                        return run.next("go", {"pc": pc, "left": left - 1})
                    return run.next("go", {"pc": pc + 1, "left": None})
                if op == "succeed":
                    return run.succeed({"pc": pc, "v": value})
                if op == "fail":
                    return run.fail(f"asked to fail at {pc}", result={"v": value})
                if op == "raise":
                    raise RuntimeError(f"asked to raise at {pc}")
                if op == "sleep":
                    return run.sleep(step["s"], then="go", checkpoint={"pc": pc + 1})
                if op == "signal":
                    name = f"s{pc}"
                    if name not in task.signals:
                        return run.wait_for(name, then="go", checkpoint={"pc": pc})
                elif op == "spawn":
                    kids = [run.spawn(KIND, {"script": child, "conv": run.input["conv"]})
                            for child in step["children"]]
                    if step.get("wait"):
                        return run.wait_all(kids, then="go", policy=JoinPolicy(step["wait"]),
                                            checkpoint={"pc": pc + 1})
                elif op == "wait_on":
                    return run.wait_all(step["ids"], then="go", checkpoint={"pc": pc + 1})
                elif op == "intent":
                    run.commit(checkpoint={"pc": pc + 1, "v": value})
                elif op == "append":
                    run.append(run.input["conv"], "note", {"v": value})
                elif op == "doc":
                    run.set(DOCUMENT, "n", [task.id], value)
                elif op in ("large_append", "large_doc"):
                    self.large(run, op, pc, value)
                elif op == "meddle":
                    self.meddle(run, step)
                else:
                    raise ValueError(f"no step {op!r}")
                pc += 1
            return run.succeed({"pc": pc})
        finally:
            self.check_held(run, "end")

    def large(self, run: Run, op: str, pc: int, value: Any) -> None:
        """Write a value above the kernel's artifact threshold (an entry payload, or a
        field of one; a document value, and a key inside one written before), after
        reading back what earlier phases wrote so (:meth:`read_large`)."""
        task = run.task
        _, keys = self.read_large(run.entries(run.input["conv"]),
                                  run.document(DOCUMENT, "large"))
        self.effects.append(("large read", task.id, pc, keys))
        tag = f"{task.id}-{pc}-{task.epoch}"
        shape = ("field" if pc % 2 == 0 else "whole") if op == "large_append" else "inside"
        write_large(run, run.input["conv"], tag, shape, value, keys)

    def read_large(self, entries: list[Entry], document: Any) -> tuple[int, list[str]]:
        """Check what reads return of the large values (their stand-ins opened): what was
        written, or a violation; how many entries and which document keys there are."""
        notes = [e.payload for e in entries if e.kind == "large"]
        wrong = [n for n in notes if n != large_value(n)]
        wrong += [k for k, v in document.items() if k != "log"
                  and (not isinstance(v, dict) or v.get("text") != large_text(k))]
        log = document.get("log", [])
        wrong += [t for t in log if not isinstance(t, str) or t != large_text(t.split(":")[0])]
        if wrong:
            self.violations.append(f"large values read back changed: {_short(wrong)}")
        return len(notes), sorted(document)

    def meddle(self, run: Run, step: dict[str, Any]) -> None:
        """What another actor does while this phase runs, in this world."""
        what, task = step["what"], run.task
        if not self.lapse and what in ("expire", "steal", "resume"):
            return
        target = step.get("target") or task.id
        now = self.clock.now()
        try:
            if what == "cancel":
                draft = Draft(actor="user:op")
                draft.cancel(target, "meddled")
                self.kernel.open(task.session_id).commit(draft)
            elif what == "signal":
                current = self.kernel.task(target)
                name = (current.wait or {}).get("signal", "s0")
                draft = Draft(actor="user:op")
                draft.signal(target, name, {"by": "meddle"})
                self.kernel.open(task.session_id).commit(draft)
            elif what == "expire":  # the lease runs out now, as if its holder had paused
                self.storage.release(task.id, task.lease_owner or "", task.epoch, now,
                                     interrupted=True)
            elif what == "steal":  # ...and another worker takes the task meanwhile
                stolen = self.storage.claim(target, "w3", now, now + timedelta(seconds=LEASE))
                if stolen is not None:
                    self.paused.append(("w3", stolen))
            elif what == "lose":
                if self.lose_allowed:
                    self.lose_connection()
            elif what == "slow":
                MONOTONIC.now += 1.0
            elif what == "resume":  # a paused holder in this process wakes up
                if self.paused:
                    worker_id, claimed = self.paused.pop(0)
                    self.workers[worker_id].run_claimed(claimed)
            else:
                raise ValueError(f"no meddle {what!r}")
            self.effects.append(("meddle", what, target))
        except Exception as exc:  # what the meddler met is compared, not the phase's end
            self.effects.append(("meddle", what, target, type(exc).__name__))


class _SpiedEndings(HeldEndings):
    """This thread's held-back endings, counting their joint commits and the commits
    that carry them."""

    def __init__(self, world: World, worker: Worker) -> None:
        super().__init__(worker)
        self.world = world

    def _together(self, group: Any) -> bool:
        landed = super()._together(group)
        STATS[f"{self.world.name}:endings committed together"] += bool(landed)
        return landed

    def carry(self, session_id: str) -> Any:
        carried = super().carry(session_id)
        STATS[f"{self.world.name}:endings carried by an intent"] += carried is not None
        return carried


def _spy_worker(world: World, worker: Worker) -> None:
    """Count the held-back endings' joint commits and the commits that carry them."""
    worker._pending.endings = _SpiedEndings(world, worker)


def _spy_fast_paths(world: World, storage: PostgresStorage) -> None:
    """Count the commits each one-round-trip kind wrote (a write set returned), and the
    burst claims that found a task."""
    built, woken = storage._write_built, storage.claim_burst

    def write_built(db: Any, session_id: str, writing: Any) -> Any:
        written = built(db, session_id, writing)
        if written is not None:
            if len(written.new_tasks) == len(written.dispatches) == 1:
                path = "create one"  # one statement
            elif written.new_tasks:
                path = "creates"
            elif not written.updated_tasks:
                path = "documents"
            elif written.updated_tasks[0].terminal:
                path = "known ending"
            elif any(h.version == 1 for h in written.document_heads):
                path = "known writing, creating"  # a document the lease found unwritten
            elif written.entries or written.document_heads:
                path = "known writing"
            else:
                path = "known inline"
            STATS[f"{world.name}:{path}"] += 1
        return written

    def claim_burst(*args: Any, **kwargs: Any) -> Task | None:
        claimed = woken(*args, **kwargs)
        STATS[f"{world.name}:burst claims"] += claimed is not None
        return claimed

    storage.claim_burst = claim_burst  # type: ignore[method-assign]
    storage._write_built = write_built  # type: ignore[method-assign]


def memory_world(clock: ManualClock) -> World:
    faults = Faults()
    memory = InMemoryStorage(fault=faults)
    return World("memory", clock, Breakable(memory), faults, memory=memory)


def postgres_world(name: str, clock: ManualClock, alias: str, *, fast_paths: bool) -> World:
    faults = Faults()
    storage = PostgresStorage(using=alias, fault=faults, fast_paths=fast_paths)
    world = World(name, clock, storage, faults, alias=alias)
    _spy_fast_paths(world, storage)
    return world


KERNEL_TABLES = (schema.DISPATCH, schema.COMMIT, schema.SUBMISSION, schema.DOCUMENT_VERSION,
                 schema.DOCUMENT_HEAD, schema.ENTRY, schema.TASK, schema.CONVERSATION,
                 schema.SESSION)


START = datetime(2026, 1, 1, tzinfo=UTC)
"""Where the worlds' clock starts (``ManualClock``'s default)."""


def empty_database(alias: str) -> None:
    """Every kernel record gone: each example starts from an empty store, with a
    partition of the commit log for the clock's month (a prune run a year later drops
    it when every row in it is prunable, as beat's would)."""
    with transaction.atomic(using=alias), connections[alias].cursor() as cur:
        for table in KERNEL_TABLES:
            cur.execute(f"DELETE FROM {table.name}")
        partitions.ensure(cur, START, "month", 0)


@contextlib.contextmanager
def kept_partitions(alias: str) -> Iterator[None]:
    """The commit log's partitions as they were before, after: a prune run a year on
    drops every empty partition that ended by then, and other tests share the
    database; the partition :func:`empty_database` made goes."""
    with connections[alias].cursor() as cur:
        before = partitions.partitions(cur)
    try:
        yield
    finally:
        with transaction.atomic(using=alias), connections[alias].cursor() as cur:
            now = {p.name for p in partitions.partitions(cur)}
            for made in now - {p.name for p in before}:
                cur.execute(f"DROP TABLE {made}")
            for gone in (p for p in before if p.name not in now):
                partitions._attach(cur, gone.name, gone.start, gone.end)


# -- snapshots ----------------------------------------------------------------------------------

_ISO = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\.\d+")


def _plain(value: Any) -> Any:
    """``value`` with every time to the second below it (see the module's docstring)."""
    if isinstance(value, datetime):
        return value.replace(microsecond=0)
    if isinstance(value, str):
        return _ISO.sub(r"\1", value)
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _fields(record: Any, drop: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        f.name: _plain(getattr(record, f.name))
        for f in dataclasses.fields(record)
        if f.name not in drop
    }


Snapshot = dict[str, dict[Any, dict[str, Any]]]


def snapshot(world: World) -> Snapshot:
    """Every record the world's storage holds, keyed, noise left out."""
    if world.memory is not None:
        m = world.memory
        rows: dict[str, list[Any]] = {
            "sessions": list(m._sessions.values()),
            "tasks": list(m._tasks.values()),
            "dispatch rows": list(m._dispatches.values()),
            "commits": [c for log in m._commits.values() for c in log],
            "conversations": list(m._conversations.values()),
            "entries": list(m._entries.values()),
            "documents": list(m._heads.values()),
            "document versions": [v for vs in m._versions.values() for v in vs],
            "submissions": list(m._submissions.values()),
        }
    else:
        tables: dict[str, schema.Table[Any]] = {
            "sessions": schema.SESSION, "tasks": schema.TASK, "dispatch rows": schema.DISPATCH,
            "commits": schema.COMMIT, "conversations": schema.CONVERSATION,
            "entries": schema.ENTRY, "documents": schema.DOCUMENT_HEAD,
            "document versions": schema.DOCUMENT_VERSION, "submissions": schema.SUBMISSION,
        }
        rows = {}
        with connections[world.alias or ""].cursor() as cur:
            for label, table in tables.items():
                cur.execute(f"SELECT {table.select_list} FROM {table.name}")
                rows[label] = [table.from_sql(r) for r in cur.fetchall()]
    keys: dict[str, Callable[[dict[str, Any]], Any]] = {
        "commits": lambda r: (r["session_id"], r["seq"]),
        "documents": lambda r: (r["session_id"], r["kind"], r["key"]),
        "document versions": lambda r: (r["document_id"], r["version"]),
    }
    drops = {"commits": ("id",), "dispatch rows": ("id",)}
    shot: Snapshot = {}
    for label, records in rows.items():
        plain = [_fields(r, drops.get(label, ())) for r in records]
        if label == "dispatch rows":  # no key but the serial: a multiset, numbered
            ordered = sorted(plain, key=repr)
            shot[label] = {(r["task_id"], i): r for i, r in enumerate(ordered)}
        else:
            key = keys.get(label, lambda r: r["id"])
            shot[label] = {key(r): r for r in plain}
    return shot


def differences(reference: Snapshot, other: Snapshot, limit: int = 6) -> dict[str, list[str]]:
    """Per kind of record, what differs: missing, extra, or fields that disagree."""
    found: dict[str, list[str]] = {}
    for label, mine in reference.items():
        theirs = other[label]
        lines = []
        for key in sorted(set(mine) | set(theirs), key=repr):
            a, b = mine.get(key), theirs.get(key)
            if a == b:
                continue
            if a is None or b is None:
                lines.append(f"{key}: only in {'the other' if a is None else 'the reference'}"
                             f": {a or b}")
                continue
            fields = {n: (a[n], b.get(n)) for n in a if not _same(a[n], b.get(n))}
            lines.append(f"{key}: " + "; ".join(
                f"{n}: reference {x!r}, other {y!r}" for n, (x, y) in fields.items()))
        if lines:
            found[label] = lines[:limit] + ([f"... {len(lines) - limit} more"]
                                            if len(lines) > limit else [])
    return found


def _same(a: Any, b: Any) -> bool:
    return a == b or (a != a and b != b)  # NaN is itself


# -- reads of retained history ------------------------------------------------------------------


def _read(read: Callable[[], Any]) -> Any:
    """A read's value, or the type of the error it raised (a pruned version's answer)."""
    try:
        value = read()
    except Exception as exc:
        return ("error", type(exc).__name__)
    if isinstance(value, list):
        return [_fields(v) if dataclasses.is_dataclass(v) else _plain(v) for v in value]
    return _plain(value)


def feed_page(world: World, session_id: str, after: int) -> Any:
    """What the REST feed (``GET /api/sessions/ID/changes?after=N``) answers, as head,
    snapshot (its seq and ``pruned_seq``, or None) and changes (seq, actor, summary):
    Postgres's from the control plane's read (controlplane.reads.feed), the reference's
    as docs/retention.md says it is made from the storage's records (a snapshot at the
    head when the cursor is below ``pruned_seq``, the changes after it)."""
    if world.alias is not None:
        from controlplane.reads.feed import session_page
        from controlplane.reads.replica import using

        with using(world.alias):
            page = session_page(session_id, after, 1000)
        state = page.state
        return (page.head_seq,
                None if state is None else (state["seq"], state["pruned_seq"]),
                [(c["seq"], c["actor"], _plain(c["summary"])) for c in page.changes])
    session = world.storage.session(session_id)
    state = None
    if session.pruned_seq > after:
        state, after = (session.head_seq, session.pruned_seq), session.head_seq
    return (session.head_seq, state,
            [(c.seq, c.actor, _plain(c.summary))
             for c in world.kernel.commits_after(session_id, after)])


def retained(world: World, sessions: list[tuple[str, str]]) -> dict[str, Any]:
    """What a reader gets of each session (id, its conversation) through the kernel's
    reads, times to the second: the feed after cursors from 0 to past ``pruned_seq``,
    the submissions of the requests scripts make, each document now and at the versions
    around its newest baseline (a version below the kept history answers "pruned"), and
    the conversation's transcript and context."""
    kernel, storage = world.kernel, world.storage
    found: dict[str, Any] = {}
    for session_id, conversation in sessions:
        session = storage.session(session_id)
        if session is None:
            found[session_id] = None
            continue
        pruned = session.pruned_seq
        cursors = sorted({0, max(pruned - 1, 0), pruned, pruned + 1, session.head_seq})
        feed = {after: [_fields(c, ("id",)) for c in kernel.commits_after(session_id, after)]
                for after in cursors}
        requests = {}
        for request in ("r1", "r2", "r3"):
            sub = storage.submission_by_request(session_id, request)
            requests[request] = None if sub is None else _fields(sub)
        documents = {}
        for key in ("d0", "d1", "d2", "n", "large"):
            head = storage.document_head(session_id, DOCUMENT, key)
            top = head.version if head is not None else 0
            base = head.baseline_version if head is not None else 0
            versions = sorted({v for v in (1, base - 1, base, top) if 1 <= v <= top})
            documents[key] = {
                v: _read(partial(kernel.document, session_id, DOCUMENT, key, v))
                for v in (None, *versions)
            }
        found[session_id] = {
            "session": _fields(session),
            "feed": feed,
            "rest feed": {after: _read(partial(feed_page, world, session_id, after))
                          for after in cursors},
            "submissions": requests,
            "documents": documents,
            "newest document": _read(partial(kernel.newest_document, session_id, DOCUMENT, "")),
            "answers": [_read(partial(storage.entry, s["answer_entry_id"]))
                        for s in requests.values() if s and s["answer_entry_id"]],
            "entries": _read(partial(kernel.entries, conversation)),
            "entries after": _read(partial(kernel.entries_after, conversation, (0, 0))),
            "context": _read(partial(kernel.context, conversation)),
        }
    return found
