"""A turn branched from one of its model responses (kernel.agent.branches), on the
reference storage: the model is asked only from the branch point on (counted at the
scripted model), the response's tool calls are made anew as new calls, and the original
conversation and turn stay as they were."""

from __future__ import annotations

import pytest

from kernel import IllegalTransition, SubmissionStatus
from kernel.agent import ModelResponse, ScriptedProvider, ToolCall
from kernel.agent.branches import branch_turn

from .agent_world import World, kinds

LOOKUP = ToolCall("call_a", "lookup", {"q": "order 7"})
CHARGE = ToolCall("call_b", "charge", {"amount": 12})


def three_responses() -> ScriptedProvider:
    return ScriptedProvider(responses=[
        ModelResponse("", (LOOKUP,)),
        ModelResponse("", (CHARGE,)),
        ModelResponse("Charged 12 for order 7."),
    ])


def test_a_turn_branched_from_its_second_response_asks_the_model_only_from_there() -> None:
    world = World(three_responses())
    kernel, handle, conversation, submitted = world.start("Charge order 7")
    world.run()
    assert len(world.provider.requests) == 3
    assert world.effects == ["lookup:order 7", "charge:12"]
    original = kernel.entries(conversation)
    responses = [e for e in original if e.kind == "model_response"]
    assert len(responses) == 3
    turn_id = responses[0].payload["turn"]
    charge_task = next(t for t in kernel.storage.session_tasks(handle.id)
                       if t.kind == "agent-tool" and t.input["call"]["id"] == "call_b")

    branch = branch_turn(handle, conversation, responses[1].id, actor="user:olga")
    world.run()

    # Asked once more, from the branch point: the context ends with the new charge result.
    assert len(world.provider.requests) == 4
    asked = world.provider.requests[-1].messages
    assert sum(m["role"] == "assistant" for m in asked) == 2
    # The lookup before the branch point did not run again; the charge after it is a new
    # call, under a new operation id.
    assert world.effects == ["lookup:order 7", "charge:12", "charge:12"]
    new_charge = next(t for t in kernel.storage.session_tasks(handle.id)
                      if t.kind == "agent-tool" and t.input["conversation_id"]
                      == branch.conversation_id)
    assert new_charge.checkpoint["intent"]["operation_id"] != \
        charge_task.checkpoint["intent"]["operation_id"]

    forked = kernel.entries(branch.conversation_id)
    assert [e.id for e in forked[: len(original) - 2]] == \
        [e.id for e in original[: len(original) - 2]]  # inherited up to the second response
    assert kinds(kernel, branch.conversation_id)[-2:] == ["tool_result", "model_response"]
    assert forked[-1].payload["text"] == "Charged 12 for order 7."
    turn = kernel.task(branch.turn_id)
    assert turn.outcome["kind"] == "succeeded" and turn.input["branch_of"] == turn_id
    # The original stays as it was.
    assert [e.id for e in kernel.entries(conversation)] == [e.id for e in original]
    stored = kernel.storage.submission(submitted.submission.id)
    assert stored.status is SubmissionStatus.ANSWERED


def test_a_branch_from_the_last_response_asks_the_model_nothing() -> None:
    world = World(three_responses())
    kernel, handle, conversation, _ = world.start("Charge order 7")
    world.run()
    last = [e for e in kernel.entries(conversation) if e.kind == "model_response"][-1]
    branch = branch_turn(handle, conversation, last.id, actor="user:olga")
    world.run()
    assert len(world.provider.requests) == 3
    turn = kernel.task(branch.turn_id)
    assert turn.outcome == {"kind": "succeeded", "result": {"answer_entry": last.id}}


def test_only_a_model_response_is_a_branch_point() -> None:
    world = World(three_responses())
    kernel, handle, conversation, _ = world.start("Charge order 7")
    world.run()
    user_entry = kernel.entries(conversation)[0]
    with pytest.raises(IllegalTransition, match="not a model response"):
        branch_turn(handle, conversation, user_entry.id, actor="user:olga")
