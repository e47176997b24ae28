"""A cancel never records "not sent" for an email the provider holds (issue 11, point 3).

A notice is inside its provider call when an operator cancels it. The provider stalls
before it stores the message, longer than the sender waits for an answer: the sender
gives up, its phase returns (its commit is refused: the lease was revoked), and the
cancel handler runs. Whatever it records must agree with what the provider ends up
holding: either the message arrives in time (before the send's deadline, which the
request carries and the provider honours) and the handler, looking up only once that
deadline has passed, records it sent; or it arrives too late and the provider refuses
it, and "cancelled, not sent" is true.
"""

from __future__ import annotations

import threading
import time

import pytest

from controlplane.dev.processes import RunningProvider, wait_for
from controlplane.dev.provider_admin import ProviderAdmin
from controlplane.reference.notices import tasks as notices
from controlplane.reference.notices.channels import HttpChannel
from kernel import Draft, InMemoryStorage, Kernel, Registry, Scheduler, Status, Worker
from kernel.clock import SystemClock

LEASE = 4.0  # seconds: the send's deadline is the lease's end, less a margin


@pytest.mark.parametrize("stall_ms", [2500, 6000], ids=["lands-in-time", "lands-too-late"])
def test_a_cancel_during_a_stalled_send_records_what_the_provider_holds(
    provider: RunningProvider, stall_ms: int
) -> None:
    admin = ProviderAdmin(provider.url)
    admin.reset()
    admin.set_faults(stall={"to": "ana@example.com", "ms": stall_ms, "when": "before_store"})
    registry = Registry()
    notices.register(registry, {"http": HttpChannel(provider.url, timeout=1.0)})
    kernel = Kernel(InMemoryStorage(), registry, SystemClock())
    handle = kernel.create_session()
    draft = Draft(actor="user:ann")
    batch = draft.create_task(
        "send-batch",
        {"recipients": ["ana@example.com"], "subject": "S", "body": "B", "channel": "http"},
    )
    handle.commit(draft)
    Worker(kernel, "planner", LEASE).advance(batch)  # plans and spawns the notice
    notice = next(t for t in kernel.storage.session_tasks(handle.id) if t.kind == "send-notice")

    sender = threading.Thread(target=Worker(kernel, "sender", LEASE).advance, args=[notice.id])
    sender.start()
    time.sleep(0.4)  # the intent is committed; the send is at the provider, stalled
    assert kernel.storage.task(notice.id).phase == "confirm"
    cancel = Draft(actor="user:op")
    cancel.cancel(notice.id, "operator stop")
    kernel.open(handle.id).commit(cancel)
    sender.join()  # gave up after its 1 s timeout; its commit was refused

    scheduler = Scheduler(kernel, "after", LEASE)
    until = time.monotonic() + 20
    while kernel.storage.task(notice.id).status is not Status.TERMINAL:
        assert time.monotonic() < until, kernel.storage.task(notice.id)
        scheduler.run_until_idle()
        time.sleep(0.05)
    # Whatever the provider was going to do, it did: a send stalled before storing is
    # logged when its stall ends, stored or refused.
    wait_for(lambda: [r for r in admin.requests() if r.get("faults") == ["stall"]],
             "the stalled send to be decided", timeout=stall_ms / 1000 + 10)

    ended = kernel.storage.task(notice.id)
    assert ended.outcome["kind"] == "cancelled"
    entry = kernel.document(handle.id, "email-plan", batch)["recipients"]["ana@example.com"]
    held = [m for m in admin.messages() if m["to"] == "ana@example.com"]
    if held:
        assert entry["state"] == "sent", (entry, held)
    else:
        assert entry["state"] != "sent", entry
    assert bool(held) == (stall_ms == 2500)  # in time: held; too late: refused
