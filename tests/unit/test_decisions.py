"""Task definitions declare the answers an operator may give them; the registry says
which apply to a task right now."""

from __future__ import annotations

import pytest

from kernel import (
    Decision,
    Draft,
    InMemoryStorage,
    Kernel,
    ManualClock,
    Receipt,
    Registry,
    Run,
    Scheduler,
    Status,
    TaskDefinition,
    Transition,
)

CONFIRMED = Decision("done", "It was done", "done", description="Record it as done.")
AGAIN = Decision(
    "not_done_do_again", "Not done: do it again", "again", may_repeat="the call is made again"
)
STOP = Decision("stop", "Stop", "stop")


def make_registry() -> Registry:
    registry = Registry()

    @registry.task("uncertain")
    class Uncertain:
        """Waits for an operator's answer, then for one subtask, then finishes."""

        initial = "ask"
        decisions = (CONFIRMED, AGAIN, STOP)

        def ask(self, run: Run) -> Transition:
            return run.wait_for("answer", then="answered")

        def answered(self, run: Run) -> Transition:
            if run.signal("answer")["decision"] == AGAIN.value:
                return run.wait_all([run.spawn("plain", {})], then="done")
            return self.done(run)

        def done(self, run: Run) -> Transition:
            return run.succeed(run.signal("answer")["decision"])

    @registry.task("plain")
    class Plain:
        """A definition without decisions: it waits on a signal all the same."""

        initial = "ask"

        def ask(self, run: Run) -> Transition:
            return run.wait_for("go", then="done")

        def done(self, run: Run) -> Transition:
            return run.succeed()

    return registry


def test_a_task_class_declares_its_decisions_and_a_plain_one_has_none() -> None:
    registry = make_registry()
    assert registry.latest("uncertain").decisions == (CONFIRMED, AGAIN, STOP)
    assert registry.latest("plain").decisions == ()
    assert "decisions" not in registry.latest("uncertain").phases
    assert AGAIN.may_repeat == "the call is made again" and CONFIRMED.may_repeat is None
    assert (STOP.label, STOP.value, STOP.description) == ("Stop", "stop", "")


def test_two_decisions_may_share_neither_a_name_nor_a_value() -> None:
    phases = {"go": lambda run: run.succeed()}
    for twins in ((STOP, Decision("stop", "Halt", "halt")), (STOP, Decision("halt", "H", "stop"))):
        with pytest.raises(ValueError, match="two decisions"):
            TaskDefinition("k", 1, phases, "go", decisions=twins)


def test_decisions_apply_only_while_the_task_waits_on_a_signal() -> None:
    registry = make_registry()
    kernel = Kernel(InMemoryStorage(), registry, ManualClock())
    handle = kernel.create_session()
    draft = Draft()
    task_id = draft.create_task("uncertain", {})
    plain_id = draft.create_task("plain", {})
    handle.commit(draft)
    assert registry.decisions(kernel.task(task_id)) == ()  # pending

    scheduler = Scheduler(kernel, "w1", 30.0)
    scheduler.run_until_idle()
    task = kernel.task(task_id)
    assert task.status is Status.WAITING and task.wait == {"signal": "answer"}
    assert registry.decisions(task) == (CONFIRMED, AGAIN, STOP)
    assert registry.decisions(kernel.task(plain_id)) == ()  # waits, but declares none

    answer = Draft(actor="user:olga")
    answer.signal(task_id, "answer", {"decision": AGAIN.value})
    handle.commit(answer)
    scheduler.run_until_idle()
    task = kernel.task(task_id)
    assert task.status is Status.WAITING and task.waits_on.kind == "tasks"
    assert registry.decisions(task) == ()  # waiting on tasks, not on an operator

    [child] = task.waits_on.task_ids
    go = Draft()
    go.signal(child, "go", {})
    handle.commit(go)
    scheduler.run_until_idle()
    task = kernel.task(task_id)
    assert task.outcome == {"kind": "succeeded", "result": "again"}
    assert registry.decisions(task) == ()  # terminal


def test_a_task_no_definition_can_run_offers_no_decisions() -> None:
    registry = make_registry()
    kernel = Kernel(InMemoryStorage(), registry, ManualClock())
    handle = kernel.create_session()
    draft = Draft()
    task_id = draft.create_task("uncertain", {})
    handle.commit(draft)
    Scheduler(kernel, "w1", 30.0).run_until_idle()
    waiting = kernel.task(task_id)
    assert registry.decisions(waiting) != ()
    assert Registry().decisions(waiting) == ()  # blocked: nobody knows what answers mean


def test_a_decision_takes_the_receipt_it_declares_and_no_other() -> None:
    proof = Decision("sent", "Sent", "sent", receipt=Receipt(required=("id",),
                                                               optional=("at",)))
    proof.check_receipt(None)  # not needed
    proof.check_receipt({"id": "m-1"})
    proof.check_receipt({"id": "m-1", "at": "noon"})
    for receipt, named in [({}, "receipt.id"), ({"id": "m", "x": "y"}, "receipt.x"),
                           ({"id": 1}, "receipt.id"), ({"id": "m" * 501}, "receipt.id"),
                           (["id"], "receipt")]:
        with pytest.raises(ValueError, match=rf"^{named}:"):
            proof.check_receipt(receipt)
    with pytest.raises(ValueError, match="^receipt: this decision needs one"):
        Decision("sent", "Sent", "sent", receipt=Receipt(("id",), needed=True)).check_receipt(None)
    with pytest.raises(ValueError, match="^receipt: the decision 'stop' takes none"):
        STOP.check_receipt({"id": "m-1"})
    STOP.check_receipt(None)
