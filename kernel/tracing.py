"""OpenTelemetry spans for the kernel's units of work, through the API only.

Spans: a submission (``submit``), each phase a worker runs (``phase <kind>.<phase>``,
with the commit that ends it inside), each commit (``commit``), each model request
(``chat <model>``, GenAI semantic conventions) and each tool call (``execute_tool
<name>``). The trace context travels with the task: a task created inside a span keeps
that span's context (W3C ``traceparent``) in :attr:`Task.trace`, and each of its phases,
on whichever worker, is a child of it, so a turn's trace shows the tool tasks other
workers ran.

This is the only kernel module that imports ``opentelemetry``, and only its API: the
process that wants traces installs an SDK tracer provider (the control plane does, when
``OTEL_EXPORTER_OTLP_ENDPOINT`` is set). Until one is installed, or without the package,
every function here returns at once (:func:`active`) and no span object is made.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import Any

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.trace import ProxyTracerProvider, SpanKind, Status, StatusCode
except ImportError:  # an optional dependency: without it, no spans
    trace = None  # type: ignore[assignment]

JSON = Any
Carrier = dict[str, str]
SCOPE = "kernel"
_provider: Any = None
"""A tracer provider of our own (tests); None: the global one."""
_UNKNOWN = object()


def use(provider: Any) -> None:
    """Send the kernel's spans to ``provider`` instead of the global one (None: back to
    the global one). For tests, which cannot replace a global provider once set."""
    global _provider
    _provider = provider


_global = False
"""Whether a global tracer provider has been seen installed (it cannot be removed)."""


def active() -> bool:
    """Whether spans are recorded anywhere: a tracer provider has been installed.

    Asked before every commit and phase, so it is one attribute read while tracing is
    off: the API's own ``get_tracer_provider()`` reads the environment on each call."""
    global _global
    if _provider is not None or _global:
        return True
    if trace is None:
        return False
    installed = getattr(trace, "_TRACER_PROVIDER", _UNKNOWN)
    if installed is _UNKNOWN:  # an API that keeps it elsewhere: ask it
        installed = not isinstance(trace.get_tracer_provider(), ProxyTracerProvider) or None
    _global = installed is not None
    return _global


def _tracer() -> Any:
    return trace.get_tracer(SCOPE, tracer_provider=_provider)


def carrier() -> Carrier | None:
    """The current span's context as W3C headers (``traceparent``), to keep with a task
    created now; None when no span is being recorded."""
    if not active():
        return None
    span = trace.get_current_span()
    if not span.get_span_context().is_valid:
        return None
    found: Carrier = {}
    propagate.inject(found)
    return found or None


_TRACE_ID = re.compile(r"[0-9a-f]{32}")
"""A W3C trace id: 32 lowercase hex digits (all zeros is invalid, checked apart)."""


def trace_id(kept: Any) -> str | None:
    """The trace id (32 lowercase hex digits, not all zeros) of a kept context (a task's
    :attr:`trace`), for logs, pages and the trace link built from it; None when there is
    none or it is not a valid W3C trace id (a context kept from another writer may hold
    anything, and the id is put into a URL)."""
    if not isinstance(kept, Mapping):
        return None
    parts = str(kept.get("traceparent", "")).split("-")
    if len(parts) == 4 and _TRACE_ID.fullmatch(parts[1]) and parts[1] != "0" * 32:
        return parts[1]
    return None


def current_trace_id() -> str | None:
    """The trace id of the span being recorded in this thread, if any (for log lines)."""
    if not active():
        return None
    context = trace.get_current_span().get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else None


def _clean(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """Attribute values OpenTelemetry takes: None left out, others as text unless they
    are a number, a flag, text, or a list of one of those."""
    out: dict[str, Any] = {}
    for key, value in attributes.items():
        if value is None:
            continue
        if isinstance(value, bool | int | float | str):
            out[key] = value
        elif isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
            out[key] = list(value)
        else:
            out[key] = str(value)
    return out


class Recorder:
    """The open span, for attributes known only once the work is done (no-op when
    spans are off: then it is also the context manager :func:`span` returns)."""

    def __init__(self, span: Any = None) -> None:
        self.span = span

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def set(self, attributes: Mapping[str, Any]) -> None:
        if self.span is not None:
            self.span.set_attributes(_clean(attributes))

    def error(self, kind: str, description: str | None = None) -> None:
        """Mark the span failed (an error that did not raise out of it)."""
        if self.span is not None:
            self.span.set_attribute("error.type", kind)
            self.span.set_status(Status(StatusCode.ERROR, description))


OFF = Recorder()


def span(
    name: str,
    attributes: Mapping[str, Any] | None = None,
    *,
    parent: Any = None,
    client: bool = False,
) -> AbstractContextManager[Recorder]:
    """A span around the block, child of the current span, or of ``parent`` (a kept
    context: a task's :attr:`trace`) when given. ``client``: a call out to another
    service (a model server). An exception leaving the block marks it failed. While
    spans are off, the shared no-op :data:`OFF`."""
    if not active():
        return OFF
    return _recorded(name, attributes, parent, client)


@contextmanager
def _recorded(
    name: str, attributes: Mapping[str, Any] | None, parent: Any, client: bool
) -> Iterator[Recorder]:
    context = None
    if isinstance(parent, Mapping) and parent:
        context = propagate.extract(dict(parent), context=otel_context.Context())
    kind = SpanKind.CLIENT if client else SpanKind.INTERNAL
    with _tracer().start_as_current_span(
        name, context=context, kind=kind, attributes=_clean(attributes or {})
    ) as opened:
        try:
            yield Recorder(opened)
        except BaseException as exc:  # recorded (and the span failed) by the SDK
            opened.set_attribute("error.type", type(exc).__qualname__)
            raise
