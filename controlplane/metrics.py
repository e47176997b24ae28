"""Prometheus metrics, read from the Session Store at scrape time.

Workers, beat and web servers are separate processes on separate machines, so
per-process counters would each see a slice. The database sees everything: every
figure here is one aggregate query, and therefore the same whichever web process
Prometheus happens to scrape.
"""

from __future__ import annotations

from collections.abc import Iterator

from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from controlplane import feed_subscribers
from controlplane.reads.metrics import store_figures
from controlplane.reads.replica import on_replica


class SessionStoreCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        with on_replica():  # aggregates: a replica's lag of a moment does not matter
            found = store_figures(timezone.now())
        yield CounterMetricFamily("durable_commits", "Commits, all sessions", value=found.commits)
        yield CounterMetricFamily(
            "durable_claims", "Leases handed out (plus lease revocations by cancels)",
            value=found.claims,
        )
        yield GaugeMetricFamily(
            "durable_phase_restarts",
            "Restarts of current phases after an expired lease (reset when a phase moves on)",
            value=found.restarts,
        )
        tasks = GaugeMetricFamily("durable_tasks", "Tasks by status", labels=["status"])
        for status, n in found.tasks_by_status.items():
            tasks.add_metric([status], float(n))
        yield tasks
        outcomes = CounterMetricFamily(
            "durable_task_outcomes", "Finished tasks by outcome", labels=["outcome"]
        )
        for outcome, n in found.finished_by_outcome.items():
            outcomes.add_metric([outcome], float(n))
        yield outcomes
        yield GaugeMetricFamily(
            "durable_expired_leases", "Running tasks whose lease has expired",
            value=found.expired_leases,
        )
        yield GaugeMetricFamily(
            "durable_dispatch_lag_seconds", "Age of the oldest undelivered due dispatch",
            value=found.dispatch_lag_seconds,
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
