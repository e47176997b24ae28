"""Traces: the OpenTelemetry SDK and its OTLP exporter, set up when a process starts.

The kernel makes its spans through the OpenTelemetry API alone (:mod:`kernel.tracing`);
they go nowhere until a tracer provider is installed. Every control plane process (web,
worker, beat, management commands) installs one here when it starts (the app's
``ready``), if ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``..._TRACES_ENDPOINT``) is set:
spans are batched and sent with OTLP over HTTP (protobuf). The exporter and the batch
read the standard variables (``OTEL_EXPORTER_OTLP_HEADERS``, ``OTEL_BSP_*``,
``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``...). Without the variable, or with
``OTEL_SDK_DISABLED=true``, nothing is installed and the kernel's spans cost one check.
"""

from __future__ import annotations

import logging
import os
import socket
import threading

log = logging.getLogger(__name__)
SERVICE = "durable-controlplane"
_lock = threading.Lock()
_installed = False


def wanted(environ: dict[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return bool(env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
                or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def setup() -> bool:
    """Install the SDK's tracer provider with the OTLP exporter, once per process, if
    the environment asks for it; whether spans are exported."""
    global _installed
    if not wanted():
        return False
    with _lock:
        if _installed:
            return True
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import SERVICE_INSTANCE_ID, SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        attributes = {SERVICE_INSTANCE_ID: f"{socket.gethostname()}:{os.getpid()}"}
        if not os.environ.get("OTEL_SERVICE_NAME") and "service.name=" not in \
                os.environ.get("OTEL_RESOURCE_ATTRIBUTES", ""):
            attributes[SERVICE_NAME] = SERVICE
        provider = TracerProvider(resource=Resource.create(attributes))
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        trace.set_tracer_provider(provider)
        _installed = True
    log.info("exporting traces with OTLP to %s",
             os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
             or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))
    return True
