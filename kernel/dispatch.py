"""Dispatch: telling workers "look at task X", after commits and by the sweep.

Postgres decides, the broker delivers (DESIGN §7). A commit that makes a task
runnable writes a dispatch row in the same transaction (taken already, when the
process's :class:`Dispatcher` is attached to its kernel); after the commit the
Dispatcher hands due rows to a ``deliver`` callable (Celery's ``apply_async`` in
production); the claim deletes them. Anything lost on the way - a
broker outage, a process dying between commit and delivery - is picked up by
:meth:`Dispatcher.sweep`, which beat runs every second: due rows, sleepers whose
time has come, tasks whose lease expired. A message only says "look at X"; the
claim decides, so duplicate deliveries are harmless and so is running two beats.

A burst (more than ``messages`` rows of one queue at once) is delivered by that many
queue messages instead of a message per row; a storage that announces the rows a commit
takes lets the Dispatcher hold their messages for a grace (:class:`HeldMessages`).
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from .records import Dispatch, Task, WriteSet
from .registry import Blocked
from .session import Kernel

Deliver = Callable[[str, str], None]
"""``deliver(task_id, queue)``: enqueue "advance task_id" on ``queue``; raise if it failed."""
DeadOwners = Callable[[datetime], Collection[str]]
"""``dead_owners(now)``: the lease owners known at ``now`` to be dead (a worker registry's
workers whose heartbeat stopped), whose leases the sweep ends at once."""
AdvanceQueue = Callable[[str], None]
"""``advance_queue(queue)``: enqueue a queue message, "run what is runnable on queue", on
``queue``; raise if it failed."""

RECOVERY_SUFFIX = ".now"
"""What the sweep appends to a task's queue: everything it sends is late (a lost message,
a due sleeper, an expired lease), so it goes to a queue of its own that workers consume
beside the task's queue, instead of behind the backlog waiting there."""


def recovery_queue(queue: str) -> str:
    return queue + RECOVERY_SUFFIX

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SweepReport:
    delivered: int
    failed: int


