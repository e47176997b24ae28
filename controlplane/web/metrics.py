"""Prometheus metrics, read from the Session Store at scrape time.

Not public: every scrape aggregates whole tables. Prometheus sends
``Authorization: Bearer <METRICS_TOKEN>`` (``bearer_token`` / ``authorization`` in its
scrape config); a logged-in operator may look too. Anyone else gets 401 (403 for a
logged-in account that is not an operator); with no ``METRICS_TOKEN`` set, only
operators' browsers can read them.

Workers, beat and web servers are separate processes on separate machines, so
per-process counters would each see a slice. The database sees everything: every
figure here is one aggregate query, and therefore the same whichever web process
Prometheus happens to scrape.
"""

from __future__ import annotations

from collections.abc import Iterator

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.utils.crypto import constant_time_compare
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from controlplane import access
from controlplane.process.kernel import process_kernel
from controlplane.reads.metrics import store_figures
from controlplane.reads.replica import on_replica
from controlplane.sockets import feed_subscribers


class SessionStoreCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        # The database's clock, as leases and due times are written by: the web
        # machine's own may disagree by more than a lease.
        now = process_kernel().clock.now()
        with on_replica():  # aggregates: a replica's lag of a moment does not matter
            found = store_figures(now)
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
        # A gauge: a retried or restarted task leaves its outcome's count, which a
        # counter must never do (Prometheus reads a drop as a reset and counts the rest
        # again as new).
        outcomes = GaugeMetricFamily(
            "durable_task_outcomes", "Tasks ended now, by outcome", labels=["outcome"]
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
            "durable_blocked_tasks",
            "Runnable tasks no worker can run (every dispatch row marked blocked): they "
            "wait for a deploy or an operator",
            value=found.blocked_tasks,
        )
        yield GaugeMetricFamily(
            "durable_feed_subscribers",
            "Change-feed websockets connected to this web process",
            value=feed_subscribers.count(),
        )


REGISTRY = CollectorRegistry(auto_describe=False)
REGISTRY.register(SessionStoreCollector())


def scraper_or_operator(request: HttpRequest) -> int | None:
    """None if ``request`` may read the metrics; else the status to refuse it with."""
    token = settings.METRICS_TOKEN
    if token and constant_time_compare(request.headers.get("Authorization", ""),
                                       f"Bearer {token}"):
        return None
    if access.may_act(request.user):
        return None
    return 403 if request.user.is_authenticated else 401


def metrics(request: HttpRequest) -> HttpResponse:
    refused = scraper_or_operator(request)
    if refused is not None:
        answer = HttpResponse(
            "metrics need the Prometheus bearer token (METRICS_TOKEN) or an operator login\n",
            status=refused, content_type="text/plain",
        )
        answer["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return answer
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)
