"""The web process's kernel with the task kinds the API tests drive (``api-step``, which
fails, sleeps (``sleeps`` times) or asks as its input says, and ``api-parent``) and no
broker, and a task of one of them started in a new session."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.worker.runtime import runtime
from kernel import (
    Decision,
    Draft,
    Kernel,
    Receipt,
    Run,
    Scheduler,
    Transition,
)


def with_test_kinds(monkeypatch: pytest.MonkeyPatch) -> Kernel:
    """The web process's kernel, with test task kinds and no broker (no worker runs here)."""
    built = runtime().kernel
    monkeypatch.setattr(runtime().dispatcher, "deliver", lambda task, queue: None)
    registry = built.registry
    if "api-step" not in registry.kinds():

        @registry.task("api-step")
        class Step:
            initial = "go"
            decisions = (Decision("sent", "It was done", "sent",
                                  receipt=Receipt(required=("id",))),
                         Decision("give_up", "Give up", "give_up"))

            def go(self, run: Run) -> Transition:
                if run.input.get("fail"):
                    return run.fail("asked to")
                if run.input.get("sleep"):
                    return run.sleep(3600, then="done")
                if run.input.get("ask"):
                    return run.wait_for("resolution-1", then="done")
                return run.succeed("ok")

            def done(self, run: Run) -> Transition:
                slept = run.checkpoint.get("slept", 1)
                if slept < run.input.get("sleeps", 1):  # woken: sleeps again
                    return run.sleep(3600, then="done", checkpoint={"slept": slept + 1})
                return run.succeed(run.signal("resolution-1"))

        @registry.task("api-parent")
        class Parent:
            initial = "fan"

            def fan(self, run: Run) -> Transition:
                kids = [run.spawn("api-step", {"ask": True}) for _ in range(run.input["n"])]
                return run.wait_all(kids, then="end")

            def end(self, run: Run) -> Transition:
                return run.succeed(run.outcomes())

    return built


def start(kernel: Kernel, kind: str, input: dict[str, Any]) -> tuple[str, str]:
    handle = kernel.create_session()
    draft = Draft(actor="user:test")
    task_id = draft.create_task(kind, input)
    handle.commit(draft)
    Scheduler(kernel).run_until_idle()
    return handle.id, task_id
