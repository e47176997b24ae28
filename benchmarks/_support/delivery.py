"""A kernel whose commits hand their dispatches to a run's own Redis database, as the
API's commits hand them to the broker.
"""

from __future__ import annotations

import threading
from typing import Any


class ThreadProducers:
    """A broker connection and producer per thread that sends, on the Redis at ``url``.

    kombu's connections and channels are not thread-safe: client threads that commit
    side by side, and the dispatcher's thread for held messages, each send on their
    own. ``release`` closes them all."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._local = threading.local()
        self._connections: list[Any] = []
        self._lock = threading.Lock()

    def producer(self) -> Any:
        from kombu import Connection, Producer

        producer = getattr(self._local, "producer", None)
        if producer is None:
            connection = Connection(self.url)
            producer = self._local.producer = Producer(connection)
            with self._lock:
                self._connections.append(connection)
        return producer

    def release(self) -> None:
        with self._lock:
            connections, self._connections = self._connections, []
        for connection in connections:
            connection.release()


def delivering_kernel(redis_url: str) -> tuple[Any, ThreadProducers]:
    """A kernel on the project's storage, registry and clock whose commits hand their
    dispatches to the broker at ``redis_url`` (producers of its own, one per sending
    thread, not the Celery app's configured broker), as the API's commits do; and those
    producers, for the caller to release."""
    from controlplane.reference.registry import build_registry
    from controlplane.storage import PostgresStorage
    from controlplane.storage.clock import DatabaseClock
    from controlplane.worker.execution import advance, advance_queue
    from controlplane.worker.runtime import dispatcher_of
    from kernel import Kernel

    broker = ThreadProducers(redis_url)

    def deliver(task_id: str, queue: str) -> None:
        advance.apply_async(args=[task_id], queue=queue, retry=False, producer=broker.producer())

    def send_advance_queue(queue: str) -> None:
        advance_queue.apply_async(args=[queue], queue=queue, retry=False,
                                  producer=broker.producer())

    kernel = Kernel(PostgresStorage(), build_registry(), DatabaseClock())
    dispatcher_of(kernel, deliver, send_advance_queue).attach()
    return kernel, broker
