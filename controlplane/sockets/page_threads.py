"""The live pages' own threads: they read and render pages for the page sockets, beside
Channels' one database thread (each with a database connection of its own), so that a
heavy page's render holds up neither the feeds' reads, the sockets' sign-ins, nor the
other pages' renders."""

from __future__ import annotations

import gc
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from channels.db import DatabaseSyncToAsync

PAGE_THREADS = 4
"""Threads that read and render the live pages, beside Channels' one database thread
(each with a database connection of its own): a heavy page's render holds up neither
the feeds' reads, the sockets' sign-ins, nor the other pages' renders."""

PAGE_THREAD_PREFIX = "live-page"
_page_threads = ThreadPoolExecutor(PAGE_THREADS, thread_name_prefix=PAGE_THREAD_PREFIX)


def on_page_thread(func: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
    """``func`` run on a live-page thread (old database connections closed around it,
    as :func:`channels.db.database_sync_to_async` does)."""
    return DatabaseSyncToAsync(func, thread_sensitive=False, executor=_page_threads)


def end_page_threads() -> None:
    """End the live-page threads, and with them their database connections (a thread's
    connection goes with the thread); the next read starts new ones. For whoever must
    see the database without this process's connections: a test dropping its database."""
    global _page_threads
    if not any(t.name.startswith(PAGE_THREAD_PREFIX) for t in threading.enumerate()):
        return  # no page read since the last end: no thread, no connection (and no gc pass)
    ended, _page_threads = (
        _page_threads, ThreadPoolExecutor(PAGE_THREADS, thread_name_prefix=PAGE_THREAD_PREFIX))
    ended.shutdown(wait=True)
    gc.collect()  # a connection closes when its thread's locals are collected
