"""The reference email app against a real local provider process and a loopback
SMTP server, driven by the in-process scheduler (the chaos suite does the same
with Celery workers and kills)."""

from __future__ import annotations

import socket
from datetime import timedelta

import pytest

from controlplane.dev.processes import RunningProvider
from controlplane.dev.provider_admin import ProviderAdmin
from controlplane.dev.smtp_server import SmtpStandIn, start_smtp_server
from controlplane.reference.notices import tasks as notices
from controlplane.reference.notices.channels import HttpChannel, SmtpChannel
from kernel import Draft, InMemoryStorage, Kernel, ManualClock, Registry, Scheduler, Status

RECIPIENTS = ["ana@example.com", "ben@example.com", "cai@example.com"]


@pytest.fixture
def admin(provider: RunningProvider) -> ProviderAdmin:
    client = ProviderAdmin(provider.url)
    client.reset()
    return client


def start(provider: RunningProvider, smtp_port: int, channel: str = "http"):
    registry = Registry()
    notices.register(
        registry,
        {
            "http": HttpChannel(provider.url, timeout=2),
            "smtp": SmtpChannel("127.0.0.1", smtp_port, "notices@example.com", timeout=2),
        },
    )
    kernel = Kernel(InMemoryStorage(), registry, ManualClock())
    handle = kernel.create_session()
    draft = Draft(actor="user:ann")
    batch = draft.create_task(
        "send-batch",
        {"recipients": RECIPIENTS, "subject": "Notice", "body": "Text", "channel": channel},
    )
    handle.commit(draft)
    return kernel, handle, batch, Scheduler(kernel)


def notice_of(kernel: Kernel, session_id: str, to: str):
    return next(
        t
        for t in kernel.storage.session_tasks(session_id)
        if t.kind == "send-notice" and t.input["to"] == to
    )


def test_a_batch_sends_each_notice_once_and_summarises_the_receipts(
    provider: RunningProvider, admin: ProviderAdmin
) -> None:
    kernel, handle, batch, scheduler = start(provider, 1)
    scheduler.run_until_idle()
    outcome = kernel.task(batch).outcome
    assert outcome["kind"] == "succeeded" and outcome["result"]["sent"] == 3
    messages = admin.messages()
    assert sorted(m["to"] for m in messages) == RECIPIENTS
    plan = kernel.document(handle.id, "email-plan", batch)
    assert {to: e["state"] for to, e in plan["recipients"].items()} == dict.fromkeys(
        RECIPIENTS, "sent"
    )
    assert {m["idempotency_key"] for m in messages} == {
        e["operation_id"] for e in plan["recipients"].values()
    }


def test_an_unavailable_provider_means_backoff_then_success(
    provider: RunningProvider, admin: ProviderAdmin
) -> None:
    admin.set_faults(error_rate=1.0)
    kernel, handle, batch, scheduler = start(provider, 1)
    scheduler.run_until_idle()
    notice = notice_of(kernel, handle.id, RECIPIENTS[0])
    assert notice.status is Status.SLEEPING and notice.checkpoint["attempts"] == 1
    assert (
        kernel.document(handle.id, "email-plan", batch)["recipients"][RECIPIENTS[0]]["state"]
        == "not_sent"
    )
    admin.set_faults()
    scheduler.run_until_idle(advance_clock=True)
    assert kernel.task(batch).outcome["result"]["sent"] == 3
    assert len(admin.messages()) == 3


def test_a_dropped_answer_is_confirmed_by_lookup_not_sent_again(
    provider: RunningProvider, admin: ProviderAdmin
) -> None:
    admin.set_faults(drop_after_accept={"to": RECIPIENTS[1]})
    kernel, handle, batch, scheduler = start(provider, 1)
    scheduler.run_until_idle(advance_clock=True)
    assert kernel.task(batch).outcome["result"]["sent"] == 3
    posts = [r for r in admin.requests() if r["method"] == "POST" and r["to"] == RECIPIENTS[1]]
    assert len(posts) == 1
    plan = kernel.document(handle.id, "email-plan", batch)
    assert plan["recipients"][RECIPIENTS[1]]["confirmed_by"] == "lookup"


