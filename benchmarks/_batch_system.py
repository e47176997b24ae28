"""The email batch benchmark's view of the system under test, from outside (part of
``batch``): batches committed as the API would, and what the system records anyway
(the commit log, the task rows, the provider's messages, the broker's queue), read
without touching the kernel or the control plane.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks._support import delivering_kernel, progress

TASK_ID = re.compile(r"task_[0-9a-f]{8,}")


class Bench:
    """The bench's own view: a kernel to commit batches with, and read-only SQL.

    Batches are committed exactly as the API or ``manage.py send_notices`` would, with
    the dispatch delivered to the broker after the commit, but through a producer on
    this run's Redis db rather than the Celery app's configured broker.
    """

    def __init__(self, redis_url: str, provider_url: str) -> None:
        from controlplane.dev.provider_admin import ProviderAdmin

        self.kernel, self._broker = delivering_kernel(redis_url)
        self.admin = ProviderAdmin(provider_url)

    def close(self) -> None:
        self._broker.release()

    def commit_batch(self, recipients: list[str], title: str) -> tuple[str, str]:
        """Commit a ``send-batch`` task; returns (session id, task id)."""
        from kernel import Draft

        handle = self.kernel.create_session(metadata={"title": title})
        draft = Draft(actor="user:bench")
        task_id = draft.create_task(
            "send-batch",
            {
                "recipients": recipients,
                "subject": "Service notice",
                "body": "Please read the approved notice.",
                "channel": "http",
            },
        )
        handle.commit(draft)
        return handle.id, task_id

    @staticmethod
    def rows(sql: str, params: Sequence[Any] | dict[str, Any]) -> list[tuple[Any, ...]]:
        from django.db import connection

        with connection.cursor() as cur:
            cur.execute(sql, params)
            return list(cur.fetchall())

    def status(self, task_id: str) -> str:
        return str(self.rows("SELECT status FROM kernel_task WHERE id = %s", [task_id])[0][0])

    def notice_counts(self, session_id: str) -> Counter[str]:
        return Counter(
            dict(
                self.rows(
                    "SELECT status, count(*) FROM kernel_task WHERE session_id = %s "
                    "AND kind = 'send-notice' GROUP BY status",
                    [session_id],
                )
            )
        )

    def commits(self, session_id: str) -> list[CommitRow]:
        """The session's change feed, oldest first."""
        rows = self.rows(
            "SELECT seq, at, actor, summary::text FROM kernel_commit WHERE session_id = %s "
            "ORDER BY seq",
            [session_id],
        )
        return [
            CommitRow(seq, at.timestamp(), actor, json.loads(summary))
            for seq, at, actor, summary in rows
        ]

    def outcome(self, task_id: str) -> dict[str, Any]:
        raw = self.rows("SELECT outcome::text FROM kernel_task WHERE id = %s", [task_id])[0][0]
        return dict(json.loads(raw)) if raw else {}


@dataclass(frozen=True)
class CommitRow:
    """A ``kernel_commit`` row, its ``at`` as a Unix time to compare with ``time.time()``."""

    seq: int
    at: float
    actor: str
    summary: list[dict[str, Any]]


@dataclass(frozen=True)
class Sample:
    """One commit-to-phase-start latency: ``task`` became runnable, then ran ``phase``."""

    task: str
    kind: str
    phase: str
    seconds: float


def scheduling_samples(commits: Sequence[CommitRow]) -> list[Sample]:
    """Commit-to-phase-start upper bounds from one session's commit log, in ``seq`` order.

    A task becomes runnable in the commit whose summary lists it as ``pending``; its
    phase has started by the next commit whose actor is ``task:<id>``. Sleepers wake
    by the clock, not by a commit, and expired leases likewise: neither is sampled.
    """
    runnable: dict[str, tuple[float, str, str]] = {}
    samples = []
    for commit in commits:
        if commit.actor.startswith("task:"):
            task_id = commit.actor.removeprefix("task:")
            made = runnable.pop(task_id, None)
            if made is not None:
                samples.append(Sample(task_id, made[1], made[2], commit.at - made[0]))
        for item in commit.summary:
            if item.get("type") == "task" and item.get("status") == "pending":
                runnable[item["id"]] = (commit.at, item["kind"], item["phase"])
    return samples


