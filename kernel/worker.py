"""Advancing one task: claim its lease, run phases, commit each with its epoch.

This is the whole of execution: the in-process :class:`~kernel.scheduler.Scheduler`
and ``controlplane``'s Celery tasks and announcement reader only call
:meth:`Worker.advance` (one task) or :meth:`Worker.advance_queue` (a queue's burst rows).
A phase runs outside any transaction (invariant 3); its result is committed with
the fencing epoch of the claim (invariant 5); while the next phase is runnable
and the lease is held, the worker continues inline (DESIGN §7).
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from .commit import Draft
from .endings import HeldEndings
from .environment import BLOCKED_DOCUMENT, differences, offered, recorded
from .errors import (
    CommitRejected,
    CommitUncertain,
    DocumentConflict,
    IllegalTransition,
    KernelError,
    SessionPoisoned,
    StaleLease,
    StorageUnavailable,
)
from .records import Outcome, Status, Task, new_id
from .registry import Blocked, Resolved, TaskDefinition
from .run import Lease, Run
from .session import Kernel, SessionHandle
from .tasks import TRANSITIONS, Finish, Next, Transition
from .tracing import span as traced

JSON = Any
log = logging.getLogger(__name__)

MAX_CONFLICTS = 5
QUICK_SECONDS = 0.25
"""A task whose last run in this worker took longer is not started while endings wait to
be committed (see :meth:`Worker.advance_queue`)."""
BLOCKED_REMEMBERED = 10_000
"""How many tasks given back blocked a worker counts (:meth:`Worker._gave_back`); the one
given back longest ago is forgotten first, and counts from one again."""
NO_PROGRESS = "phase {phase!r} returned {result!r}: no durable progress (same phase and checkpoint)"


def phase_attributes(task: Task) -> dict[str, Any]:
    """What a phase's span says about the task it runs."""
    return {"kernel.task.id": task.id, "kernel.task.kind": task.kind,
            "kernel.session.id": task.session_id, "kernel.phase": task.phase,
            "kernel.task.epoch": task.epoch, "kernel.task.restarts": task.restarts,
            "kernel.task.queue": task.queue}


class Heartbeat:
    """Renews the leases a worker currently holds, from a thread of its own.

    Long external calls would otherwise outlive the lease, and another worker
    would run the same phase (DESIGN §7). A renewal that fails means the lease is
    gone; the phase's commit will then be rejected by its epoch.
    """

    def __init__(
        self, interval: float, on_exit: Callable[[], None],
        held: dict[tuple[str, int], Lease] | None = None,
    ) -> None:
        self.interval = interval
        self.on_exit = on_exit
        self.held: dict[tuple[str, int], Lease] = {} if held is None else held
        self.lost = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="lease-heartbeat", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        try:
            while not self._stop.wait(self.interval):
                for lease in list(self.held.values()):
                    try:
                        if not lease.renew():
                            self.lost += 1
                    except Exception:
                        log.warning("lease renewal failed", exc_info=True)
        finally:
            self.on_exit()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


