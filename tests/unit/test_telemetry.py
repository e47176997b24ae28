"""Traces are exported only when the environment asks (``OTEL_EXPORTER_OTLP_ENDPOINT``),
by the SDK the control plane installs when a process starts; otherwise the kernel's
spans are off."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from controlplane.process import telemetry

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
import django, os
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
django.setup()  # the app's ready() sets up telemetry, as in every process
from opentelemetry import trace
from kernel import tracing
provider = trace.get_tracer_provider()
processors = getattr(getattr(provider, "_active_span_processor", None),
                     "_span_processors", ())
print(tracing.active(), type(provider).__name__,
      [type(getattr(p, "span_exporter", None)).__name__ for p in processors],
      provider.resource.attributes.get("service.name") if hasattr(provider, "resource")
      else None)
"""


def test_wanted_only_with_an_endpoint_and_not_disabled() -> None:
    assert not telemetry.wanted({})
    assert telemetry.wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert telemetry.wanted({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"})
    assert not telemetry.wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318",
                                 "OTEL_SDK_DISABLED": "true"})


def probe(**env: str) -> str:
    import os

    base = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    ran = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, env={**base, "DJANGO_DEBUG": "1", **env})
    assert ran.returncode == 0, ran.stderr
    return ran.stdout.strip()


def test_a_process_exports_with_otlp_when_an_endpoint_is_set_and_not_otherwise() -> None:
    assert probe() == "False ProxyTracerProvider [] None"
    assert probe(OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9") == (
        "True TracerProvider ['OTLPSpanExporter'] durable-controlplane")
    assert probe(OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9",
                 OTEL_SERVICE_NAME="workers-eu") == (
        "True TracerProvider ['OTLPSpanExporter'] workers-eu")
