"""Email batch benchmark (issue 3): the reference application under load, and its recovery.

A 1,000-email ``send-batch`` runs against the local provider (no added latency) on
real Celery workers (``-P solo``) and beat, in their own database and Redis db, as
in a deployment. Everything is measured from the outside, from what the system
records anyway, so the kernel and the control plane run unmodified:

- **throughput**: emails/s and phase commits/s over one clean batch, from the
  ``at`` of the commit that created the batch to the ``at`` of the one that ended it;
- **scheduling latency**, commit to phase start: for every task, from the commit that
  made it runnable (``pending`` in a commit summary) to the first commit the task
  itself makes afterwards. The claim is not recorded anywhere, so this is an upper
  bound: it includes the making commit's own transaction (``at`` is stamped before
  it) and the phase's work up to its first commit (for ``send-notice``, reading the
  plan document). It is reported twice: for sequential one-email batches committed
  while the workers are idle (the scheduling path itself), and for the 1,000-email
  batch, where it is dominated by waiting in the queue behind the other emails;
- **recovery**: a second batch, every worker SIGKILLed mid-batch, new workers
  started at once; the timeline from their start (and from the lease expiry of the
  emails the killed workers held) until every stranded email (leased to a dead
  worker, or whose broker message died unacknowledged with one) is dispatched again
  and claimed again, and until every unfinished email has been claimed again;
- **end state**: the provider holds exactly one message per recipient, for both
  batches, and no recipient was sent a second POST.

Run it with ``python -m benchmarks.batch`` (``--help`` lists the knobs) or as part of
``make bench``; it writes the section "Email batch (issue 3)" of ``docs/benchmarks.md``.
Targets from the issue: scheduling latency p50 <= 20 ms; all 1,000 recovered within
5 s after lease expiry.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import platform
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

from benchmarks._batch_system import (
    Bench,
    Delivery,
    Sample,
    check_delivery,
    mean_notice_phase,
    queued_tasks,
    scheduling_samples,
    wait_batch,
)
from benchmarks._support import (
    BENCH_DATABASE,
    Activity,
    Cluster,
    Stats,
    code_revision,
    fresh_database,
    load_average,
    parse_arguments,
    progress,
    publish,
)
from benchmarks._support import machine_facts as common_facts
from controlplane.dev.ports import reserved_redis_url
from controlplane.dev.processes import process_env, start_provider, wait_for

HEADING = "## Email batch (issue 3)"
DEFAULT_DATABASE = f"{BENCH_DATABASE}_batch"
DEFAULT_REDIS_DB = 14
TARGET_SCHEDULING_P50_MS = 20.0
TARGET_RECOVERY_S = 5.0
QUEUES = "default,hands,brain"


@dataclass(frozen=True)
class Config:
    """What one run does; the defaults are the issue's acceptance run."""

    emails: int = 1000
    workers: int = 2
    probes: int = 40
    probe_warmup: int = 3
    recovery: bool = True
    kill_after: int = 300
    # Provider latency in the recovery batch only: the smoke test's dozen emails would
    # otherwise all be sent before the kill. The benchmark itself adds none.
    recovery_latency_ms: int = 0
    lease_seconds: float = 5.0
    redeliver_seconds: float | None = None  # KERNEL_REDELIVER_SECONDS; None: the setting's
    batch_timeout: float = 3600.0
    poll_seconds: float = 0.025
    logs: str | None = None  # keep worker and beat logs here (default: a temporary dir)


# -- results ----------------------------------------------------------------------------


@dataclass(frozen=True)
class BatchResult:
    emails: int
    seconds: float
    phase_commits: int
    latency: Stats
    notice_latency: Stats
    phase_seconds_mean: float
    delivery: Delivery

    @property
    def emails_per_second(self) -> float:
        return self.emails / self.seconds

    @property
    def phases_per_second(self) -> float:
        return self.phase_commits / self.seconds