class Dispatcher:
    """Delivers dispatch rows; rows stay until their task is claimed.

    A row delivered but not claimed within ``redeliver_after`` is delivered again:
    the broker may have lost the message (Redis restarted, say); each further wait
    doubles, by the row's deliveries (see :func:`kernel.storage.redelivery_wait`).
    Expired leases get a fresh row of their own, so their recovery follows the same
    path and is never held back by an older row's backoff.

    ``advance_queue(queue)``, if given, sends a queue message, whose worker claims
    ``queue``'s due rows from storage until none is left
    (:meth:`~kernel.worker.Worker.advance_queue`): when more than ``messages`` rows of one
    queue are taken at once (a burst), that many queue messages deliver them all instead
    of a message per row, so the backlog waits in storage, not in the broker. Fewer rows
    get a message each, as without ``advance_queue``.

    ``announce_grace``: where the storage announces the rows a commit takes to listening
    workers (Postgres's NOTIFY, ``controlplane.worker.announcements``), their messages wait
    that long after the commit and are sent only for the rows still stored then: a row
    whose task an idle worker claimed from the announcement is gone, and a message for it
    would only make a worker find it claimed. A process that dies meanwhile leaves its
    rows to the sweep (after ``redeliver_after``), as one dying between a commit and its
    messages does. Rows of one queue still unclaimed after the grace are a backlog (the
    listening workers are busy): with ``advance_queue`` they go as one queue message.

    ``dead_owners``: who the sweep may take for dead before their leases run out (a
    worker whose registry heartbeat stopped): it ends their leases now
    (:meth:`~kernel.storage.Storage.end_leases`) and dispatches their tasks as expired
    leases, instead of waiting out the lease.
    """

    def __init__(
        self,
        kernel: Kernel,
        deliver: Deliver,
        *,
        redeliver_after: timedelta = timedelta(seconds=30),
        batch: int = 500,
        advance_queue: AdvanceQueue | None = None,
        messages: int = 32,
        announce_grace: timedelta | None = None,
        dead_owners: DeadOwners | None = None,
    ) -> None:
        self.kernel = kernel
        self.deliver = deliver
        self.redeliver_after = redeliver_after
        self.batch = batch
        self.advance_queue = advance_queue
        self.messages = messages
        self.dead_owners = dead_owners
        self.held = (
            HeldMessages(announce_grace.total_seconds(), self._deliver_unclaimed,
                         on_exit=kernel.storage.thread_exit)
            if announce_grace
            else None
        )

    def attach(self) -> None:
        """Deliver after each of the kernel's commits, and take the commit's due rows in
        the commit itself (:meth:`outgoing`): the round trip that would take them after
        it is saved, between the commit and its messages, is not paid.

        What that changes if this process dies between the commit and its messages:
        the rows are already taken, so the sweep re-sends them once ``redeliver_after``
        has passed, not at its next pass - as when a committer dies between taking and
        sending, the window being the time the after-commit listeners take to start.
        A failed delivery releases the rows for the next sweep, as before."""
        self.kernel.outbox = self.outgoing
        self.kernel.after_commit(self.after_commit)

    def outgoing(self, rows: list[Dispatch], now: datetime) -> list[Dispatch]:
        """A commit's dispatch rows as written when this dispatcher delivers after it:
        the rows due at ``now`` taken (delivered at ``now``, one delivery), and those of
        a burst's queue marked ``woken`` (see :meth:`_deliver`)."""
        due = [row for row in rows if row.not_before <= now]
        if not due:
            return rows
        burst = self._bursts(due)
        return [
            replace(row, delivered_at=now, attempts=1, woken=row.queue in burst)
            if row.not_before <= now
            else row
            for row in rows
        ]

    def after_commit(self, write_set: WriteSet) -> None:
        """Deliver the commit's due dispatches now; the sweep covers any failure."""
        now = self.kernel.clock.now()
        # Taken in the commit itself (:meth:`attach`): only this dispatcher sets that.
        taken = [d for d in write_set.dispatches if d.delivered_at is not None]
        due = [d.id for d in write_set.dispatches
               if d.delivered_at is None and d.not_before <= now]
        storage = self.kernel.storage
        if due:
            ids = storage.take_dispatches(due, now)
            taken += [d for d in write_set.dispatches if d.id in ids]
        if self.held is not None:
            announced = [d for d in taken if announced_row(d)]
            if announced:
                self.held.add(announced)
                taken = [d for d in taken if not announced_row(d)]
        if taken:
            self._deliver_or_release(taken)

    def flush(self) -> None:
        """Send now the messages held for ``announce_grace`` (those still wanted)."""
        if self.held is not None:
            self.held.flush()

    def close(self) -> None:
        """Send what is held and stop the thread that holds messages."""
        if self.held is not None:
            self.held.close()

    def _deliver_unclaimed(self, rows: list[Dispatch]) -> None:
        storage = self.kernel.storage
        try:
            left = storage.existing_dispatches([d.id for d in rows])
        except Exception:
            log.warning("could not tell which held dispatches were claimed; sending all",
                        exc_info=True)
            left = {d.id for d in rows}
        self._deliver_or_release([d for d in rows if d.id in left], backlog=True)

    def _deliver_or_release(self, rows: list[Dispatch], *, backlog: bool = False) -> None:
        """Send ``rows`` in id order; those the broker did not take are due again at
        the next sweep. ``backlog``: rows no listening worker claimed within the grace."""
        _, undelivered = self._deliver(sorted(rows, key=lambda d: d.id), backlog=backlog)
        if undelivered:
            self.kernel.storage.release_dispatches([d.id for d in undelivered])

    def sweep(self) -> SweepReport:
        """One idempotent pass over what should be running and may not be."""
        now = self.kernel.clock.now()
        storage = self.kernel.storage
        ended = self._end_dead_leases(now)
        expired = storage.expired_leases(now, self.batch)
        if expired or ended:
            storage.ensure_dispatches([*ended, *expired], now)
        taken = storage.take_due_dispatches(now, self.redeliver_after, self.batch)
        delivered, undelivered = self._deliver(taken, recovery=True)
        if undelivered:
            storage.release_dispatches([d.id for d in undelivered])
        return SweepReport(delivered=len(delivered), failed=len(undelivered))

    def _end_dead_leases(self, now: datetime) -> list[Task]:
        """End the leases of the owners known dead now; the tasks whose lease ended."""
        owners = self.dead_owners(now) if self.dead_owners is not None else ()
        if not owners:
            return []
        ended = self.kernel.storage.end_leases(owners, now)
        for owner, count in sorted(Counter(t.lease_owner for t in ended).items()):
            log.info("sweep: %s is dead; its %d lease(s) end now", owner, count)
        return ended

    def resume(self) -> SweepReport:
        """What a starting worker runs: the sweep, after making due at once every task
        that an earlier worker found blocked and that this kernel's registry can now
        run (a compatible definition was deployed). Rows of tasks still blocked keep
        their backoff."""
        storage, registry = self.kernel.storage, self.kernel.registry
        blocked = storage.blocked_tasks(self.batch)
        ready = [t.id for t in blocked if not isinstance(registry.resolve(t), Blocked)]
        if ready:
            storage.retry_dispatches(ready)
        return self.sweep()

    def _bursts(self, rows: list[Dispatch], *, backlog: bool = False) -> set[str]:
        """The queues with more than ``messages`` of ``rows`` (more than one, for a
        ``backlog``): each gets queue messages."""
        if self.advance_queue is None:
            return set()
        counts = Counter(row.queue for row in rows)
        most = 1 if backlog else self.messages
        return {queue for queue, n in counts.items() if n > most}

    def _deliver(
        self, rows: list[Dispatch], *, recovery: bool = False, backlog: bool = False
    ) -> tuple[list[Dispatch], list[Dispatch]]:
        """Send rows in order until the broker fails: (delivered, not delivered). The
        rows of a burst's queue are delivered by the queue messages sent at its first row.

        A ``backlog`` (held rows that no listening worker claimed within the grace: the
        workers are busy) of more than one row of a queue is a burst with one queue
        message: a message per row would have the busy workers take each through the
        broker after its announcement, most of them finding it claimed already, where
        one worker claims the rows in order from storage, their endings committed
        together, while the others go on from their announcements."""
        storage = self.kernel.storage
        burst = self._bursts(rows, backlog=backlog)
        queue_messages = 1 if backlog else max(1, self.messages)
        sent: set[str] = set()
        for index, row in enumerate(rows):
            queue = recovery_queue(row.queue) if recovery else row.queue
            try:
                if row.queue not in burst:
                    self.deliver(row.task_id, queue)
                elif row.queue not in sent:
                    assert self.advance_queue is not None
                    # Marked before any queue message is sent, so that its worker finds
                    # them (unless their commit marked them, :meth:`outgoing`).
                    unmarked = [r.id for r in rows if r.queue == row.queue and not r.woken]
                    if unmarked:
                        storage.mark_burst(unmarked)
                    for _ in range(queue_messages):  # messages=0: one a burst
                        self.advance_queue(queue)
                    sent.add(row.queue)
            except Exception:
                log.warning("could not deliver %s for %s", row.id, row.task_id, exc_info=True)
                return rows[:index], rows[index:]  # the broker is likely down: next sweep
        return rows, []


