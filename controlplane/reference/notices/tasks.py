"""The reference application: send an approved notice to a batch of recipients.

``send-batch`` plans the batch (one operation id per recipient, saved in the
email plan document before anything is sent), fans out one ``send-notice`` per
recipient, waits for all of them to settle, and summarises the receipts.

``send-notice`` records its intent ("this may be sent from now on") before it
calls the channel; a crash after that point lands in ``confirm``, which asks
the provider by operation id instead of sending blindly. Where the channel
cannot be asked (SMTP), the notice waits for an operator's resolution: one of
the :data:`DECISIONS` it declares. A notice an operator gave up on, retried later, finds
out again (and asks on a new step) rather than taking that decision a second time.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from controlplane.reference.notices.channels import (
    CannotConfirm,
    Channel,
    NotAccepted,
    Rejected,
    Uncertain,
)
from controlplane.reference.notices.provider import Message
from kernel import Decision, Receipt, Registry, Run, Transition

PLAN = "email-plan"
MAX_ATTEMPTS = 8
MAX_BACKOFF_SECONDS = 30.0
DEADLINE_MARGIN_SECONDS = 1.0  # clock difference allowed between workers and the provider

# What an operator may answer a notice that cannot tell whether it was sent.
SENT = Decision(
    "sent",
    "It was sent",
    "sent",
    description="Record it as sent (with the receipt the operator gives, if any: the "
    "message id the mail server gave, and when it accepted it).",
    receipt=Receipt(required=("id",), optional=("accepted_at",)),
)
SEND_AGAIN = Decision(
    "not_sent_send_again",
    "Not sent: send again",
    "send_again",
    may_repeat="the operation is performed again",
    description="Send it again under the same operation id.",
)
GIVE_UP = Decision(
    "give_up", "Give up", "give_up", description="Record it as not sent; the notice fails."
)
DECISIONS = (SENT, SEND_AGAIN, GIVE_UP)


def backoff(attempts: int) -> float:
    return min(MAX_BACKOFF_SECONDS, 0.5 * 2**attempts)


def register(registry: Registry, channels: Mapping[str, Channel]) -> None:
    """Add the notice tasks and the email plan document kind to ``registry``."""
    registry.document(PLAN, panel="plans")

    @registry.task("send-batch", queue="default")
    class SendBatch:
        initial = "plan"

        def plan(self, run: Run) -> Transition:
            recipients = list(dict.fromkeys(run.input["recipients"]))
            if not recipients:
                return run.fail("a batch needs at least one recipient")
            channel = run.input.get("channel", "http")
            if channel not in channels:
                return run.fail(f"unknown channel {channel!r}; known: {sorted(channels)}")
            entries = {
                to: {"operation_id": f"op_{uuid.uuid4().hex}", "state": "planned"}
                for to in recipients
            }
            run.set(PLAN, run.task_id, [], {
                "subject": run.input["subject"],
                "body": run.input["body"],
                "channel": channel,
                "recipients": entries,
            })
            notices = [
                run.spawn("send-notice", {"plan": run.task_id, "to": to, **entries[to]})
                for to in recipients
            ]
            return run.wait_all(notices, then="summarize")

        def summarize(self, run: Run) -> Transition:
            plan = run.document(PLAN, run.task_id)
            receipts = {
                to: entry["receipt"]
                for to, entry in plan["recipients"].items()
                if entry.get("receipt")
            }
            unsent = sorted(set(plan["recipients"]) - set(receipts))
            summary = {"sent": len(receipts), "receipts": receipts, "unsent": unsent}
            if unsent:
                return run.fail(f"{len(unsent)} of {len(plan['recipients'])} not sent", summary)
            return run.succeed(summary)

    @registry.task("send-notice", queue="hands")
    class SendNotice:
        initial = "send"
        decisions = DECISIONS

        def send(self, run: Run) -> Transition:
            channel, message = _channel_and_message(run, channels)
            _record(run, state="sending")
            run.commit(phase="confirm")  # intent: from here on it may have been sent
            return _deliver(run, channel, message)

        def confirm(self, run: Run) -> Transition:
            """Reached after an interrupted send: find out before sending anything."""
            channel, message = _channel_and_message(run, channels)
            try:
                found = channel.lookup(run.input["operation_id"])
            except CannotConfirm:
                return _ask_operator(run, "interrupted send; the channel cannot confirm it")
            except NotAccepted as exc:
                return _retry_later(run, "confirm", str(exc))
            except Rejected as exc:
                return _give_up(run, str(exc))
            if found is not None:
                _record(run, state="sent", receipt=found, confirmed_by="lookup")
                return run.succeed(found)
            # Never accepted: sending again under the same operation id is safe.
            return _deliver(run, channel, message)

        def on_cancel(self, run: Run) -> None:
            """A cancelled notice may have been sent already (its call was in flight when
            the cancel landed): ask before recording it as not sent. Every send carries
            a deadline no later than its lease's end, which the provider honours, so
            once the revoked lease has run out no call can still land: "not found" is
            only believed from then on."""
            entry = run.document(PLAN, run.input["plan"])["recipients"][run.input["to"]]
            if entry.get("state") == "sent":
                return
            channel, _ = _channel_and_message(run, channels)
            found, unknown = _look_up(channel, run.input["operation_id"])
            revoked_until = run.revoked_until
            if found is None and not unknown and revoked_until is not None:
                wait = (revoked_until - run.now).total_seconds()
                if wait > 0:  # the interrupted phase's call may still be on its way
                    time.sleep(wait)
                    found, unknown = _look_up(channel, run.input["operation_id"])
            if found is not None:
                _record(run, state="sent", receipt=found, confirmed_by="lookup")
            elif unknown and entry.get("state") in UNCERTAIN_STATES:
                _record(run, state="cancelled_uncertain", error="cancelled; it may have been sent")
            else:
                _record(run, state="cancelled")

        def resolved(self, run: Run) -> Transition:
            name = run.checkpoint["awaiting"]
            if _given_up_then_retried(run, name):
                # That decision ended the notice; the retry is a new attempt: find out
                # again, asking on a fresh step if the channel cannot say.
                asked = run.checkpoint.get("resolutions", 0) + 1
                return run.next("confirm", {"resolutions": asked, "awaiting": None,
                                            "attempts": 0})
            decision = run.signal(name) or {}
            if decision.get("decision") == SENT.value:
                receipt = {  # what the operator gave (SENT's receipt) over what we know
                    "id": f"operator:{decision.get('by', 'unknown')}",
                    "to": run.input["to"],
                    "idempotency_key": run.input["operation_id"],
                    **(decision.get("receipt") or {}),
                }
                _record(run, state="sent", receipt=receipt, confirmed_by=decision.get("by"))
                return run.succeed(receipt)
            if decision.get("decision") == SEND_AGAIN.value:
                _record(run, state="planned")
                return run.next("send", {"resolutions": run.checkpoint.get("resolutions", 0) + 1,
                                         "awaiting": None, "attempts": 0})
            return _give_up(run, f"operator gave up: {decision.get('reason', '')}".strip(),
                            {GIVEN_UP: name})


UNCERTAIN_STATES = frozenset({"sending", "retrying", "uncertain", "cancelled_uncertain"})
"""Plan states of a notice that may have reached the provider without being confirmed
either way: a send under way, a confirm backing off, one waiting on an operator, one
cancelled while the channel could not say."""


def batch_partial(run: Run, batch_id: str | None, arguments: Mapping[str, Any]) -> Any:
    """What a batch stopped part-way (its tool call cancelled or interrupted) had done,
    from its plan as committed: the ``partial`` of the ``send_notices`` tool."""
    plan = run.document(PLAN, batch_id) if batch_id is not None else {}
    return partial_summary(plan, list(arguments.get("recipients", [])))


def partial_summary(plan: Mapping[str, Any], recipients: list[str]) -> dict[str, Any]:
    """Sent (with receipts), not sent, and uncertain recipients of a plan; a recipient
    the plan does not hold yet (nothing planned) was not sent."""
    entries = plan.get("recipients") or {}
    receipts: dict[str, Any] = {}
    unsent: list[str] = []
    uncertain: list[str] = []
    for to in dict.fromkeys([*entries, *recipients]):
        entry = entries.get(to) or {}
        if entry.get("receipt"):
            receipts[to] = entry["receipt"]
        elif entry.get("state") in UNCERTAIN_STATES:
            uncertain.append(to)
        else:
            unsent.append(to)
    return {"sent": len(receipts), "receipts": receipts, "unsent": unsent,
            "uncertain": uncertain}


class _ApprovedMessages:
    """Subject, body and channel of each plan, read once per process.

    ``plan`` writes them before any notice exists and nothing changes them later, so
    a cached copy is never stale; without it every notice of a 1,000-email batch
    re-read the whole plan document (every recipient's state) to find the same text.
    """

    def __init__(self, size: int = 64) -> None:
        self.size = size
        self._by_plan: OrderedDict[str, tuple[str, str, str]] = OrderedDict()

    def of(self, run: Run) -> tuple[str, str, str]:
        plan_id = run.input["plan"]
        if plan_id in self._by_plan:
            self._by_plan.move_to_end(plan_id)
        else:
            plan = run.document(PLAN, plan_id)
            self._by_plan[plan_id] = (plan["channel"], plan["subject"], plan["body"])
            while len(self._by_plan) > self.size:
                self._by_plan.popitem(last=False)
        return self._by_plan[plan_id]


_approved = _ApprovedMessages()


def _channel_and_message(run: Run, channels: Mapping[str, Channel]) -> tuple[Channel, Message]:
    channel, subject, body = _approved.of(run)
    message = Message(
        to=run.input["to"],
        subject=subject,
        body=body,
        metadata={"batch": run.input["plan"], "operation_id": run.input["operation_id"]},
    )
    return channels[channel], message


def _look_up(channel: Channel, operation_id: str) -> tuple[dict[str, str] | None, bool]:
    """The receipt under ``operation_id`` (None: the provider holds none), and whether
    the channel could not tell."""
    try:
        return channel.lookup(operation_id), False
    except (CannotConfirm, NotAccepted, Rejected):
        return None, True


def _deliver(run: Run, channel: Channel, message: Message) -> Transition:
    # Bounded by the lease: a cancel's handler looks up only after the revoked lease has
    # run out, and by then this call has ended and the provider refuses it (on_cancel).
    # The lease is on the kernel's clock, the provider's deadline on the wall clock:
    # carry over what is left of the lease.
    left = (run.deadline(DEADLINE_MARGIN_SECONDS) - run.now).total_seconds()
    deadline = time.time() + left
    try:
        receipt = channel.send(message, run.input["operation_id"], deadline)
    except NotAccepted as exc:  # certainly not sent: send again after a while
        return _send_later(run, str(exc))
    except Uncertain as exc:  # it may have been sent: find out before anything else
        return _retry_later(run, "confirm", str(exc))
    except Rejected as exc:
        return _give_up(run, str(exc))
    _record(run, state="sent", receipt=receipt, confirmed_by="send")
    return run.succeed(receipt)


def _retry_later(run: Run, phase: str, error: str) -> Transition:
    attempts = run.checkpoint.get("attempts", 0) + 1
    if attempts > MAX_ATTEMPTS:
        return _ask_operator(run, f"still failing after {MAX_ATTEMPTS} attempts: {error}")
    _record(run, state="retrying", error=error)
    return run.sleep(backoff(attempts), then=phase, checkpoint={"attempts": attempts})


def _send_later(run: Run, error: str) -> Transition:
    """The channel did not take the message (refused connection, provider down): nothing
    was sent, so there is nothing to ask an operator; back off and send again, and past
    :data:`MAX_ATTEMPTS` fail the notice as not sent (an operator may retry it)."""
    attempts = run.checkpoint.get("attempts", 0) + 1
    if attempts > MAX_ATTEMPTS:
        return _give_up(run, f"not sent after {MAX_ATTEMPTS} attempts: {error}")
    _record(run, state="not_sent", error=error)
    return run.sleep(backoff(attempts), then="send", checkpoint={"attempts": attempts})


def _ask_operator(run: Run, why: str) -> Transition:
    name = f"resolution-{run.checkpoint.get('resolutions', 0) + 1}"
    _record(run, state="uncertain", error=why)
    return run.wait_for(name, then="resolved", checkpoint={"awaiting": name, "why": why})


def _give_up(run: Run, why: str, result: dict[str, str] | None = None) -> Transition:
    _record(run, state="failed", error=why)
    return run.fail(why, result)


GIVEN_UP = "given_up"
"""In the result of a notice an operator gave up on: the step whose decision that was."""


def _given_up_then_retried(run: Run, step: str) -> bool:
    """Whether an operator gave up on ``step`` and the failed notice was retried since.
    The step's decision stays among the task's signals, and a retry runs ``resolved``
    again; the outcomes it retried (the kernel keeps them in ``_retried``) say whether
    that decision was spent."""
    return any(
        ((retried.get("outcome") or {}).get("result") or {}).get(GIVEN_UP) == step
        for retried in run.checkpoint.get("_retried", [])
    )


def _record(run: Run, **fields: Any) -> None:
    path = ["recipients", run.input["to"]]
    for key, value in fields.items():
        run.set(PLAN, run.input["plan"], [*path, key], value)
