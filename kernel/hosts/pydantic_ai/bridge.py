"""The bridge between a kernel phase and the agent's event loop.

A phase is synchronous and owns the worker's thread: its storage connection, its lease
and its draft belong to that thread. A Pydantic AI run is a coroutine. So the run gets
an event loop on the phase's own thread, and every durable write or read it needs (a
journal lookup, an intent, a result) is made there, synchronously, from a coroutine of
that loop: the loop waits for it as it would wait for the answer of another thread, and
the kernel is only ever touched from the thread that claimed the task, with no hop
between threads per unit. While such a call runs, the thread is marked as running no
loop (the Postgres storage refuses to run under a running event loop, which here runs
nothing else meanwhile).

A phase whose thread already runs a loop (a caller inside async code) cannot run
another there: the run then gets a loop on a thread of its own, and every call is
handed back to the phase's thread and awaited.

A tool that runs in a thread of its own (a sync function) reaches the phase's thread
through :meth:`Bridge.call_sync` either way.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import queue
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

_Request = tuple[Callable[[], Any], "concurrent.futures.Future[Any]"]


def loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class Bridge:
    def __init__(self) -> None:
        self._requests: queue.SimpleQueue[_Request | None] = queue.SimpleQueue()
        self._phase_thread: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.inline = False
        """Whether the run's loop is on the phase's thread (set by :meth:`serve`)."""
        self.failure: BaseException | None = None
        """The first error a phase-side call raised (a lost lease, a lost connection):
        raised again from :meth:`serve`, so the worker sees it as from any phase."""

    def _here(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the phase's thread, from the loop's own, as outside the loop."""
        if self.failure is not None:  # nothing more is written once one write failed
            raise self.failure
        # The storage refuses to run under a running event loop (Django's async-unsafe
        # check looks for one on the thread): the loop is paused here while ``fn`` runs,
        # so it is not running, and asyncio's own hook for that (as loops in C use it)
        # says so for the call.
        loop = asyncio._get_running_loop()
        asyncio._set_running_loop(None)
        try:
            return fn()
        except BaseException as exc:
            self.failure = exc
            raise
        finally:
            asyncio._set_running_loop(loop)

    async def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the phase's thread and wait for its answer (from the agent's loop)."""
        if self.inline:
            return self._here(fn)
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._requests.put((fn, future))
        return await asyncio.wrap_future(future)

    def post(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` on the phase's thread without waiting for it where the loop has a
        thread of its own (it runs before any later call: the phase's thread takes them
        in order), now where the loop is on the phase's thread. If it fails, every later
        call fails and :meth:`serve` raises its error."""
        if self.inline:
            # An error is kept in self.failure: raised by every later call and by serve.
            with contextlib.suppress(Exception):
                self._here(fn)
            return
        self._requests.put((fn, concurrent.futures.Future()))

    def call_sync(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the phase's thread and block until it answers (from a tool that
        runs in a thread of its own, or any thread but the phase's)."""
        if threading.get_ident() == self._phase_thread:
            return self._here(fn) if loop_running() else fn()
        if self.inline:
            loop = self._loop
            assert loop is not None
            answer: concurrent.futures.Future[T] = concurrent.futures.Future()

            def on_loop() -> None:
                try:
                    answer.set_result(self._here(fn))
                except BaseException as exc:
                    answer.set_exception(exc)

            loop.call_soon_threadsafe(on_loop)
            return answer.result()
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._requests.put((fn, future))
        return future.result()

    def serve(self, main: Callable[[], Coroutine[Any, Any, T]],
              context: contextvars.Context) -> T:
        """Run ``main()`` on a loop (in ``context``), on this thread if it runs none,
        answering its calls here until it ends; its result, or what it raised."""
        self._phase_thread = threading.get_ident()
        if not loop_running():
            self.inline = True

            async def with_loop() -> T:
                self._loop = asyncio.get_running_loop()
                return await main()

            try:
                value = context.run(asyncio.run, with_loop())
            except BaseException:
                if self.failure is not None:
                    raise self.failure from None
                raise
            if self.failure is not None:
                raise self.failure
            return value
        return self._serve_threaded(main, context)

    def _serve_threaded(self, main: Callable[[], Coroutine[Any, Any, T]],
                        context: contextvars.Context) -> T:
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
