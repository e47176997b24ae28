"""Two hosts, one cut off mid-batch (issue 14: hosts and partitions).

Two network namespaces on this machine stand for two hosts (``hosts.py``: a veth link
each to this machine's namespace, where a private Postgres, Redis and the provider
listen on the links' addresses). Each host runs a pool of two worker processes (``-P
solo``, as deployed); beat runs on host B. A worker reaches the servers only over its
host's link.

Mid-batch, while one of host A's workers is inside a send (its intent committed, its
call to the provider in flight), A's link is taken down: nothing is reset, A's workers
just stop hearing back. Their leases (3 s) run out, B's beat sweeps them, B's workers
claim every task A held with the next epoch; the notice being sent is looked up by its
operation id and its receipt committed. Then the link comes back: A's workers, whose
calls gave up at their leases' deadlines, send their commits late; the database
refuses them (the epoch they claimed with is stale) and each worker logs "lease lost,
abandoning".

What must hold: every task A held was taken over by B; the notice A was sending was
finished by B (one restart) with one terminal commit, and A's late commit for it was
refused; the batch succeeded with exactly one message per recipient at the provider.
"""

from __future__ import annotations

import os
import subprocess
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from .harness import wait_for
from .hosts import PREFIX, Host, hosts, ip
from .private_services import PrivatePostgres, PrivateStack, private_stack

RECIPIENTS = [f"{name}@example.com" for name in
              ("ana", "ben", "cai", "dee", "eve", "fay", "gus", "hal")]
LATENCY_MS = 1000  # per provider request: a send is in flight long enough to cut it
POOL = 2  # worker processes per host
LEASE_LOST = "lease lost, abandoning"
# A host cut off in the middle of a commit's transaction: the server ends it (its idle
# timeout), so the commit is known not to have landed when the link comes back.
UNAVAILABLE = "storage unavailable, abandoning"
DISPATCHES = ("SELECT task_id, not_before, delivered_at, attempts, woken FROM kernel_dispatch "
              "WHERE task_id = ANY(%s) ORDER BY id")
pytestmark = [pytest.mark.chaos, pytest.mark.slow]


def on(host: Host, stack: PrivateStack) -> dict[str, str]:
    """The environment of a process on ``host``: every server at its link's address."""
    return {
        "DATABASE_URL": stack.postgres.url(host=host.address),
        "REDIS_URL": stack.broker.url_at(host.address),
        "EMAIL_PROVIDER_URL": f"http://{host.address}:{stack.provider.port}",
    }


def test_a_host_cut_off_mid_batch_is_taken_over_and_its_late_commit_refused(
    postgres_cluster_template: PrivatePostgres, tmp_path: Path
) -> None:
    with ExitStack() as context:
        a, b = context.enter_context(hosts(2))
        stack = context.enter_context(private_stack(
            tmp_path, postgres_cluster_template, listen=(a.address, b.address),
            latency_ms=LATENCY_MS))
        assert a.reaches(stack.postgres.port) and b.reaches(stack.broker.port)

        stack.beat(via=b.via, **on(b, stack))
        pool_a = [stack.worker(f"a{n}", via=a.via, wait=False, **on(a, stack))
                  for n in range(1, POOL + 1)]
        pool_b = [stack.worker(f"b{n}", via=b.via, wait=False, **on(b, stack))
                  for n in range(1, POOL + 1)]
        stack.wait_ready(*pool_a, *pool_b)
        owners_a = {worker.lease_owner for worker in pool_a}
        session_id, batch_id = stack.send_batch(RECIPIENTS)

        def a_sending() -> dict[str, Any] | None:
            return next((row for row in stack.notice_rows(session_id).values()
                         if row["phase"] == "confirm" and row["status"] == "running"
                         and row["lease_owner"] in owners_a), None)

        sending = wait_for(a_sending, "a worker of host A to be inside a send", every=0.02)
        a.cut()
        assert sending is not None
        assert not a.reaches(stack.postgres.port), "the link is still up"
        # What host A holds now, it cannot give back or renew: every lease of its pool.
        held = {row["id"]: row for row in stack.rows(session_id)
                if row["status"] == "running" and row["lease_owner"] in owners_a}
        assert sending["id"] in held, "A's send ended before the cut"

        def taken_over() -> dict[str, dict[str, Any]] | None:
            rows = {task_id: stack.row(task_id) for task_id in held}
            done = all(rows[t]["epoch"] > held[t]["epoch"] for t in held)
            return rows if done and rows[sending["id"]]["status"] == "terminal" else None

        def a_said(*what: str) -> list[str]:
            return [line for worker in pool_a for line in worker.output().splitlines()
                    if any(text in line for text in what)]

        def not_taken_over() -> str:
            """What a timeout reports: each held task's row now, and B's last log lines."""
            rows = [stack.row(task_id) for task_id in held]
            fields = ("id", "kind", "phase", "status", "epoch", "lease_owner", "lease_until")
            tail = [line for worker in pool_b for line in worker.output().splitlines()[-15:]]
            return "\n".join([*(str({f: row[f] for f in fields}) for row in rows),
                              f"dispatches: {stack.query(DISPATCHES, [list(held)])}",
                              *tail])

        try:
            try:
                taken = wait_for(taken_over, "host B to take over every task host A held",
                                 timeout=30, every=0.1)
            except TimeoutError as exc:
                raise AssertionError(f"{exc}\n{not_taken_over()}") from exc
            assert taken is not None
            assert not a_said(LEASE_LOST), "A heard back while cut off"
        finally:
            a.restore()
        # Each of A's workers that held a lease commits late, once the link is back.
        wait_for(lambda: all(any(t in line for line in a_said(LEASE_LOST, UNAVAILABLE))
                             for t in held),
                 "A's late commits to be refused", timeout=30, every=0.2)
        batch = stack.wait_done(batch_id, timeout=60)

        # B took every task over after A's leases expired (a claim bumps the epoch, and
        # only B could claim), and finished the notice A was sending.
        logs_b = "".join(worker.output() for worker in pool_b)
        for task_id, row in held.items():
            assert f"recovering {task_id}" in logs_b, task_id
            assert taken[task_id]["epoch"] >= row["epoch"] + 1, taken[task_id]
        finished = taken[sending["id"]]
        assert finished["restarts"] == 1, finished
        assert finished["outcome"]["kind"] == "succeeded", finished["outcome"]
        # A's commit for it, sent once the link was back, was refused by its stale epoch.
        lost = [line for line in a_said(LEASE_LOST) if sending["id"] in line]
        assert len(lost) == 1, a_said(LEASE_LOST)
        ends = [item for item in stack.history(session_id, sending["id"])
                if item["status"] == "terminal"]
        assert len(ends) == 1, ends
        assert stack.row(sending["id"])["epoch"] == finished["epoch"], "A moved it after all"

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