def announced_row(row: Dispatch) -> bool:
    """A row its commit wrote taken for a message of its own (:meth:`Dispatcher.outgoing`):
    what a storage that announces tells listening workers about."""
    return row.delivered_at is not None and not row.woken


TOGETHER = 0.2
"""The share of the grace by which a held row may go early, with rows already due."""


class HeldMessages:
    """Rows whose messages wait ``grace`` seconds after their commit, then go to
    ``send`` from a thread of this process's own, oldest first; what is still held when
    the process exits is sent then."""

    def __init__(
        self, grace: float, send: Callable[[list[Dispatch]], None],
        on_exit: Callable[[], None] = lambda: None,
    ) -> None:
        self.grace = grace
        self.send = send
        self.on_exit = on_exit
        self._queue: deque[tuple[float, list[Dispatch]]] = deque()
        self._ready = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._sending = threading.Lock()  # a flush waits for a send in progress

    def add(self, rows: list[Dispatch]) -> None:
        with self._ready:
            idle = not self._queue
            self._queue.append((time.monotonic() + self.grace, rows))
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="held-messages",
                                                daemon=True)
                self._thread.start()
                atexit.register(self.flush)
            # Every row waits the same grace, so a row added behind others is due after
            # them: the thread, already waiting for the oldest, need not wake for it (a
            # wake per commit would take the interpreter from the committing thread).
            if idle:
                self._ready.notify()

    def flush(self) -> None:
        with self._sending:
            self._send(self._take(everything=True))

    def close(self) -> None:
        with self._ready:
            self._closed = True
            self._ready.notify()
            thread = self._thread
        if thread is not None:
            thread.join()
        self.flush()

    def _take(self, *, everything: bool = False) -> list[Dispatch]:
        with self._ready:
            due: list[Dispatch] = []
            # Rows due within a share of the grace go with those due now: one look-up of
            # which were claimed for several commits' rows, not one for each commit.
            now = time.monotonic() + self.grace * TOGETHER
            while self._queue and (everything or self._queue[0][0] <= now):
                due.extend(self._queue.popleft()[1])
            return due

    def _loop(self) -> None:
        try:
            while True:
                with self._ready:
                    while not self._queue and not self._closed:
                        self._ready.wait()
                    if self._closed:
                        return
                    wait = self._queue[0][0] - time.monotonic()
                    if wait > 0:
                        self._ready.wait(wait)
                with self._sending:
                    self._send(self._take())
        finally:
            self.on_exit()

    def _send(self, rows: list[Dispatch]) -> None:
        if not rows:
            return
        try:
            self.send(rows)
        except Exception:  # never the thread's end: the sweep re-sends what this missed
            log.warning("sending %d held dispatches failed", len(rows), exc_info=True)
