"""A task whose environment a worker does not offer: a paying task created under one
schema of its pay tool, and workers with another schema that leave it blocked with a
report (:mod:`kernel.environment`)."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.worker.runtime import runtime
from kernel import Draft, Kernel, Registry, Run, SessionHandle, Transition, Worker

KIND = "env-paying"
JSON = Any


def paying(registry: Registry, schema: str) -> None:
    @registry.task(KIND)
    class Paying:
        initial = "pay"

        def needs(self, input: JSON, checkpoint: JSON) -> dict[str, JSON]:
            return {"tool pay": schema}

        def pay(self, run: Run) -> Transition:
            return run.succeed("paid")


def started(monkeypatch: pytest.MonkeyPatch) -> tuple[Kernel, SessionHandle, str]:
    """A paying task created under schema 1 (nothing delivered: the test runs workers)."""
    kernel = runtime().kernel
    monkeypatch.setattr(runtime().dispatcher, "deliver", lambda task, queue: None)
    if KIND not in kernel.registry.kinds():
        paying(kernel.registry, "1")
    handle = kernel.create_session()
    draft = Draft(actor="user:ann")
    task_id = draft.create_task(KIND, {})
    handle.commit(draft)
    return kernel, handle, task_id


def blocked_by(kernel: Kernel, task_id: str, worker: str = "w2", schema: str = "2") -> None:
    """Worker ``worker``, whose pay tool has ``schema``, leaves the task blocked (and
    reports so, rewriting another worker's report on the task as it is)."""
    changed = Registry()
    paying(changed, schema)
    assert not Worker(Kernel(kernel.storage, changed), worker).advance(task_id)
