"""The announcement reader: an idle worker starts a task the moment the commit that made
it due is made, not when the broker's message for it arrives.

Each worker process LISTENs on the due channel (:mod:`controlplane.storage.due`) on a
connection of its own, from a thread of its own. For each task announced there on a queue
the process consumes, if the process has a free slot (a solo worker that is not running
anything), the reader takes the slot, claims the task in one statement and runs it as
the ``advance`` message would. The Celery tasks take a slot too (:func:`busy`), so the
process never runs more phases at once than its pool's concurrency.

Only the start is hastened; delivery is what it was. The committer holds the task's
message for a short grace and sends it unless a worker claimed the task meanwhile
(``kernel.dispatch.HeldMessages``), and the sweep still re-sends a row whose task was not
claimed: a busy worker, a reader reconnecting after Postgres restarted, a slow claim,
all leave the task to its message, which finds it claimed (one statement) or claims it.
Every idle worker tries each announcement and the claim in Postgres lets one win, so N idle
workers cost N - 1 claims that find nothing.
"""

from __future__ import annotations

import contextlib
import logging
import threading
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


class AnnouncementReader:
    """Runs announced tasks of ``queues`` through ``advance(task_id)`` (which claims with
    ``announced=True``) while one of ``slots`` is free and ``may_claim()`` says so (not
    draining). ``began``/``ended(failed)`` count what it runs, as the worker registry
    counts messages."""

    def __init__(
        self,
        queues: set[str],
        slots: threading.Semaphore,
        advance: Callable[[str], bool],
        may_claim: Callable[[], bool],
        *,
        began: Callable[[], None] = lambda: None,
        ended: Callable[[bool], None] = lambda failed: None,
    ) -> None:
        self.queues = queues
        self.slots = slots
        self.advance = advance
        self.may_claim = may_claim
        self.began, self.ended = began, ended
        self.ran = 0
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
        while not self._stop.is_set():
            for notification in conn.notifies(timeout=POLL_SECONDS):
                self.on_announcement(notification.payload)
                if self._stop.is_set():
                    return

    def on_announcement(self, payload: str) -> None:
        """Try each task of the announcement that this worker's queues carry, while a slot is
        free; the rest are left to their messages."""
        for queue, task_id in due.parse(payload):
            if queue not in self.queues:
                continue
            if not self.may_claim() or not self.slots.acquire(blocking=False):
                return  # busy (or draining): the messages deliver
            try:
                self._run(task_id)
            finally:
                self.slots.release()

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