def test_a_rejected_notice_fails_the_batch_with_what_was_sent(
    provider: RunningProvider, admin: ProviderAdmin
) -> None:
    kernel, handle, _, scheduler = start(provider, 1)
    draft = Draft()
    bad = draft.create_task(
        "send-batch",
        {"recipients": ["not-an-address"], "subject": "S", "body": "B", "channel": "http"},
    )
    handle.commit(draft)
    scheduler.run_until_idle()
    outcome = kernel.task(bad).outcome
    assert outcome["kind"] == "failed"
    assert outcome["result"]["unsent"] == ["not-an-address"]


def test_an_uncertain_smtp_send_waits_for_an_operator(
    provider: RunningProvider, smtp: SmtpStandIn
) -> None:
    smtp.drop_after_data(to=RECIPIENTS[2])
    kernel, handle, batch, scheduler = start(provider, smtp.port, channel="smtp")
    scheduler.run_until_idle(advance_clock=True)
    notice = notice_of(kernel, handle.id, RECIPIENTS[2])
    assert notice.status is Status.WAITING and notice.wait == {"signal": "resolution-1"}
    assert kernel.task(batch).status is Status.WAITING
    assert kernel.registry.decisions(notice) == notices.DECISIONS
    assert kernel.registry.decisions(kernel.task(batch)) == ()
    assert len([m for m in smtp.messages() if RECIPIENTS[2] in m.rcpt_tos]) == 1

    smtp.clear_faults()
    resolve(handle, notice.id, notices.SEND_AGAIN.value)
    scheduler.run_until_idle(advance_clock=True)
    assert kernel.task(batch).outcome["result"]["sent"] == 3
    assert len([m for m in smtp.messages() if RECIPIENTS[2] in m.rcpt_tos]) == 2
    assert kernel.registry.decisions(kernel.task(notice.id)) == ()


def test_a_notice_declares_the_decisions_the_api_and_the_form_offer() -> None:
    """The declaration keeps the public names, labels and signal values that the API and
    the resolve form offered before they rendered from it."""
    registry = Registry()
    notices.register(registry, {})
    declared = registry.latest("send-notice").decisions
    assert declared == notices.DECISIONS and registry.latest("send-batch").decisions == ()
    assert [(d.name, d.label, d.value, d.may_repeat) for d in declared] == [
        ("sent", "It was sent", "sent", None),
        ("not_sent_send_again", "Not sent: send again", "send_again",
         "the operation is performed again"),
        ("give_up", "Give up", "give_up", None),
    ]  # fmt: skip


def resolve(handle, notice_id: str, decision: str, step: str = "resolution-1") -> None:
    draft = Draft(actor="user:olga")
    draft.signal(notice_id, step, {"decision": decision, "by": "user:olga"})
    handle.commit(draft)


def retry(handle, task_id: str) -> None:
    draft = Draft(actor="user:olga")
    draft.retry(task_id)
    handle.commit(draft)


@pytest.mark.parametrize("decision", ["sent", "give_up"])
def test_an_operator_can_confirm_or_give_up_an_uncertain_send(
    provider: RunningProvider, smtp: SmtpStandIn, decision: str
) -> None:
    smtp.drop_after_data(to=RECIPIENTS[0])
    kernel, handle, batch, scheduler = start(provider, smtp.port, channel="smtp")
    scheduler.run_until_idle(advance_clock=True)
    resolve(handle, notice_of(kernel, handle.id, RECIPIENTS[0]).id, decision)
    scheduler.run_until_idle(advance_clock=True)
    outcome = kernel.task(batch).outcome
    assert len([m for m in smtp.messages() if RECIPIENTS[0] in m.rcpt_tos]) == 1
    if decision == "sent":
        assert outcome["result"]["sent"] == 3
        assert outcome["result"]["receipts"][RECIPIENTS[0]]["id"] == "operator:user:olga"
    else:
        assert outcome["kind"] == "failed"
        assert outcome["result"]["unsent"] == [RECIPIENTS[0]]


