"""The announcement reader: an idle worker starts a task the moment the commit that made
it due is made, not when the broker's message for it arrives.

Each worker process LISTENs on the due channel (:mod:`controlplane.storage.due`) on a
connection of its own, from a thread of its own. For each task announced there on a queue
the process consumes, the reader takes one of the process's slots (a solo worker has
one), claims the task in one statement and runs it as the ``advance`` message would. The
Celery tasks take a slot too (:func:`busy`), so the process never runs more phases at
once than its pool's concurrency.

The committer holds the task's message for a grace and sends it unless a worker claimed
the task meanwhile (``kernel.dispatch.HeldMessages``), and the sweep still re-sends a row
whose task was not claimed. A reader whose slots are all taken waits for one until the
announcement's grace is over, then leaves the task to its message: a worker that ends its
phase within the grace takes the next task from Postgres, and the message that would have
made it take the same task through the broker is not sent. Under a steady stream of
tasks that is most of them, and the broker's round trips and the worker's handling of
each message are what a task then does not cost. A reader reconnecting after Postgres
restarted, a slow claim or a busy process leave the task to its message, which finds it
claimed (one statement) or claims it. Every idle worker tries each announcement and the
claim in Postgres lets one win, so N idle workers cost N - 1 claims that find nothing.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections

from controlplane.storage import due

log = logging.getLogger(__name__)

RECONNECT_SECONDS = 1.0
"""How long the reader waits before it connects again after its connection failed;
doubled after each failure to connect, up to ``RECONNECT_MAX_SECONDS``."""
RECONNECT_MAX_SECONDS = 30.0
STARTED = "announcement reader: %s started from an announcement"
"""Logged for each task the reader ran (as Celery logs each message it ran)."""
POLL_SECONDS = 1.0
"""How often the reader looks up from its connection to see whether it must stop."""
WAITING_SECONDS = 0.001
"""An announcement the connection yields sooner than this after being asked had waited
there while the reader was busy."""


class AnnouncementReader:
    """Runs announced tasks of ``queues`` through ``advance(task_id)`` (which claims with
    ``announced=True``) when one of ``slots`` is free, or frees within ``grace`` seconds
    of the announcement (the committer's hold on its message), and ``may_claim()`` says
    so (not draining). ``began``/``ended(failed)`` count what it runs, as the worker
    registry counts messages."""

    def __init__(
        self,
        queues: set[str],
        slots: threading.Semaphore,
        advance: Callable[[str], bool],
        may_claim: Callable[[], bool],
        *,
        grace: float = 0.0,
        began: Callable[[], None] = lambda: None,
        ended: Callable[[bool], None] = lambda failed: None,
    ) -> None:
        self.queues = queues
        self.slots = slots
        self.advance = advance
        self.may_claim = may_claim
        self.grace = grace
        self.began, self.ended = began, ended
        self.ran = 0
        self.left = 0
        """Announcements left to their tasks' messages because every slot was busy past
        the grace."""
        self.listening = threading.Event()
        self._stop = threading.Event()
        self._conn: Any = None
        self._thread = threading.Thread(target=self._loop, name="announcement-reader", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Stop listening; wait up to ``timeout`` for a task it is running."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _loop(self) -> None:
        wait = RECONNECT_SECONDS
        try:
            while not self._stop.is_set():
                try:
                    self._listen()
                except Exception:
                    if self.listening.is_set():
                        wait = RECONNECT_SECONDS  # it had worked: try again soon
                    self.listening.clear()
                    log.warning("announcement reader: no connection; the broker's messages still "
                                "deliver; listening again in %.0fs", wait, exc_info=True)
                    self._close()
                    self._stop.wait(wait)
                    wait = min(wait * 2, RECONNECT_MAX_SECONDS)
        finally:
            self._close()
            connections.close_all()  # this thread's: it ends with the process

    def _listen(self) -> None:
        db = connections[DEFAULT_DB_ALIAS]
        self._conn = conn = db.get_new_connection(db.get_connection_params())
        conn.autocommit = True
        conn.execute(due.LISTEN)
        self.listening.set()
        # An announcement that waited in the connection while the reader was busy is
        # counted as heard when the reader last heard one as it came: no later than it
        # was sent, so that its grace is not counted twice (the committer's message for
        # it may be on its way), and so that a reader busy behind a long phase skips
        # what piled up meanwhile rather than waiting out a grace for each.
        heard = 0.0
        while not self._stop.is_set():
            asked = time.monotonic()
            for notification in conn.notifies(timeout=POLL_SECONDS):
                now = time.monotonic()
                if now - asked >= WAITING_SECONDS:
                    heard = now
                self.on_announcement(notification.payload, heard=heard)
                if self._stop.is_set():
                    return
                asked = time.monotonic()

    def on_announcement(self, payload: str, heard: float | None = None) -> None:
        """Try each task of the announcement (heard at ``heard``, ``time.monotonic()``)
        that this worker's queues carry, while a slot is free or frees within the grace;
        the rest are left to their messages."""
        until = (time.monotonic() if heard is None else heard) + self.grace
        for queue, task_id in due.parse(payload):
            if queue not in self.queues:
                continue
            if not self._slot(until):
                if self.may_claim():
                    self.left += 1
                return  # busy past the grace (or draining): the messages deliver
            try:
                self._run(task_id)
            finally:
                self.slots.release()

    def _slot(self, until: float) -> bool:
        """Take a slot, waiting for one until ``until`` (``time.monotonic()``) at most;
        none while draining or stopping."""
        while self.may_claim() and not self._stop.is_set():
            left = until - time.monotonic()
            if self.slots.acquire(timeout=min(max(left, 0.0), POLL_SECONDS)):
                if self.may_claim():
                    return True
                self.slots.release()  # it began to drain while this waited
                return False
            if left <= POLL_SECONDS:
                return False
        return False

    def _run(self, task_id: str) -> None:
        self.began()
        failed = False
        try:
            if self.advance(task_id):
                self.ran += 1
                log.info(STARTED, task_id)
        except Exception:
            failed = True
            log.exception("announcement reader: advancing %s failed; its message delivers it",
                          task_id)
        finally:
            self.ended(failed)

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()


_slots: threading.Semaphore | None = None
"""This process's slots, once its reader runs: the Celery tasks take one each."""


def open_slots(concurrency: int) -> threading.Semaphore:
    global _slots
    _slots = threading.BoundedSemaphore(max(1, concurrency))
    return _slots


@contextlib.contextmanager
def busy() -> Iterator[None]:
    """Hold one of this process's slots while a Celery task runs phases, so that its
    reader starts nothing meanwhile. Without a reader (web processes, tests that
    call a task directly) there is nothing to hold."""
    slots = _slots
    if slots is None:
        yield
        return
    with slots:
        yield
