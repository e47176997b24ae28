"""Two hosts, one cut off mid-batch (issue 14: hosts and partitions).

Two network namespaces on this machine stand for two hosts (``hosts.py``: a veth link
each to this machine's namespace, where a private Postgres, Redis and the provider
listen on the links' addresses). Each host runs a worker (a solo pool, as deployed);
beat runs on host B. A worker reaches the servers only over its host's link.

Mid-batch, while host A's worker is inside a send (its intent committed, its call to
the provider in flight), A's link is taken down: nothing is reset, A's worker just
stops hearing back. Its lease (3 s) runs out, B's beat sweeps it, B's worker claims
the notice with the next epoch, looks the message up by its operation id and commits
the receipt. Then the link comes back: A's worker, whose call gave up at its lease's
deadline, sends its commit late; the database refuses it (the epoch it claimed with is
stale) and the worker logs "lease lost, abandoning".

What must hold: the notice A held was finished by B (epoch + 1, one restart), with one
terminal commit; A's late commit was refused; the batch succeeded with exactly one
message per recipient at the provider.
"""

from __future__ import annotations

import os
import subprocess
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from .harness import wait_for
from .hosts import PREFIX, Host, hosts, ip
from .private_services import PrivatePostgres, PrivateStack, postgres_template, private_stack

RECIPIENTS = [f"{name}@example.com" for name in
              ("ana", "ben", "cai", "dee", "eve", "fay", "gus", "hal")]
LATENCY_MS = 1000  # per provider request: a send is in flight long enough to cut it
LEASE_LOST = "lease lost, abandoning"
pytestmark = [pytest.mark.chaos, pytest.mark.slow]


@pytest.fixture(scope="module")
def template() -> Iterator[PrivatePostgres]:
    with postgres_template() as server:
        yield server


def on(host: Host, stack: PrivateStack) -> dict[str, str]:
    """The environment of a process on ``host``: every server at its link's address."""
    return {
        "DATABASE_URL": stack.postgres.url(host=host.address),
        "REDIS_URL": stack.broker.url_at(host.address),
        "EMAIL_PROVIDER_URL": f"http://{host.address}:{stack.provider.port}",
    }


def test_a_host_cut_off_mid_batch_is_taken_over_and_its_late_commit_refused(
    template: PrivatePostgres, tmp_path: Path
) -> None:
    with ExitStack() as context:
        a, b = context.enter_context(hosts(2))
        stack = context.enter_context(private_stack(
            tmp_path, template, listen=(a.address, b.address), latency_ms=LATENCY_MS))
        assert a.reaches(stack.postgres.port) and b.reaches(stack.broker.port)

        stack.beat(via=b.via, **on(b, stack))
        worker_a = stack.worker("a1", via=a.via, wait=False, **on(a, stack))
        worker_b = stack.worker("b1", via=b.via, wait=False, **on(b, stack))
        stack.wait_ready(worker_a, worker_b)
        session_id, batch_id = stack.send_batch(RECIPIENTS)

        def a_sending() -> dict[str, Any] | None:
            return next((row for row in stack.notice_rows(session_id).values()
                         if row["phase"] == "confirm" and row["status"] == "running"
                         and row["lease_owner"].endswith(f":{worker_a.pid}")), None)

        held = wait_for(a_sending, "host A's worker to be inside a send", every=0.02)
        a.cut()
        assert held is not None
        assert stack.row(held["id"])["status"] == "running", "A's send ended before the cut"
        assert not a.reaches(stack.postgres.port), "the link is still up"

        def finished() -> dict[str, Any] | None:
            row = stack.row(held["id"])
            return row if row["status"] == "terminal" else None

        try:
            taken = wait_for(finished, "host B to finish the notice host A held",
                             timeout=30, every=0.1)
            assert taken is not None
            assert LEASE_LOST not in worker_a.output(), "A heard back while cut off"
        finally:
            a.restore()
        wait_for(lambda: LEASE_LOST in worker_a.output(), "A's late commit to be refused",
                 timeout=30, every=0.2)
        batch = stack.wait_done(batch_id, timeout=60)

        # B took the notice over after A's lease expired, and finished it.
        assert taken["epoch"] == held["epoch"] + 1 and taken["restarts"] == 1, taken
        assert taken["outcome"]["kind"] == "succeeded", taken["outcome"]
        assert f"recovering {held['id']}" in worker_b.output()
        # A's commit, sent once the link was back, was refused by its stale epoch.
        lost = [line for line in worker_a.output().splitlines() if LEASE_LOST in line]
        assert len(lost) == 1 and held["id"] in lost[0], lost
        ends = [item for item in stack.history(session_id, held["id"])
                if item["status"] == "terminal"]
        assert len(ends) == 1, ends
        assert stack.row(held["id"])["epoch"] == taken["epoch"], "A moved it after all"

        # Exactly one message per recipient; the batch succeeded with those receipts.
        messages = stack.admin.messages()
        assert Counter(m["to"] for m in messages) == Counter(RECIPIENTS), messages
        assert len({m["idempotency_key"] for m in messages}) == len(RECIPIENTS)
        assert batch["outcome"]["kind"] == "succeeded", batch["outcome"]
        assert batch["outcome"]["result"]["sent"] == len(RECIPIENTS)
        receipts = batch["outcome"]["result"]["receipts"]
        assert {to: receipts[to]["id"] for to in RECIPIENTS} == {
            m["to"]: m["id"] for m in messages}


def test_without_root_it_skips_saying_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(pytest.skip.Exception, match="network namespaces need root"), hosts(2):
        pass


def test_namespaces_a_killed_run_left_are_removed_and_its_own_always() -> None:
    with hosts(1) as (host,):  # skips where namespaces cannot be made
        assert host.namespace in ip("netns", "list").stdout
    assert host.namespace not in ip("netns", "list").stdout
    assert ip("link", "show", host.device, check=False).returncode != 0

    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid whose process has ended: a run that was killed
    left = f"{PREFIX}{gone.pid}a"
    ip("netns", "add", left)
    try:
        with hosts(1):
            assert left not in ip("netns", "list").stdout
    finally:
        ip("netns", "del", left, check=False)
