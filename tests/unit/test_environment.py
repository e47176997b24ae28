"""What a run's recorded environment and a worker's offer differ in (kernel.environment):
a missing or changed need is a difference, an addition is not, and a task whose input its
definition cannot read is still created (its phases say what is wrong)."""

from __future__ import annotations

from kernel import Draft, InMemoryStorage, Kernel, Registry, Run, Scheduler, Transition
from kernel.environment import ENVIRONMENT, differences, offered


def test_missing_and_changed_needs_differ_and_additions_do_not() -> None:
    was = {"kernel": "1", "definition": "k v1", "tool a": {"parameters": "x"},
           "tool b": "y", "model m": None}
    now = {"kernel": "1", "definition": "k v2", "tool a": {"parameters": "z"},
           "tool c": "new"}
    assert differences(was, now) == [
        "tool a: parameters z here, it was started with parameters x",
        "tool b: missing here (it was started with y)",
    ]
    assert differences(was, {**was, "tool c": "new"}) == []


def test_a_need_recorded_with_fewer_details_than_offered_is_met_by_the_ones_it_named() -> None:
    """A run recorded a tool as a kernel of an earlier deploy described it; a worker whose
    kernel describes tools by more (whether they ask for approval, say) offers what the
    run recorded plus that: compatible, as a tool added is. A detail it recorded that is
    changed or gone still differs."""
    was = {"tool a": {"parameters": "x", "replay": "safe"}}
    more = {"tool a": {"parameters": "x", "replay": "safe", "prior approval": "none"}}
    assert differences(was, more) == []
    assert differences(was, {"tool a": {**more["tool a"], "replay": "unsafe"}}) == [
        "tool a: parameters x, prior approval none, replay unsafe here, it was started "
        "with parameters x, replay safe"]
    assert differences(was, {"tool a": {"parameters": "x"}}) == [
        "tool a: parameters x here, it was started with parameters x, replay safe"]


def test_a_task_whose_needs_cannot_be_read_is_created_and_its_phase_says_why() -> None:
    registry = Registry()

    @registry.task("reader")
    class Reader:
        initial = "read"

        def needs(self, input: dict, checkpoint: dict) -> dict:
            return {f"tool {input['call']['name']}": "x"}

        def read(self, run: Run) -> Transition:
            if "call" not in run.input:
                return run.fail("no call in the input")
            return run.succeed()

    kernel = Kernel(InMemoryStorage(), registry)
    handle = kernel.create_session()
    draft = Draft()
    task_id = draft.create_task("reader", {"nothing": 1})
    handle.commit(draft)
    assert kernel.task(task_id).checkpoint[ENVIRONMENT]["needs"] == "unreadable (KeyError)"
    Scheduler(kernel).run_until_idle()
    assert kernel.task(task_id).outcome["error"] == "no call in the input"
    assert offered("reader", 1, None, {}, {}) == {"kernel": "1", "definition": "reader v1"}


def test_a_turn_whose_model_is_not_configured_on_the_worker_is_blocked_there() -> None:
    from kernel import Worker
    from kernel.agent import ModelResponse, ScriptedProvider, Toolbox, register_agent, submit
    from kernel.environment import BLOCKED_DOCUMENT

    storage = InMemoryStorage()
    provider = ScriptedProvider(responses=[ModelResponse("Hello.")])

    def kernel_with(models: dict) -> Kernel:
        registry = Registry()
        register_agent(registry, models, Toolbox(), "scripted")
        return Kernel(storage, registry)

    before = kernel_with({"scripted": provider})
    handle = before.create_session()
    draft = Draft()
    conversation = draft.create_conversation()
    handle.commit(draft)
    submitted = submit(handle, conversation, {"text": "hi"}, "req-1")
    turn = before.document(handle.id, "agent-conversation", conversation)["active"]

    without = kernel_with({"other": provider})
    assert not Worker(without, "w2").advance(turn)
    report = without.document(handle.id, BLOCKED_DOCUMENT, turn)
    assert report["differences"] == [
        "model scripted: missing here (it was started with configured)"]
    assert provider.requests == []

    assert Worker(before, "w1").advance(turn)  # a worker that has it runs it
    assert before.storage.submission(submitted.submission.id).status.settled
    assert len(provider.requests) == 1