def test_a_notice_retried_after_an_operator_gave_up_asks_again_on_a_fresh_step(
    provider: RunningProvider, smtp: SmtpStandIn
) -> None:
    """The operator's "give up" decided one step; a retry of the failed notice is a new
    attempt, not that decision again: it finds out first (SMTP cannot say, so it asks an
    operator on a step of its own), sends nothing blindly, and the new answer counts."""
    smtp.drop_after_data(to=RECIPIENTS[0])
    kernel, handle, batch, scheduler = start(provider, smtp.port, channel="smtp")
    scheduler.run_until_idle(advance_clock=True)
    notice = notice_of(kernel, handle.id, RECIPIENTS[0]).id
    resolve(handle, notice, notices.GIVE_UP.value)
    scheduler.run_until_idle(advance_clock=True)
    assert kernel.task(notice).outcome["kind"] == "failed"
    assert kernel.task(batch).outcome["result"]["unsent"] == [RECIPIENTS[0]]

    retry(handle, notice)
    scheduler.run_until_idle(advance_clock=True)
    again = kernel.task(notice)
    assert (again.status, again.wait) == (Status.WAITING, {"signal": "resolution-2"})
    entry = kernel.document(handle.id, "email-plan", batch)["recipients"][RECIPIENTS[0]]
    assert entry["state"] == "uncertain"
    assert len([m for m in smtp.messages() if RECIPIENTS[0] in m.rcpt_tos]) == 1

    resolve(handle, notice, notices.SENT.value, step="resolution-2")
    scheduler.run_until_idle(advance_clock=True)
    assert kernel.task(notice).outcome["kind"] == "succeeded"
    retry(handle, batch)  # its summary is read from the plan again
    scheduler.run_until_idle(advance_clock=True)
    assert kernel.task(batch).outcome["result"]["sent"] == 3


def _refusing_port() -> int:
    """A loopback port nothing listens on: connecting to it is refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_refused_smtp_connection_is_not_sent_and_retries_with_backoff(
    provider: RunningProvider,
) -> None:
    """Nothing reached the server: the notice backs off and sends again, it never asks an
    operator about an interrupted send; once the server is up, each email goes out once."""
    port = _refusing_port()
    kernel, handle, batch, scheduler = start(provider, port, channel="smtp")
    scheduler.run_until_idle()
    notice = notice_of(kernel, handle.id, RECIPIENTS[0])
    assert (notice.status, notice.phase) == (Status.SLEEPING, "send")
    assert notice.checkpoint["attempts"] == 1
    entry = kernel.document(handle.id, "email-plan", batch)["recipients"][RECIPIENTS[0]]
    assert entry["state"] == "not_sent" and "refused" in entry["error"].lower()

    with start_smtp_server(port=port) as smtp:
        scheduler.run_until_idle(advance_clock=True)
        assert kernel.task(batch).outcome["result"]["sent"] == 3
        assert sorted(to for m in smtp.messages() for to in m.rcpt_tos) == RECIPIENTS
    assert all(t.wait is None for t in kernel.storage.session_tasks(handle.id))


def test_an_smtp_server_that_stays_down_fails_the_notice_as_not_sent(
    provider: RunningProvider,
) -> None:
    kernel, handle, batch, scheduler = start(provider, _refusing_port(), channel="smtp")
    seen: set[Status] = set()
    while True:  # step through the backoff, looking at the notices after every round
        scheduler.run_until_idle()
        seen |= {t.status for t in kernel.storage.session_tasks(handle.id)
                 if t.kind == "send-notice"}
        wake = kernel.storage.next_wake()
        if wake is None:
            break
        kernel.clock.set(max(wake, kernel.clock.now()) + timedelta(microseconds=1))
    notice = kernel.task(notice_of(kernel, handle.id, RECIPIENTS[0]).id)
    assert Status.WAITING not in seen  # never put to an operator
    assert notice.outcome["kind"] == "failed"
    assert notice.outcome["error"].startswith(f"not sent after {notices.MAX_ATTEMPTS} attempts")
    plan = kernel.document(handle.id, "email-plan", batch)
    assert {e["state"] for e in plan["recipients"].values()} == {"failed"}
    assert kernel.task(batch).outcome["result"]["unsent"] == RECIPIENTS