# -- what it holds, read back -----------------------------------------------------------


@dataclass(frozen=True)
class Delivery:
    """What the provider holds for one batch, and what it was asked."""

    recipients: int
    messages: int
    one_per_recipient: bool
    posts: int
    duplicate_posts: int
    lookups: int
    sent: int
    outcome: str

    @property
    def ok(self) -> bool:
        return self.one_per_recipient and self.messages == self.recipients == self.sent


def check_delivery(bench: Bench, batch_id: str, recipients: list[str]) -> Delivery:
    """What the provider holds for this batch (the provider is reset before each batch)."""
    messages = bench.admin.messages()
    per_recipient = Counter(m["to"] for m in messages)
    posts = Counter(r.get("to") for r in bench.admin.requests() if r["method"] == "POST")
    lookups = sum(1 for r in bench.admin.requests() if r["method"] == "GET")
    outcome = bench.outcome(batch_id)
    return Delivery(
        recipients=len(recipients),
        messages=len(messages),
        one_per_recipient=per_recipient == Counter(recipients),
        posts=sum(posts.values()),
        duplicate_posts=sum(n - 1 for n in posts.values() if n > 1),
        lookups=lookups,
        sent=int((outcome.get("result") or {}).get("sent", 0)),
        outcome=str(outcome.get("kind", "none")),
    )


def wait_batch(
    bench: Bench,
    session_id: str,
    task_id: str,
    emails: int,
    label: str,
    timeout: float,
    until: Callable[[Counter[str]], bool] | None = None,
) -> Counter[str]:
    """Wait for the batch to end (or ``until`` to hold), with progress on stderr.

    The batch's own row is polled; its emails are counted (a scan of the session's
    tasks, 20 ms at 10,000 on this machine) only when ``until`` needs them and for the
    progress line, so that the poll does not take from the workers a share that grows
    with the batch."""
    started = last = time.monotonic()
    counts: Counter[str] = Counter()
    while True:
        now = time.monotonic()
        report = now - last >= 5.0
        if until is not None or report:
            counts = bench.notice_counts(session_id)
        if until is not None and until(counts):
            return counts
        if bench.status(task_id) == "terminal":
            return bench.notice_counts(session_id)
        done = counts["terminal"]
        if report:
            last = now
            rate = done / (now - started)
            eta = f", ETA {(emails - done) / rate:.0f} s" if rate > 0 else ""
            progress(f"{label}: {done}/{emails} emails done, {rate:.1f} emails/s{eta}")
        if now - started > timeout:
            raise TimeoutError(f"{label}: {done}/{emails} done after {timeout:g} s")
        time.sleep(0.2)


def mean_notice_phase(commits: Sequence[CommitRow], batch_id: str) -> float:
    """Mean time from a notice's first commit (its intent) to the commit that ended it.

    That stretch is the provider call and its bookkeeping; the rest of a worker's
    time per email is overhead around it (dispatch, claim, plan read). The ending is
    read from the summaries, not from the notice's own commits: a woken worker's
    receipt rides with the next notice's intent commit, whose actor is that notice.
    """
    first: dict[str, float] = {}
    ended: dict[str, float] = {}
    for c in commits:
        actor = c.actor.removeprefix("task:")
        if c.actor.startswith("task:") and actor != batch_id:
            first.setdefault(actor, c.at)
        for item in c.summary:
            if item.get("status") == "terminal" and item.get("id") != batch_id:
                ended.setdefault(item["id"], c.at)
    spans = [ended[t] - first[t] for t in first if t in ended]
    return sum(spans) / len(spans) if spans else 0.0


def queued_tasks(broker: Any, queue: str) -> set[str]:
    """Ids of the tasks that have an ``advance`` message waiting in ``queue``.

    Celery puts the task's arguments in the message headers (``argsrepr``) as well as
    the encoded body, so a regular expression over the raw message finds the id.
    """
    found: set[str] = set()
    for raw in [*broker.lrange(queue, 0, -1), *broker.lrange(f"{queue}.now", 0, -1)]:
        found.update(TASK_ID.findall(raw.decode(errors="replace")))
    return found
