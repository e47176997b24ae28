"""The bridge between a kernel phase and the agent's event loop.

A phase is synchronous and owns the worker's thread: its storage connection, its lease
and its draft belong to that thread (the Postgres storage refuses to run under a running
event loop). A Pydantic AI run is a coroutine. So the run gets an event loop on a thread
of its own, and every durable write or read it needs (a journal lookup, an intent, a
result) is handed back to the phase's thread and awaited: the kernel is only ever
touched from the thread that claimed the task.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import queue
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

_Request = tuple[Callable[[], Any], "concurrent.futures.Future[Any]"]


class Bridge:
    def __init__(self) -> None:
        self._requests: queue.SimpleQueue[_Request | None] = queue.SimpleQueue()
        self.failure: BaseException | None = None
        """The first error a phase-side call raised (a lost lease, a lost connection):
        raised again from :meth:`serve`, so the worker sees it as from any phase."""

    async def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the phase's thread and wait for its answer (from the agent's loop)."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._requests.put((fn, future))
        return await asyncio.wrap_future(future)

    def post(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` on the phase's thread without waiting for it: it runs before any
        later call (the phase's thread takes them in order), and if it fails, every
        later call fails and :meth:`serve` raises its error."""
        self._requests.put((fn, concurrent.futures.Future()))

    def call_sync(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the phase's thread and block until it answers (from a tool that
        runs in a thread of its own, or any thread but the phase's)."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._requests.put((fn, future))
        return future.result()

    def serve(self, main: Callable[[], Coroutine[Any, Any, T]],
              context: contextvars.Context) -> T:
        """Run ``main()`` on a loop of its own thread (in ``context``), answering its calls
        here until it ends; its result, or what it raised."""
        outcome: dict[str, Any] = {}

        def agent_thread() -> None:
            try:
                outcome["value"] = context.run(asyncio.run, main())
            except BaseException as exc:  # handed to the phase's thread as it is
                outcome["error"] = exc
            finally:
                self._requests.put(None)

        thread = threading.Thread(target=agent_thread, name="agent-run", daemon=True)
        thread.start()
        while (request := self._requests.get()) is not None:
            fn, future = request
            if not future.set_running_or_notify_cancel():
                continue
            if self.failure is not None:  # nothing more is written once one write failed
                future.set_exception(self.failure)
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:
                if self.failure is None:
                    self.failure = exc
                future.set_exception(exc)
        thread.join()
        if self.failure is not None:
            raise self.failure
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]  # type: ignore[no-any-return]
