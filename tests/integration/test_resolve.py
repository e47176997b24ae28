"""A resolution names the uncertain step it decides (issue 11, point 4): the task's
``step`` (the signal it waits on and its epoch) goes with the decision; a step answered
already or replaced since is refused with 409 and nothing changes; of two operators
deciding at once, exactly one decision lands."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from controlplane import commands
from controlplane.errors import http_status
from controlplane.reads import tasks as task_reads
from controlplane.worker.runtime import runtime
from kernel import Decision, Kernel, Receipt, Run, Scheduler, Status, Transition
from kernel.commit import operations_log_id

from .api_kinds import start, with_test_kinds
from .clients import client_for, post, user
from .racing import both_read_first, decide_at_once

pytestmark = pytest.mark.django_db(transaction=True)

AGAIN = Decision("again", "Not done: ask again later", "again")
DONE = Decision("done", "It was done", "done")
PROVEN = Decision("proven", "It was done: here is the proof", "proven",
                  receipt=Receipt(required=("id",), optional=("at",), needed=True))


@pytest.fixture(autouse=True)
def kernel(monkeypatch: pytest.MonkeyPatch) -> Kernel:
    built = with_test_kinds(monkeypatch)
    if "api-asker" not in built.registry.kinds():

        @built.registry.task("api-asker")
        class Asker:
            """Like a notice over SMTP: each "again" is a new uncertain step."""

            initial = "ask"
            decisions = (DONE, AGAIN, PROVEN)

            def ask(self, run: Run) -> Transition:
                n = run.checkpoint.get("n", 0) + 1
                return run.wait_for(f"resolution-{n}", then="resolved", checkpoint={"n": n})

            def resolved(self, run: Run) -> Transition:
                answer = run.signal(f"resolution-{run.checkpoint['n']}")
                if answer["decision"] == AGAIN.value:
                    return run.next("ask")
                return run.succeed(answer)

    return built


def resolve(client: Client, task_id: str, action_id: str, step: dict[str, Any],
            decision: str = "done", reason: str = "checked") -> Any:
    return post(client, f"/api/tasks/{task_id}/resolve",
                {"action_id": action_id, "reason": reason, "decision": decision, **step})


def resolutions(kernel: Kernel, session_id: str) -> list[Any]:
    return [e.payload for e in kernel.entries(operations_log_id(session_id))]


def test_a_decision_for_a_replaced_step_is_refused_and_changes_nothing(
    kernel: Kernel,
) -> None:
    session_id, task_id = start(kernel, "api-asker", {})
    ann, bob = client_for("ann", "operator"), client_for("bob", "operator")
    seen = ann.get(f"/api/tasks/{task_id}").json()["step"]  # both look at the same page
    assert bob.get(f"/api/tasks/{task_id}").json()["step"] == seen
    assert seen["signal"] == "resolution-1"

    assert resolve(ann, task_id, "a1", seen, "again").status_code == 200
    Scheduler(kernel).run_until_idle()
    now = kernel.task(task_id)
    assert (now.status, now.wait) == (Status.WAITING, {"signal": "resolution-2"})
    head = kernel.storage.session(session_id).head_seq

    late = resolve(bob, task_id, "b1", seen, "done")  # Bob decides the step he saw
    assert late.status_code == 409, late.content
    assert "resolution-2" in late.json()["detail"]
    new_step = bob.get(f"/api/tasks/{task_id}").json()["step"]
    assert new_step == {"signal": "resolution-2", "epoch": now.epoch}
    wrong_epoch = resolve(bob, task_id, "b2", {**new_step, "epoch": seen["epoch"]})
    assert wrong_epoch.status_code == 409
    assert kernel.storage.session(session_id).head_seq == head  # nothing written
    assert kernel.task(task_id).signals.keys() == {"resolution-1"}

    assert resolve(bob, task_id, "b3", new_step).status_code == 200  # he looks again
    again = resolve(bob, task_id, "b3", new_step)  # the same request repeated
    assert again.status_code == 200 and again.json()["replayed"] is True
    Scheduler(kernel).run_until_idle()
    assert kernel.task(task_id).outcome["result"]["by"] == "user:bob"
    assert [(r["action_id"], r["by"]) for r in resolutions(kernel, session_id)] == [
        ("a1", "user:ann"), ("b3", "user:bob")
    ]


@pytest.mark.parametrize("same_operator", [False, True], ids=["two-operators", "two-tabs"])
def test_two_operators_deciding_at_once_exactly_one_decision_lands(
    kernel: Kernel, monkeypatch: pytest.MonkeyPatch, same_operator: bool
) -> None:
    """Both read the task waiting before either commits (a barrier after the read), then
    both commit, each on its own Postgres connection: one lands, the other is 409."""
    session_id, task_id = start(kernel, "api-asker", {})
    step = commands.Step("resolution-1", kernel.task(task_id).epoch)
    accounts = [user("ann", "operator")]
    accounts.append(accounts[0] if same_operator else user("bob", "operator"))
    both_read_first(monkeypatch, task_reads, "record")
    landed, refused = decide_at_once(lambda i: commands.resolve_task(
        accounts[i], task_id, f"decide-{i}", "checked", ("done", "again")[i], step))
    assert http_status(refused) == 409 and "no longer waits" in str(refused)
    assert not landed.replayed
    logged = resolutions(kernel, session_id)
    assert [r["action_id"] for r in logged] == [landed.action_id]
    signal = runtime().kernel.storage.task(task_id).signals["resolution-1"]
    assert signal["decision"] == ("done", "again")[int(landed.action_id[-1])]


@pytest.mark.parametrize(
    ("decision", "receipt", "field"),
    [
        ("proven", None, "receipt"),  # it needs one
        ("proven", {"at": "noon"}, "receipt.id"),
        ("proven", {"id": "m-1", "to": "someone@else"}, "receipt.to"),
        ("proven", {"id": 7}, "receipt.id"),
        ("proven", {"id": ""}, "receipt.id"),
        ("done", {"id": "m-1"}, "receipt"),  # "done" takes none
    ],
)
def test_a_receipt_of_another_shape_than_the_decision_takes_is_refused(
    kernel: Kernel, decision: str, receipt: Any, field: str
) -> None:
    session_id, task_id = start(kernel, "api-asker", {})
    olga = client_for("olga", "operator")
    step = olga.get(f"/api/tasks/{task_id}").json()["step"]
    head = kernel.storage.session(session_id).head_seq
    body = {"action_id": "a1", "reason": "checked", "decision": decision, **step}
    if receipt is not None:
        body["receipt"] = receipt
    refused = post(olga, f"/api/tasks/{task_id}/resolve", body)
    assert refused.status_code == 422, refused.content
    assert refused.json()["detail"].startswith(f"{field}:"), refused.content
    assert kernel.storage.session(session_id).head_seq == head


def test_a_receipt_of_the_declared_shape_reaches_the_task(kernel: Kernel) -> None:
    session_id, task_id = start(kernel, "api-asker", {})
    olga = client_for("olga", "operator")
    shown = olga.get(f"/api/tasks/{task_id}").json()
    assert {d["name"]: d["receipt"] for d in shown["decisions"]}["proven"] == {
        "type": "object", "additionalProperties": False, "required": ["id"],
        "properties": {name: {"type": "string", "minLength": 1, "maxLength": 500}
                       for name in ("id", "at")},
    }
    receipt = {"id": "m-1", "at": "noon"}
    body = {"action_id": "a1", "reason": "checked", "decision": "proven",
            "receipt": receipt, **shown["step"]}
    assert post(olga, f"/api/tasks/{task_id}/resolve", body).status_code == 200
    Scheduler(kernel).run_until_idle()
    assert kernel.task(task_id).outcome["result"]["receipt"] == receipt


def test_a_resolve_form_whose_epoch_is_not_ascii_digits_is_refused_naming_it(
    kernel: Kernel,
) -> None:
    """"²" is a digit to Python's ``isdigit`` but no number to ``int``: the form is
    refused (422 naming the field), not answered with a server error."""
    session_id, task_id = start(kernel, "api-asker", {})
    operator = client_for("olga", "operator")
    head = kernel.storage.session(session_id).head_seq
    answer = operator.post(f"/tasks/{task_id}/resolve",
                           {"reason": "checked", "decision": "done", "action_id": "r1",
                            "signal": "resolution-1", "epoch": "²"},
                           HTTP_HX_REQUEST="true")
    assert answer.status_code == 422, answer.content
    assert b"epoch" in answer.content
    assert kernel.storage.session(session_id).head_seq == head
    assert kernel.task(task_id).status is Status.WAITING
