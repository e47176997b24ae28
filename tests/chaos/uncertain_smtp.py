"""A batch run on real workers over SMTP until its email 4 is uncertain: the stand-in received
it and held its answer back, the worker was killed meanwhile, and the next worker has the
notice wait for an operator (tests/chaos/test_smtp_uncertain.py says what follows)."""

from __future__ import annotations

from collections import Counter

from controlplane.dev.smtp_server import SmtpStandIn
from kernel import Status, Task

from .harness import RECIPIENTS, Stack, succeeded, wait_for

FOURTH = RECIPIENTS[3]


def received(smtp: SmtpStandIn) -> Counter[str]:
    return Counter(to for m in smtp.messages() for to in m.rcpt_tos)


def uncertain_email_4(stack: Stack, smtp: SmtpStandIn) -> tuple[str, str, Task]:
    """Run the batch until email 4 waits for an operator; returns (session, batch, notice)."""
    smtp_env = {"SMTP_HOST": smtp.host, "SMTP_PORT": str(smtp.port)}
    smtp.stall_after_data(to=FOURTH, seconds=60)
    worker = stack.worker("w1", **smtp_env)
    stack.beat()
    session_id, batch_id = stack.send_batch(RECIPIENTS, channel="smtp")

    wait_for(lambda: received(smtp)[FOURTH], "the SMTP server to receive email 4")
    worker.kill()  # at once: the worker gives up waiting for the answer after 10 s
    notices = stack.notices(session_id)
    assert all(succeeded(notices[to]) for to in RECIPIENTS[:3])
    assert (notices[FOURTH].status, notices[FOURTH].phase) == (Status.RUNNING, "confirm")
    assert notices[RECIPIENTS[4]].epoch == 0

    smtp.clear_faults()
    stack.worker("w2", **smtp_env)
    notice = wait_for(
        lambda: (n := stack.notices(session_id)[FOURTH]).status is Status.WAITING and n,
        "email 4 to wait for an operator",
    )
    wait_for(lambda: succeeded(stack.notices(session_id)[RECIPIENTS[4]]), "email 5 to be sent")
    assert notice.wait == {"signal": "resolution-1"}
    assert (notice.phase, notice.checkpoint["awaiting"]) == ("resolved", "resolution-1")
    assert "cannot confirm" in notice.checkpoint["why"]
    plan = stack.kernel.document(session_id, "email-plan", batch_id)
    assert plan["recipients"][FOURTH]["state"] == "uncertain"
    assert stack.task(batch_id).status is Status.WAITING
    # Received once, and not sent again on the system's own initiative.
    assert received(smtp) == Counter(RECIPIENTS)
    return session_id, batch_id, notice