@dataclass(frozen=True)
class Recovery:
    """The kill-and-restart timeline, in seconds from the new workers' spawn.

    *Stranded* emails are those that cannot progress without the sweep: the orphans
    (leased to a killed worker) and the pending emails whose broker message a killed
    worker had taken from the queue (kombu restores unacknowledged messages only after
    its one-hour visibility timeout, and one popped but not yet recorded as unacked is
    gone). ``None`` where a step did not apply (nothing was stranded).
    """

    killed_after: int
    orphans: int
    # Orphans with an ``advance`` message still queued (a duplicate the dispatcher sent):
    # a live worker that takes it claims the task once its lease has lapsed, no sweep
    # needed.
    orphans_queued: int
    pending_at_kill: int
    queue_at_kill: int  # messages in the ``hands`` queue, duplicates included
    unacked_at_kill: int
    stranded_pending: int
    lease_expiry: float | None  # from spawn; negative if it expired before the spawn
    spawn_after_kill: float
    workers_ready: float
    redispatched: float | None
    reclaimed: float | None
    all_claimed: float
    batch_seconds: float
    delivery: Delivery

    @property
    def stranded(self) -> int:
        return self.orphans + self.stranded_pending

    def after_expiry(self, at: float | None) -> float | None:
        if at is None or self.lease_expiry is None:
            return None
        return at - self.lease_expiry

    @property
    def recovered(self) -> float:
        """When every unfinished email could progress again without anyone's help.

        That is: new workers consuming, every pending email with a message in the
        queue, and every stranded one dispatched again by the sweep.
        """
        return max(self.workers_ready, self.redispatched or 0.0)


@dataclass(frozen=True)
class Result:
    when: datetime
    config: Config
    facts: dict[str, str]
    database: str
    redis_url: str
    redeliver_seconds: float
    probe: list[Sample]
    batch: BatchResult
    recovery: Recovery | None
    activity: list[tuple[str, Activity]]

    @property
    def probe_stats(self) -> Stats:
        return Stats.of([s.seconds for s in self.probe])


# -- measurements -----------------------------------------------------------------------


def measure_probe(bench: Bench, count: int, warmup: int) -> list[Sample]:
    """Scheduling latency with idle workers: one-email batches, one after another.

    Each gives three samples (batch ``plan``, notice ``send``, batch ``summarize``), all
    taken when a worker is free, so they measure the path commit -> broker -> worker
    -> claim -> phase, without queueing behind other work.
    """
    samples: list[Sample] = []
    for i in range(warmup + count):
        session_id, task_id = bench.commit_batch([f"probe{i}@probe.example"], f"probe {i}")
        done = functools.partial(lambda t: bench.status(t) == "terminal", task_id)
        wait_for(done, f"probe batch {i}", timeout=60, every=0.05)
        if i >= warmup:
            samples += scheduling_samples(bench.commits(session_id))
        time.sleep(0.05)  # let the worker ack and return to the broker
    return samples


def measure_batch(bench: Bench, config: Config) -> BatchResult:
    """One clean batch: throughput, in-batch scheduling latency, end state."""
    recipients = [f"r{i:04d}@clean.example" for i in range(config.emails)]
    bench.admin.reset()
    session_id, task_id = bench.commit_batch(recipients, "bench: clean batch")
    wait_batch(bench, session_id, task_id, config.emails, "clean batch", config.batch_timeout)
    commits = bench.commits(session_id)
    end = next(
        c.at
        for c in commits
        if any(i.get("id") == task_id and i.get("status") == "terminal" for i in c.summary)
    )
    samples = scheduling_samples(commits)
    notices = [s.seconds for s in samples if s.kind == "send-notice"]
    return BatchResult(
        emails=config.emails,
        seconds=end - commits[0].at,
        phase_commits=sum(1 for c in commits if c.actor.startswith("task:")),
        latency=Stats.of([s.seconds for s in samples]),
        notice_latency=Stats.of(notices),
        phase_seconds_mean=mean_notice_phase(commits, task_id),
        delivery=check_delivery(bench, task_id, recipients),
    )


