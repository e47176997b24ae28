"""Prometheus metrics, read from the Session Store at scrape time.

Workers, beat and web servers are separate processes on separate machines, so
per-process counters would each see a slice. The database sees everything: every
figure here is one aggregate query, and therefore the same whichever web process
Prometheus happens to scrape.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.db import connection
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from controlplane import feed_subscribers

STATUSES = ("pending", "running", "waiting", "sleeping", "completing", "terminal")
OUTCOMES = ("succeeded", "failed", "cancelled", "faulted")


def _rows(sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    with connection.cursor() as cur:
        cur.execute(sql, params or [])
        return list(cur.fetchall())


class SessionStoreCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        now = timezone.now()
        [(commits, claims, restarts)] = _rows(
            "SELECT (SELECT coalesce(sum(head_seq), 0) FROM kernel_session), "
            "coalesce(sum(epoch), 0), coalesce(sum(restarts), 0) FROM kernel_task"
        )
        yield CounterMetricFamily("durable_commits", "Commits, all sessions", value=commits)
        yield CounterMetricFamily(
            "durable_claims", "Leases handed out (plus lease revocations by cancels)", value=claims
        )
        yield GaugeMetricFamily(
            "durable_phase_restarts",
            "Restarts of current phases after an expired lease (reset when a phase moves on)",
            value=restarts,
        )
        by_status = dict(_rows("SELECT status, count(*) FROM kernel_task GROUP BY status"))
        tasks = GaugeMetricFamily("durable_tasks", "Tasks by status", labels=["status"])
        for status in STATUSES:
            tasks.add_metric([status], float(by_status.get(status, 0)))
        yield tasks
        by_outcome = dict(
            _rows(
                "SELECT outcome->>'kind', count(*) FROM kernel_task WHERE status = 'terminal' "
                "GROUP BY 1"
            )
        )
        outcomes = CounterMetricFamily(
            "durable_task_outcomes", "Finished tasks by outcome", labels=["outcome"]
        )
        for outcome in OUTCOMES:
            outcomes.add_metric([outcome], float(by_outcome.get(outcome, 0)))
        yield outcomes
        [(expired,)] = _rows(
            "SELECT count(*) FROM kernel_task WHERE status = 'running' AND lease_until < %s", [now]
        )
        yield GaugeMetricFamily(
            "durable_expired_leases", "Running tasks whose lease has expired", value=expired
        )
        [(oldest,)] = _rows(
            "SELECT min(not_before) FROM kernel_dispatch WHERE not_before <= %s "
            "AND delivered_at IS NULL",
            [now],
        )
        lag = (now - oldest).total_seconds() if oldest else 0.0
        yield GaugeMetricFamily(
            "durable_dispatch_lag_seconds", "Age of the oldest undelivered due dispatch", value=lag
        )
        yield GaugeMetricFamily(
            "durable_feed_subscribers",
            "Change-feed websockets connected to this web process",
            value=feed_subscribers.count(),
        )


REGISTRY = CollectorRegistry(auto_describe=False)
REGISTRY.register(SessionStoreCollector())


def metrics(request: HttpRequest) -> HttpResponse:
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)
