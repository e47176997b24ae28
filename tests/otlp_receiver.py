"""A stand-in for an OpenTelemetry collector's OTLP/HTTP traces endpoint, on loopback.

Worker processes export their spans with the SDK's OTLP exporter
(``OTEL_EXPORTER_OTLP_ENDPOINT`` pointed here), exactly as they would to a real
collector; the receiver decodes each ``ExportTraceServiceRequest`` (protobuf, with the
``opentelemetry-proto`` classes the exporter itself uses) into :class:`Received` spans
the test can read. It runs in the test process.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


@dataclass(frozen=True)
class Received:
    """One span as a collector sees it (ids as hex, as :mod:`kernel.tracing` gives them)."""

    name: str
    trace_id: str
    span_id: str
    parent_id: str | None
    attributes: dict[str, Any]
    resource: dict[str, Any]
    failed: bool


def value(any_value: AnyValue) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [value(v) for v in any_value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: value(kv.value) for kv in any_value.kvlist_value.values}
    return getattr(any_value, kind) if kind else None


def decode(body: bytes) -> list[Received]:
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    found = []
    for resource_spans in request.resource_spans:
        resource = {kv.key: value(kv.value) for kv in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                found.append(Received(
                    name=span.name,
                    trace_id=span.trace_id.hex(),
                    span_id=span.span_id.hex(),
                    parent_id=span.parent_span_id.hex() or None,
                    attributes={kv.key: value(kv.value) for kv in span.attributes},
                    resource=resource,
                    failed=span.status.code == span.status.STATUS_CODE_ERROR,
                ))
    return found


@dataclass
class Receiver:
    url: str = ""
    spans: list[Received] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, spans: list[Received]) -> None:
        with self._lock:
            self.spans.extend(spans)

    def received(self) -> list[Received]:
        with self._lock:
            return list(self.spans)


@contextmanager
def otlp_receiver() -> Iterator[Receiver]:
    """Serve ``POST /v1/traces`` on a free loopback port; ``.url`` is the endpoint to
    give ``OTEL_EXPORTER_OTLP_ENDPOINT`` (the exporter adds ``/v1/traces``)."""
    receiver = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path != "/v1/traces":
                self.send_response(404)
                self.end_headers()
                return
            receiver.add(decode(body))
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    receiver.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        yield receiver
    finally:
        httpd.shutdown()
        httpd.server_close()
