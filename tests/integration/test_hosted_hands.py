"""A hosted Pydantic AI agent's call on the hands queue through the product, in-process
on Postgres: cut mid-way, its card on the session page says it is uncertain; the
operator's decision on its hands task (``commands.resolve_task``, what the API and the
task page call) lets the turn complete."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from django.conf import settings
from django.test import Client

from controlplane import commands
from controlplane.commands import Step
from controlplane.worker.runtime import forget_runtime, runtime
from kernel import Scheduler, Status, SubmissionStatus, agent
from tests.integration.hosted import conversation, operator
from tests.unit.crashes import dead

pytestmark = pytest.mark.django_db(transaction=True)
LEASE = 1.0


@pytest.fixture
def courier() -> Iterator[None]:
    from tests.integration import pydantic_hands

    saved = settings.KERNEL_AGENTS
    settings.KERNEL_AGENTS = {"courier": "tests.integration.pydantic_hands.agent"}
    forget_runtime()
    pydantic_hands.calls.clear()
    try:
        yield
    finally:
        pydantic_hands.armed.clear()
        settings.KERNEL_AGENTS = saved
        forget_runtime()


def run_across_a_crash(name: str) -> None:
    """Run to idle; a worker that dies is followed, once its lease ran out, by another."""
    try:
        Scheduler(runtime().kernel, f"{name}-1", lease_seconds=LEASE).run_until_idle()
    except BaseException as exc:
        if not dead(exc):
            raise
        time.sleep(LEASE + 0.5)
        Scheduler(runtime().kernel, f"{name}-2", lease_seconds=LEASE).run_until_idle()


def card(client: Client, session_id: str, call_id: str) -> str:
    page = client.get(f"/sessions/{session_id}/").content.decode()
    shown = page[page.index(f'id="call-{call_id}"'):]
    return shown[:shown.index("</article>")]


def test_a_hands_call_cut_midway_is_uncertain_on_its_card_until_the_operator_decides(
    courier: None,
) -> None:
    from tests.integration.pydantic_hands import armed, calls

    user = operator()
    session_id, conversation_id = conversation()
    armed.add("crash")
    submitted = commands.submit(user, session_id, conversation_id,
                                {"text": "Send ana her parcel", "agent": "courier"}, "r1",
                                agent.WhenBusy.FOLLOW_UP)
    assert submitted.submission is not None
    run_across_a_crash("w")
    kernel = runtime().kernel
    in_session = kernel.storage.session_tasks(session_id)
    (turn,) = [t for t in in_session if t.kind == "agent:courier"]
    (hands,) = [t for t in in_session if t.kind == "agent-tool:courier"]
    assert turn.status is Status.WAITING and turn.lease_owner is None
    assert hands.queue == "hands" and hands.wait == {"signal": "resolution:call_parcel:1"}
    assert calls == ["ana"]

    client = Client()
    client.force_login(user)
    assert 'data-state="uncertain"' in card(client, session_id, "call_parcel")

    commands.resolve_task(user, hands.id, "olga-1", "the courier has it", "happened",
                          Step("resolution:call_parcel:1", hands.epoch),
                          {"result": "picked up"})
    Scheduler(kernel, "w-3").run_until_idle()
    stored = kernel.storage.submission(submitted.submission.id)
    assert stored is not None and stored.status is SubmissionStatus.ANSWERED
    assert calls == ["ana"]  # never called a second time
    shown = card(client, session_id, "call_parcel")
    assert 'data-state="succeeded"' in shown and "picked up" in shown
    assert "replay unsafe" in shown