def measure_recovery(bench: Bench, cluster: Cluster, config: Config, redis_url: str) -> Recovery:
    """Kill every worker mid-batch, start new ones at once, and time the way back.

    At the kill, the unfinished emails are sorted by what they need: those whose
    message is still queued need only a live worker; the stranded ones (see
    :class:`Recovery`) need the sweep, after lease expiry for the orphans. Then the
    new workers' readiness, each stranded email's new dispatch (``delivered_at`` after
    the kill) and claim (``epoch`` bumped), and every email's claim are polled.
    """
    import redis

    broker = redis.Redis.from_url(redis_url)
    recipients = [f"r{i:04d}@recovery.example" for i in range(config.emails)]
    bench.admin.reset()
    if config.recovery_latency_ms:
        bench.admin.set_faults(latency_ms=config.recovery_latency_ms)
    session_id, batch_id = bench.commit_batch(recipients, "bench: recovery batch")
    started = time.time()
    wait_batch(
        bench,
        session_id,
        batch_id,
        config.emails,
        "recovery batch",
        config.batch_timeout,
        until=lambda counts: counts["terminal"] >= config.kill_after,
    )

    victims = cluster.workers()
    for worker in victims:
        worker.kill(wait=False)
    for worker in victims:
        worker.popen.wait(timeout=10)
    killed = time.time()
    # What the dead left behind, read before anything new can run.
    snapshot = bench.rows(
        "SELECT id, status, epoch, lease_owner, lease_until FROM kernel_task "
        "WHERE session_id = %s AND kind = 'send-notice' AND status <> 'terminal'",
        [session_id],
    )
    queued = queued_tasks(broker, "hands")
    queue_length = int(broker.llen("hands")) + int(broker.llen("hands.now"))
    unacked = int(broker.hlen("unacked"))
    spawned = cluster.spawn_workers(config.workers)
    spawn = min(w.started for w in spawned)

    dead = {w.lease_owner for w in victims}
    strangers = [r[0] for r in snapshot if r[1] == "running" and r[3] not in dead]
    if strangers:
        raise RuntimeError(f"running tasks leased to no killed worker: {strangers}")
    orphans = [r[0] for r in snapshot if r[1] == "running"]
    pending = [r[0] for r in snapshot if r[1] == "pending"]
    lost = [t for t in pending if t not in queued]
    stranded = {r[0]: r[2] for r in snapshot if r[0] in set(orphans) | set(lost)}
    expiries = [r[4].timestamp() for r in snapshot if r[1] == "running"]
    done_at_kill = config.emails - len(snapshot)
    progress(
        f"recovery: killed {len(victims)} workers after {done_at_kill} emails: "
        f"{len(orphans)} orphaned, {len(pending)} pending ({len(lost)} of them with no "
        f"queued message; {unacked} unacked)"
    )

    ids = [r[0] for r in snapshot]
    epochs = [r[2] for r in snapshot]
    since = datetime.fromtimestamp(killed, UTC)
    redispatched: dict[str, float] = {}
    reclaimed: dict[str, float] = {}
    ready: float | None = None
    deadline = time.monotonic() + config.batch_timeout
    while True:
        now = time.time()
        if ready is None and all(w.ready() for w in spawned):
            ready = max(w.ready_at or now for w in spawned)
        if len(reclaimed) < len(stranded):
            for task_id, status, epoch, delivered in bench.rows(
                "SELECT t.id, t.status, t.epoch, min(d.delivered_at) FROM kernel_task t "
                "LEFT JOIN kernel_dispatch d ON d.task_id = t.id AND d.delivered_at > %s "
                "WHERE t.id = ANY(%s) GROUP BY t.id",
                [since, list(stranded)],
            ):
                if delivered is not None:
                    redispatched.setdefault(task_id, delivered.timestamp())
                if status == "terminal" or epoch > stranded[task_id]:
                    redispatched.setdefault(task_id, now)  # claimed before we saw its row
                    reclaimed.setdefault(task_id, now)
            if len(reclaimed) == len(stranded):
                progress(
                    f"recovery: all {len(stranded)} stranded emails claimed again "
                    f"{now - spawn:.2f} s after the new workers' start"
                )
        left = bench.rows(
            "SELECT count(*) FROM kernel_task t, unnest(%s::text[], %s::bigint[]) AS s(id, epoch) "
            "WHERE t.id = s.id AND t.status <> 'terminal' AND t.epoch <= s.epoch",
            [ids, epochs],
        )[0][0]
        if left == 0 and ready is not None and len(reclaimed) == len(stranded):
            all_claimed = now
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"recovery: {left} emails never claimed again")
        time.sleep(config.poll_seconds if len(reclaimed) < len(stranded) else 0.25)

    wait_batch(bench, session_id, batch_id, config.emails, "recovery batch", config.batch_timeout)
    end = bench.commits(session_id)[-1].at
    return Recovery(
        killed_after=done_at_kill,
        orphans=len(orphans),
        orphans_queued=len(set(orphans) & queued),
        pending_at_kill=len(pending),
        queue_at_kill=queue_length,
        unacked_at_kill=unacked,
        stranded_pending=len(lost),
        lease_expiry=max(expiries) - spawn if expiries else None,
        spawn_after_kill=spawn - killed,
        workers_ready=(ready or now) - spawn,
        redispatched=max(redispatched.values()) - spawn if stranded else None,
        reclaimed=max(reclaimed.values()) - spawn if stranded else None,
        all_claimed=all_claimed - spawn,
        batch_seconds=end - started,
        delivery=check_delivery(bench, batch_id, recipients),
    )