class Worker:
    """Claims tasks and runs their phases.

    Draining (:meth:`drain`, what a worker process does on SIGTERM): no new claims; a
    task whose phase commits and would continue inline gives its lease back instead
    (``Storage.release``), so that another worker takes it at once; :meth:`release_held`
    gives back the leases of phases still in flight when the process must go.
    ``on_release`` is told each task given back (to send its dispatch now).
    """

    def __init__(
        self,
        kernel: Kernel,
        worker_id: str | None = None,
        lease_seconds: float = 30.0,
        *,
        heartbeat: bool = False,
        on_release: Callable[[Task], None] | None = None,
    ) -> None:
        self.kernel = kernel
        self.id = worker_id or new_id("worker")
        self.lease = timedelta(seconds=lease_seconds)
        self._handles: dict[str, SessionHandle] = {}
        self.held: dict[tuple[str, int], Lease] = {}
        """The leases this worker holds, by task and epoch (:attr:`Lease.key`): a thread
        whose lease lapsed and was claimed again, by another thread of this worker,
        gives up only its own."""
        self.draining = False
        self.on_release = on_release
        # Per thread (a threads pool runs several at once): the endings held back
        # (kernel.endings). And how long each kind last ran here.
        self._pending = threading.local()
        self._took: dict[str, float] = {}
        self._blocked_here: dict[str, tuple[int, int]] = {}
        """Tasks this worker claimed and gave back blocked: by id, the task's
        ``updated_seq`` then and how many times in a row at it."""
        self._blocked_lock = threading.Lock()
        self.heartbeat = (
            Heartbeat(lease_seconds / 3, kernel.storage.thread_exit, self.held)
            if heartbeat
            else None
        )

    @property
    def endings(self) -> HeldEndings:
        """This thread's held-back endings."""
        held = getattr(self._pending, "endings", None)
        if held is None:
            held = self._pending.endings = HeldEndings(self)
        return held  # type: ignore[no-any-return]

    def close(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.stop()

    def drain(self) -> None:
        """Stop claiming; tasks running now give their lease back after their phase."""
        self.draining = True

    def release_held(self) -> list[Task]:
        """Give back every lease held now, phases in flight included (``interrupted``):
        only for a process that stops right after, so that nothing it still does can
        matter more than a crash would. The tasks given back."""
        released = []
        for lease in list(self.held.values()):
            task = self._release(lease, interrupted=True)
            if task is not None:
                released.append(task)
        return released

    def _release(self, lease: Lease, *, interrupted: bool) -> Task | None:
        storage, now = self.kernel.storage, self.kernel.clock.now()
        task = storage.release(lease.task.id, self.id, lease.task.epoch, now,
                               interrupted=interrupted)
        if task is not None:
            log.info("released %s (%s, phase %s) for another worker%s", task.id, task.kind,
                     task.phase, " mid-phase" if interrupted else "")
            if self.on_release is not None:
                self.on_release(task)
        return task

    def advance(self, task_id: str, *, announced: bool = False) -> bool:
        """Claim ``task_id`` if it is runnable and not blocked, and run it as far as it goes.

        Returns whether a phase ran. Safe to call for any id at any time: a task
        that is not runnable, or that another worker holds, is left alone.

        ``announced``: the call comes from an announcement that the task is due, not from its
        delivery (a worker's announcement reader): only the claim's one statement is tried, and a
        task it cannot claim is left to its delivery, which tells why.
        """
        if self.draining:
            return False
        storage, registry = self.kernel.storage, self.kernel.registry
        now = self.kernel.clock.now()
        # One round trip in the common case: claimed if it is stored at a version this
        # registry runs as is. Otherwise (not runnable, held, unknown, or stored at another
        # version) the task is read to tell which.
        claimed = storage.claim(task_id, self.id, now, now + self.lease, registry.versions())
        if claimed is None and announced:
            return False
        if claimed is None:
            task = storage.task(task_id)
            if task is None or not task.runnable_at(now):
                return False
            if isinstance(registry.resolve(task), Blocked):
                # Its rows back off; a worker that starts with a compatible definition
                # retries them at once (Dispatcher.resume).
                storage.block_dispatches(task_id)
                return False
            claimed = storage.claim(task_id, self.id, now, now + self.lease)  # it migrates
            if claimed is None:
                return False
        if claimed.restarts:
            log.info("recovering %s (%s): phase %r was interrupted (restart %d)", claimed.id,
                     claimed.kind, claimed.phase, claimed.restarts)
        return self.run_claimed(claimed)

    def advance_queue(self, queue: str, *, batch: int, budget: float) -> tuple[int, bool]:
        """Claim the runnable tasks of ``queue`` that a queue message delivers (oldest due
        dispatch row first, :meth:`~kernel.storage.Storage.claim_burst`) and run each as
        far as it goes, one after another, until none is left or ``budget`` seconds have
        passed.

        Returns how many were run and whether work may be left (the budget ran out, or
        draining stopped it): the caller sends a queue message for the rest, so that one
        queue's backlog does not keep this worker from the other queues' messages.

        Each task is claimed when it starts, exactly as :meth:`advance` claims, so its
        epoch and restart count mean what they always do. A phase that ends its task is
        held back (:mod:`kernel.endings`): up to ``batch`` such endings are committed
        together, one commit per session, or carried by this thread's next commit in
        their session but a phase's plain inline ``Next`` (which commits alone); at once
        if they may change other tasks; before this worker starts a task of a kind that
        was slow here last time (:data:`QUICK_SECONDS`); and when it stops.
        """
        storage, clock = self.kernel.storage, self.kernel.clock
        deadline = time.monotonic() + budget
        ran = 0
        try:
            while not self.draining:
                now = clock.now()
                claimed = storage.claim_burst(queue, self.id, now, now + self.lease)
                if claimed is None:
                    return ran, False
                lease = self._hold(claimed)
                if lease is None:
                    continue
                if self._took.get(lease.task.kind, 0.0) > QUICK_SECONDS:
                    self.endings.flush()  # never keep endings waiting behind a slow one
                started = time.monotonic()
                finish = self._run(lease, defer_ending=True)
                self._took[lease.task.kind] = time.monotonic() - started
                if finish is not None:
                    self.endings.hold(lease, finish)
                ran += 1
                if len(self.endings) >= batch:
                    self.endings.flush()
                if time.monotonic() >= deadline:
                    return ran, True
            return ran, True
        finally:
            self.endings.flush()

    def _hold(self, task: Task) -> Lease | None:
        """The lease of a task this worker just claimed, held (and so renewed) from now;
        ``None`` if no registered definition can run it: it is given back at once and its
        dispatch rows marked blocked, as :meth:`advance` leaves a blocked task."""
        resolved = self.kernel.registry.resolve(task)
        if not isinstance(resolved, Resolved) or self._environment_differs(task, resolved):
            storage, now = self.kernel.storage, self.kernel.clock.now()
            storage.release(task.id, self.id, task.epoch, now)
            # The claim removed the rows whose deliveries counted: the row the release
            # adds counts this worker's times, or every sweep would send the task again.
            storage.block_dispatches(task.id, delivered_at=now, attempts=self._gave_back(task))
            return None
        lease = Lease(
            kernel=self.kernel,
            handles=self.handle,
            owner=self.id,
            duration=self.lease,
            task=task,
            definition=resolved.definition,
            input=resolved.input,
            checkpoint=resolved.checkpoint,
            migrated=resolved.definition.version != task.version,
            carrier=self.endings,
        )
        self.held[lease.key] = lease
        return lease

    def _gave_back(self, task: Task) -> int:
        """How many times in a row this worker has now given ``task`` back blocked, at the
        state it is in (a change of the task, a migrate say, starts again at one)."""
        with self._blocked_lock:
            seq, times = self._blocked_here.pop(task.id, (task.updated_seq, 0))
            times = times + 1 if seq == task.updated_seq else 1
            self._blocked_here[task.id] = (task.updated_seq, times)
            while len(self._blocked_here) > BLOCKED_REMEMBERED:
                del self._blocked_here[next(iter(self._blocked_here))]  # the longest quiet
            return times

    def _environment_differs(self, task: Task, resolved: Resolved) -> bool:
        """Whether this worker lacks, or offers otherwise, something of the environment
        ``task`` was started under (:mod:`kernel.environment`). If so it reports the
        differences in the task's environment document, unless it said so already for
        this state of the task: the task is then left blocked, as for a missing
        definition, until an operator migrates or restarts it."""
        was = recorded(resolved.checkpoint)
        if was is None:
            return False
        definition = resolved.definition
        now = offered(task.kind, definition.version, definition.needs,
                                  resolved.input, resolved.checkpoint)
        found = differences(was, now)
        if not found:
            return False
        report = {"task_seq": task.updated_seq, "differences": found, "offered": now,
                  "worker": self.id}
        kernel = self.kernel
        said = kernel.document(task.session_id, BLOCKED_DOCUMENT, task.id)
        if {k: v for k, v in said.items() if k != "worker"} != {
                k: v for k, v in report.items() if k != "worker"}:
            draft = Draft(actor=f"worker:{self.id}")
            draft.set(BLOCKED_DOCUMENT, task.id, [], report)
            try:
                self.handle(task.session_id).commit(draft)
            except KernelError:
                log.exception("could not report the environment of %s", task.id)
        log.warning("%s (%s) is blocked here: %s", task.id, task.kind, "; ".join(found))
        return True

    # -- what held endings need (kernel.endings.Holder) ------------------------------

    def commit_ending(self, lease: Lease, finish: Finish) -> None:
        self._run(lease, returned=finish)

    def forget(self, lease: Lease) -> None:
        self.held.pop(lease.key, None)

    def run_claimed(self, task: Task) -> bool:
        """Run a task this worker claimed; False if it is blocked here (given back)."""
        lease = self._hold(task)
        if lease is None:
            return False
        self._run(lease)
        return True

    def _run(
        self, lease: Lease, *, defer_ending: bool = False, returned: Finish | None = None
    ) -> Finish | None:
        """Run the lease's phases until the task stops running here.

        ``defer_ending``: a phase that ends the task (its own ``Finish``) is not
        committed; its result is returned, the lease still held, for the held-back
        endings (:mod:`kernel.endings`). ``returned``: the result of a phase that already ran,
        to commit first.
        """
        task = lease.task
        deferred = False
        transition: Transition
        try:
            conflicts = 0
            while True:
                # One span per phase run, the commit that ends it inside: a child of the
                # context the task was created in, whichever worker runs it.
                with traced(f"phase {lease.task.kind}.{lease.task.phase}",
                                  phase_attributes(lease.task), parent=lease.task.trace) as span:
                    if returned is not None:
                        transition, ending, returned = returned, False, None
                    else:
                        transition, ending = self._execute(lease)
                    if defer_ending and not ending and isinstance(transition, Finish):
                        deferred = True
                        return transition
                    try:
                        self._commit(lease, transition, ending)
                    except StaleLease:
                        raise
                    except DocumentConflict:
                        # Optimistic concurrency: someone changed a document this phase
                        # read. Run the phase again on fresh state; past a few tries it is
                        # a fault.
                        conflicts += 1
                        lease.draft = Draft(actor=lease.draft.actor)
                        if conflicts <= MAX_CONFLICTS:
                            span.set({"kernel.phase.result": "document conflict"})
                            continue
                        self._end(lease, Finish(Outcome.FAULTED, error="document kept changing"))
                    except CommitRejected as exc:
                        # The handler asked for something illegal: a bug in the task, not a
                        # reason to retry forever. Its writes are dropped with it.
                        lease.draft = Draft(actor=lease.draft.actor)
                        self._end(lease, Finish(Outcome.FAULTED, error=f"commit rejected: {exc}"))
                    span.set({"kernel.phase.result": lease.task.status.value,
                              "kernel.phase.next": lease.task.phase,
                              "kernel.task.outcome": (lease.task.outcome or {}).get("kind")})
                    if lease.task.outcome and lease.task.outcome.get("kind") in (
                            Outcome.FAILED, Outcome.FAULTED):
                        span.error(str(lease.task.outcome.get("kind")),
                                   str(lease.task.outcome.get("error"))[:500])
                if lease.task.status is not Status.RUNNING:
                    return None
                if self.draining:  # between phases: hand the rest to another worker
                    self._release(lease, interrupted=False)
                    return None
        except StaleLease as exc:
            log.info("lease lost, abandoning: %s", exc)
            self._return_to_cancel(task)
        except SessionPoisoned as exc:
            log.warning("session handle poisoned, abandoning %s: %s", task.id, exc)
            self._handles.pop(task.session_id, None)
        except StorageUnavailable as exc:
            # Nothing was written: the phase is interrupted, as if its worker had died. Its lease
            # runs out and the next claim counts a restart (DESIGN §6); never `failed`.
            log.warning("storage unavailable, abandoning %s for a restart: %s", task.id, exc)
            self._handles.pop(task.session_id, None)
        finally:
            if not deferred:
                self.forget(lease)
        return None

    def _commit(self, lease: Lease, transition: Transition, ending: bool) -> None:
        if ending:
            assert isinstance(transition, Finish)
            self._end(lease, transition)
        else:
            lease.commit(transition)

    def _end(self, lease: Lease, finish: Finish) -> None:
        """Commit an ending the kernel decided (not the task's own transition) together
        with the definition's ``on_end`` writes: what the task holds is released in the
        commit that ends it. If those writes cannot be committed (a conflict that keeps
        coming, a bug), the task still ends, and the reason is in its error."""
        hook = lease.definition.on_end
        if hook is None:
            lease.commit(finish)
            return
        before = copy.deepcopy(lease.draft)  # a cancel handler's wrap-up, say
        error = None
        for _ in range(MAX_CONFLICTS + 1):
            lease.draft = copy.deepcopy(before)
            try:
                hook(Run(lease), finish)
                lease.commit(finish)
                return
            except (StaleLease, SessionPoisoned, CommitUncertain, StorageUnavailable):
                raise
            except DocumentConflict as exc:
                error = f"on_end: {exc}"  # read again and retry
            except CommitRejected as exc:
                error = f"on_end: commit rejected: {exc}"
                break
            except Exception as exc:
                error = f"on_end: {type(exc).__name__}: {exc}"
                break
        lease.draft = Draft(actor=lease.draft.actor)
        if error is not None:
            log.warning("task %s ends without its on_end writes: %s", lease.task.id, error)
            finish = Finish(
                finish.outcome, finish.result, "; ".join(filter(None, [finish.error, error]))
            )
        lease.commit(finish)

    def _return_to_cancel(self, task: Task) -> None:
        """If a cancel revoked this lease, say that the phase has returned.

        The cancel left the task sleeping until the revoked lease would run out, so that
        its handler cannot run while this phase might still be calling out; it has
        stopped now (its commit was refused), so the handler may run at once.
        """
        current = self.kernel.storage.task(task.id)
        revoked_ours = (
            current is not None
            and current.cancel is not None
            and current.status is Status.SLEEPING
            and current.epoch == task.epoch + 1  # the cancel revoked this very lease
        )
        if not revoked_ours:
            return  # lost to an expiry, or the cancel revoked a later holder's lease
        draft = Draft(actor=f"worker:{self.id}")
        draft.phase_returned(task.id, task.epoch)
        try:
            self.handle(task.session_id).commit(draft)
        except IllegalTransition:
            pass  # already woken: by the sweep, an operator or another worker
        except (CommitRejected, SessionPoisoned) as exc:
            log.info("could not wake cancelled %s; its lease runs out instead: %s", task.id, exc)

    def handle(self, session_id: str) -> SessionHandle:
        """This worker's handle on a session, reopened if an uncertain commit poisoned it."""
        handle = self._handles.get(session_id)
        if handle is None or handle.poisoned:
            handle = self._handles[session_id] = self.kernel.open(session_id)
        return handle

    def _execute(self, lease: Lease) -> tuple[Transition, bool]:
        """Run the phase (or the cancel handler); the transition to commit, and whether
        it is an ending the kernel decided (see :meth:`_end`)."""
        task, definition = lease.task, lease.definition
        run = Run(lease)
        if task.restarts > definition.max_restarts:
            limit = (
                f"{'the cancel handler' if task.cancel is not None else f'phase {task.phase!r}'}"
                f" was interrupted {task.restarts} times; restart limit is "
                f"{definition.max_restarts}"
            )
            if task.cancel is not None:
                # The cancel path has the limit too: a handler that kills its worker
                # every time must not loop. The task ends cancelled, without its wrap-up.
                intent = task.cancel
                return Finish(
                    Outcome.CANCELLED,
                    result={"by": intent.get("by"), "reason": intent.get("reason")},
                    error=limit,
                ), True
            return Finish(Outcome.FAILED, error=limit), True
        if task.cancel is not None:
            return self._cancel(run, definition), True
        try:
            result = definition.phases[task.phase](run)
        except (StaleLease, SessionPoisoned, CommitUncertain, StorageUnavailable):
            raise
        except Exception as exc:
            lease.draft = Draft(actor=lease.draft.actor)  # a failed phase writes nothing
            log.info("phase %s of %s raised", task.phase, task.id, exc_info=True)
            return Finish(
                Outcome.FAILED, error=f"phase {task.phase!r}: {type(exc).__name__}: {exc}"
            ), True
        if not isinstance(result, TRANSITIONS) or (
            isinstance(result, Next)
            and result.phase == lease.task.phase
            and result.checkpoint == lease.checkpoint
        ):
            return Finish(
                Outcome.FAULTED, error=NO_PROGRESS.format(phase=task.phase, result=result)
            ), True
        return result, False

    def _cancel(self, run: Run, definition: TaskDefinition) -> Transition:
        """Let the cancel handler commit its wrap-up with the cancellation (DESIGN §6)."""
        intent = run.task.cancel or {}
        error = None
        if definition.on_cancel is not None:
            try:
                definition.on_cancel(run)
            except (StaleLease, SessionPoisoned, CommitUncertain, StorageUnavailable):
                raise
            except Exception as exc:
                error = f"cancel handler: {type(exc).__name__}: {exc}"
        return Finish(
            Outcome.CANCELLED,
            result={"by": intent.get("by"), "reason": intent.get("reason")},
            error=error,
        )
