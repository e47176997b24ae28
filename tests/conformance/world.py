"""The storage-under-test harness: crash simulation, fault injection, restarts."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kernel import Kernel, ManualClock, Registry, Scheduler


@dataclass
class Faults:
    """Raises at chosen storage points; the hook every conformance storage is built with."""

    armed: dict[str, BaseException] = field(default_factory=dict)
    seen: list[str] = field(default_factory=list)

    def __call__(self, point: str) -> None:
        self.seen.append(point)
        error = self.armed.pop(point, None)
        if error is not None:
            raise error


@dataclass
class World:
    """One storage under test plus the means to restart everything above it."""

    make_storage: Callable[[], Any]
    faults: Faults
    clock: ManualClock
    storage: Any = None

    def __post_init__(self) -> None:
        self.storage = self.make_storage()

    def kernel(self, registry: Registry) -> Kernel:
        return Kernel(self.storage, registry, self.clock)

    def reopen(self) -> Any:
        """Forget every in-memory handle; keep only what storage holds."""
        self.storage = self.make_storage()
        return self.storage

    def scheduler(
        self, registry: Registry, worker_id: str = "w1", lease: float = 30.0
    ) -> Scheduler:
        return Scheduler(self.kernel(registry), worker_id, lease)