# -- the run ----------------------------------------------------------------------------


def fresh_start(cluster: Cluster, config: Config, redis_url: str) -> None:
    """New workers on an empty broker, so the recovery batch starts as the clean one did.

    A long batch leaves re-sent dispatch messages behind in the queue; they would
    otherwise sit ahead of the next batch's messages and blur its recovery timeline.
    """
    import redis

    cluster.stop(cluster.workers())
    redis.Redis.from_url(redis_url).flushdb()
    cluster.wait_ready(cluster.spawn_workers(config.workers))


@contextmanager
def running_system(url: str, redis_url: str, config: Config) -> Iterator[tuple[Bench, Cluster]]:
    """Provider, beat and ``config.workers`` workers on ``url`` and ``redis_url``."""
    import redis

    redis.Redis.from_url(redis_url).flushdb()
    with contextlib.ExitStack() as stack:
        if config.logs is None:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-batch-"))
        else:
            tmp = config.logs
            Path(tmp).mkdir(parents=True, exist_ok=True)
        provider = stack.enter_context(start_provider())
        env = process_env(
            url,
            redis_url,
            EMAIL_PROVIDER_URL=provider.url,
            KERNEL_LEASE_SECONDS=f"{config.lease_seconds:g}",
            **(
                {"KERNEL_REDELIVER_SECONDS": f"{config.redeliver_seconds:g}"}
                if config.redeliver_seconds is not None
                else {}
            ),
            DJANGO_DEBUG="0",  # as deployed: DEBUG would keep every query
            DJANGO_SETTINGS_MODULE="controlplane.settings",
        )
        cluster = Cluster(Path(tmp), env)
        bench = Bench(redis_url, provider.url)
        try:
            cluster.start_beat()
            cluster.wait_ready(cluster.spawn_workers(config.workers))
            yield bench, cluster
        finally:
            cluster.close()
            bench.close()


def run(url: str, redis_url: str, config: Config) -> Result:
    """Every measurement of this module; Django must already be set up on ``url``."""
    facts = machine_facts(url, redis_url)
    when = datetime.now(UTC)
    with running_system(url, redis_url, config) as (bench, cluster):
        progress(f"probe: {config.probes} one-email batches on idle workers")
        probe = measure_probe(bench, config.probes, config.probe_warmup)
        probe_stats = Stats.of([s.seconds for s in probe])
        progress(
            f"probe: commit-to-phase-start p50 {probe_stats.p50:.1f} ms, "
            f"p99 {probe_stats.p99:.1f} ms"
        )
        progress(f"clean batch: {config.emails} emails on {config.workers} workers")
        batch = measure_batch(bench, config)
        clean = cluster.workers()
        progress(
            f"clean batch: {batch.seconds:.1f} s, {batch.emails_per_second:.1f} emails/s, "
            f"{batch.phases_per_second:.1f} phases/s"
        )
        recovery = None
        if config.recovery:
            progress(
                f"recovery batch: {config.emails} emails, kill every worker after "
                f"{config.kill_after}"
            )
            fresh_start(cluster, config, redis_url)
            recovery = measure_recovery(bench, cluster, config, redis_url)
        # Stopped gracefully, each worker has logged every run it finished.
        cluster.stop(cluster.workers())
        activity = [("probes and clean batch", cluster.activity(clean))]
        if recovery is not None:
            later = [w for w in cluster.all_workers() if w not in clean]
            activity.append(("recovery batch", cluster.activity(later)))
    facts["load_after"] = load_average()
    if code_revision()[1] != facts.pop("fingerprint"):
        facts["revision"] += " (**kernel/ or controlplane/ changed during the run**)"
    database = urlsplit(url).path.lstrip("/")
    redeliver = config.redeliver_seconds
    if redeliver is None:
        from django.conf import settings

        redeliver = float(settings.KERNEL_REDELIVER_SECONDS)
    return Result(
        when, config, facts, database, redis_url, redeliver, probe, batch, recovery, activity
    )


def machine_facts(url: str, redis_url: str) -> dict[str, str]:
    """The facts a reader needs to compare this run with another, load included.

    Other work on the machine shows up directly in these latencies, so the load
    average before and after the run is part of the record.
    """
    import celery
    import redis

    facts = common_facts(url)
    facts["celery"] = celery.__version__
    info = redis.Redis.from_url(redis_url).info("server")
    facts["redis"] = str(info.get("redis_version", "?"))
    facts["platform"] = platform.platform(terse=True)
    facts["load_before"] = load_average()
    facts["revision"], facts["fingerprint"] = code_revision()
    return facts


# -- the report -------------------------------------------------------------------------


def _ms(s: Stats) -> str:
    return " | ".join([str(s.count), *(_num(v) for v in (s.p50, s.p90, s.p99, s.max))])


def _num(ms: float) -> str:
    """Milliseconds as read in a table: a decimal below 1 s, whole and grouped above."""
    return f"{ms:.1f}" if ms < 1000 else f"{ms:,.0f}"


def _s(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _verdict(ok: bool) -> str:
    return "met" if ok else "**not met**"


def render(result: Result) -> str:
    """The markdown section for ``docs/benchmarks.md``."""
    cfg, facts, batch, rec = result.config, result.facts, result.batch, result.recovery
    probe = result.probe_stats
    hops = sorted({(s.kind, s.phase) for s in result.probe})
    worker_ms = cfg.workers * batch.seconds / batch.emails * 1000.0
    phase_ms = batch.phase_seconds_mean * 1000.0
    lines = [
        HEADING,
        "",
        f"Run {result.when:%Y-%m-%d %H:%M} UTC by `make bench` (`python -m benchmarks.batch`) "
        f"on revision {facts['revision']}. "
        f"Machine: {facts['nproc']} CPUs ({facts['cpu']}), {facts['platform']}, load average "
        f"{facts['load_before']} before the run and {facts['load_after']} after it; "
        f"PostgreSQL {facts['version']} and Redis {facts['redis']} on the same host "
        f"(`fsync={facts['fsync']}`, `synchronous_commit={facts['synchronous_commit']}`); "
        f"Python {facts['python']}, Celery {facts['celery']}, Django {facts['django']}. "
        f"{cfg.workers} worker(s) `celery worker -P solo -Q {QUEUES}` and one beat (sweep "
        f"every 1 s), `KERNEL_LEASE_SECONDS={cfg.lease_seconds:g}`, "
        f"`KERNEL_REDELIVER_SECONDS={result.redeliver_seconds:g}`, `DJANGO_DEBUG=0`, other "
        "settings at their defaults; the local provider with no added latency or faults.",
        "",
        "| target | measured | verdict |",
        "|---|---|---|",
        f"| scheduling latency p50 <= {TARGET_SCHEDULING_P50_MS:g} ms, idle workers "
        f"| {probe.p50:.1f} ms | {_verdict(probe.p50 <= TARGET_SCHEDULING_P50_MS)} |",
        f"| (not a target) commit-to-phase-start inside the {batch.emails}-email batch: "
        f"{batch.emails} tasks made runnable by one commit wait their turn on "
        f"{cfg.workers} worker(s) | {_num(batch.latency.p50)} ms | queueing: about "
        f"{batch.emails / 2 / max(batch.emails_per_second, 1e-9) * 1000:,.0f} ms is half "
        "the batch at its throughput |",
    ]
    if rec is not None:
        recovered = rec.after_expiry(rec.recovered)
        claimed = rec.after_expiry(rec.all_claimed)
        lines += [
            f"| all {cfg.emails} recovered within {TARGET_RECOVERY_S:g} s after lease expiry: "
            f"every unfinished email queued again or running | {_s(recovered)} s "
            f"| {_verdict(recovered is not None and recovered <= TARGET_RECOVERY_S)} |",
            "| the same, counting an email only once a live worker has claimed it "
            f"| {_s(claimed)} s "
            f"| {_verdict(claimed is not None and claimed <= TARGET_RECOVERY_S)} |",
        ]
    lines += [
        "",
        "| clean batch | s | emails/s | phase commits | phases/s |",
        "|---|---:|---:|---:|---:|",
        f"| {batch.emails} emails, {cfg.workers} worker(s) | {batch.seconds:.1f} "
        f"| {batch.emails_per_second:.1f} | {batch.phase_commits} "
        f"| {batch.phases_per_second:.1f} |",
        "",
        f"Worker time per email: {worker_ms:.0f} ms (the scheduler's own cost per email "
        f"when the queue is never empty). A notice's intent commit lands {phase_ms:.0f} ms "
        "before the commit that records its receipt: the provider call and its "
        "bookkeeping, and, where a queue message's worker holds the receipt back to ride with the "
        "next notice's intent commit, that notice's claim and plan read too.",
        "",
        "| commit-to-phase-start (ms, upper bound) | n | p50 | p90 | p99 | max |",
        "|---|---:|---:|---:|---:|---:|",
        f"| idle workers, {cfg.probes} one-email batches: all | {_ms(probe)} |",
    ]
    for kind, phase in hops:
        stats = Stats.of([s.seconds for s in result.probe if (s.kind, s.phase) == (kind, phase)])
        lines.append(f"| idle workers: `{kind}` `{phase}` | {_ms(stats)} |")
    lines += [
        f"| {batch.emails}-email batch: all tasks | {_ms(batch.latency)} |",
        f"| {batch.emails}-email batch: `send-notice` | {_ms(batch.notice_latency)} |",
        "",
    ]
    if rec is not None:
        expiry = "n/a" if rec.lease_expiry is None else "0"
        lines += [
            f"Recovery: a second {cfg.emails}-email batch. After {rec.killed_after} emails were "
            f"done every worker was SIGKILLed, leaving {rec.orphans} email(s) leased to a dead "
            f"worker and {rec.pending_at_kill} pending; "
            f"{rec.pending_at_kill - rec.stranded_pending} of these had a "
            f"message queued in Redis, {rec.stranded_pending} had none (a killed worker had "
            f"taken it; {rec.unacked_at_kill} messages were left unacknowledged, which kombu "
            "restores only after an hour; the queue held "
            f"{rec.queue_at_kill} messages, duplicates included). "
            f"{cfg.workers} new worker(s) were started "
            f"{rec.spawn_after_kill * 1000:.0f} ms after the kill. The {rec.stranded} stranded "
            "emails (leased to the dead, or without a message) need the sweep; the others "
            "only a live worker. Seconds from the new workers' start, and after the lease "
            "expiry of the emails the dead held:",
            "",
            "| recovery step | s from start | s after lease expiry |",
            "|---|---:|---:|",
            f"| the dead workers' leases expire | {_s(rec.lease_expiry)} | {expiry} |",
            f"| new workers ready | {_s(rec.workers_ready)} "
            f"| {_s(rec.after_expiry(rec.workers_ready))} |",
            f"| every stranded email dispatched again by the sweep | {_s(rec.redispatched)} "
            f"| {_s(rec.after_expiry(rec.redispatched))} |",
            f"| every stranded email claimed by a live worker | {_s(rec.reclaimed)} "
            f"| {_s(rec.after_expiry(rec.reclaimed))} |",
            "| every unfinished email claimed by a live worker, or finished "
            f"| {_s(rec.all_claimed)} | {_s(rec.after_expiry(rec.all_claimed))} |",
            "",
            f"The recovery batch took {rec.batch_seconds:.1f} s in all "
            f"({cfg.emails / rec.batch_seconds:.1f} emails/s, outage included).",
            "",
        ]
    lines += [
        "| end state | batch | messages | one per recipient | POSTs | repeated POSTs "
        "| lookups | batch outcome |",
        "|---|---|---:|---|---:|---:|---:|---|",
    ]
    checked = [("clean", batch.delivery)] + ([("recovery", rec.delivery)] if rec else [])
    for name, d in checked:
        lines.append(
            f"| {'ok' if d.ok else '**wrong**'} | {name} | {d.messages} "
            f"| {'yes' if d.one_per_recipient else '**no**'} | {d.posts} | {d.duplicate_posts} "
            f"| {d.lookups} | {d.outcome}, {d.sent} sent |"
        )
    lines += [
        "",
        "| worker logs | `advance` ran a phase | `advance` found nothing claimable "
        "| dispatches sent by sweeps |",
        "|---|---:|---:|---:|",
    ]
    for stage, act in result.activity:
        lines.append(
            f"| {stage} | {act.phases} | {act.idle} | {act.redelivered} |"
        )
    lines += [
        "",
        "An `advance` message that finds nothing claimable did no work: the task was "
        "already claimed or finished (a duplicate or re-sent dispatch), or its row was "
        "locked by another commit in progress (the claim skips locked rows; the worker then "
        "looks again shortly, and the sweep re-sends what is still unclaimed "
        f"{result.redeliver_seconds:g} s after a send, waiting longer after each). The "
        "dispatches sent by sweeps include those of each new worker's first sweep.",
        "",
        "Method: batches are committed as the API would (a `send-batch` task, its dispatch "
        f"delivered to Redis after the commit) in the dedicated database `{result.database}` "
        f"(recreated for the run) and Redis db `{result.redis_url.rsplit('/', 1)[-1]}` "
        "(flushed). Throughput runs from the `at` of the commit that created the batch to "
        "the `at` of the commit that ended it; phase commits are `kernel_commit` rows whose "
        "actor is `task:*`. Commit-to-phase-start is read from the commit log: from the "
        "commit whose summary lists the task as `pending` to the task's next own commit. "
        "The claim itself is not recorded, so this is an upper bound, by the making commit's "
        "transaction (its `at` is stamped before it) and by the phase's work up to its "
        "first commit (for `send-notice`, reading the plan document). Idle-worker samples "
        "come from one-email batches committed one after another, after "
        f"{cfg.probe_warmup} warm-up batches; inside the big batch each email also waits "
        "in the queue behind the emails before it, so those samples measure the backlog "
        "more than the scheduler. Recovery is polled every "
        f"{cfg.poll_seconds * 1000:.0f} ms from `kernel_task` (a claim bumps `epoch`) and "
        "`kernel_dispatch` (the sweep's `delivered_at`); the queue is read from Redis at "
        "the kill; lease expiry is the latest `lease_until` among the emails the dead held. "
        "Percentiles are nearest-rank.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.batch",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    defaults = Config()
    parser.add_argument("--emails", type=int, default=defaults.emails)
    parser.add_argument("--workers", type=int, default=defaults.workers)
    parser.add_argument(
        "--probes",
        type=int,
        default=defaults.probes,
        help="one-email batches for the idle-worker latency",
    )
    parser.add_argument(
        "--kill-after",
        type=int,
        default=defaults.kill_after,
        help="emails done before every worker is killed",
    )
    parser.add_argument("--no-recovery", action="store_true", help="skip the kill and restart")
    parser.add_argument("--lease-seconds", type=float, default=defaults.lease_seconds)
    parser.add_argument(
        "--redeliver-seconds",
        type=float,
        help="KERNEL_REDELIVER_SECONDS for the workers (default: the setting's default)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=defaults.batch_timeout,
        help="seconds a batch may take before the run gives up",
    )
    parser.add_argument("--logs", help="keep the worker and beat logs in this directory")
    parser.add_argument("--redis-db", type=int, default=DEFAULT_REDIS_DB)
    args, url = parse_arguments(parser, argv, DEFAULT_DATABASE)
    if not args.no_recovery and not 0 < args.kill_after < args.emails:
        parser.error("--kill-after must be between 0 and --emails")
    config = Config(
        emails=args.emails,
        workers=args.workers,
        probes=args.probes,
        recovery=not args.no_recovery,
        kill_after=args.kill_after,
        lease_seconds=args.lease_seconds,
        redeliver_seconds=args.redeliver_seconds,
        batch_timeout=args.timeout,
        logs=args.logs,
    )

    with reserved_redis_url(db=args.redis_db) as redis_url:
        fresh_database(args, url, redis_url)
        result = run(url, redis_url, config)
    return publish(HEADING, render(result), write=not args.no_write)


if __name__ == "__main__":
    raise SystemExit(main())
