"""Logs that say what happened and stay quiet otherwise; JSON on request.

Every process (web, worker, beat, management commands) logs through the root logger to
stderr with :func:`config` (Django's ``LOGGING``; Celery's ``setup_logging`` signal
applies the same with the level given by ``-l``):

- ``LOG_LEVEL`` (default ``INFO``) and ``LOG_FORMAT``: ``text`` (default) or ``json``
  (one object per line: ``time``, ``level``, ``logger``, ``message``, ``process``, and
  the record's extra fields such as ``session``, ``seq``, ``actor``, ``tasks``).
- What happened is logged at INFO: each commit, one line naming its actor and the tasks
  it moved (batches planned, phases committed, recoveries, operator actions;
  :func:`log_commit`), a draining worker's hand-overs, sweeps that delivered something.
- A line logged inside a span names its trace: ``trace=<id>`` in text, ``trace_id`` in
  JSON (:class:`TraceIds`; only where traces are on, ``controlplane.process.telemetry``).
- Routine is DEBUG: Celery's lines for each once-a-second sweep (beat "Sending due
  task sweep", the worker's "received" and "succeeded" for it) are demoted by
  :class:`Routine`, so an idle worker and beat write nothing per sweep. ``-l debug``
  (or ``LOG_LEVEL=DEBUG``) shows them again.
"""

from __future__ import annotations

import json
import logging
import os
from datetime import UTC, datetime
from typing import Any

from kernel import tracing
from kernel.records import WriteSet

ROUTINE_TASKS = ("controlplane.sweep",)
"""Celery tasks whose per-run lines are routine (they run whether or not anything happens)."""

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName",
                                                    "trace"}
TEXT_FORMAT = "%(asctime)s %(levelname)s %(processName)s %(name)s%(trace)s: %(message)s"

commits = logging.getLogger("controlplane.commits")


class Routine(logging.Filter):
    """Demote Celery's per-sweep lines to DEBUG, and drop them unless DEBUG is on."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO or not record.name.startswith("celery"):
            return True
        message = record.getMessage()
        if not any(name in message for name in ROUTINE_TASKS):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger().isEnabledFor(logging.DEBUG)


class TraceIds(logging.Filter):
    """Name the trace a line was logged in: ``trace`` (`` trace=<id>`` or empty, for the
    text format) and, in a span, ``trace_id`` (a field of the JSON format)."""

    def filter(self, record: logging.LogRecord) -> bool:
        found = tracing.current_trace_id()
        record.trace = f" trace={found}" if found else ""
        if found:
            record.trace_id = found
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line, extra fields included (values that are not JSON as text)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "process": record.process,
        }
        out.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def config(level: str | None = None, fmt: str | None = None) -> dict[str, Any]:
    """A ``logging.config.dictConfig`` dict: the root logger to stderr, routine demoted."""
    fmt = (fmt or os.environ.get("LOG_FORMAT") or "text").lower()
    if fmt not in ("text", "json"):
        raise ValueError(f"LOG_FORMAT must be text or json, got {fmt!r}")
    level = (level or os.environ.get("LOG_LEVEL") or "INFO").upper()
    formatter: dict[str, Any] = (
        {"()": JsonFormatter} if fmt == "json" else {"format": TEXT_FORMAT}
    )
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"routine": {"()": Routine}, "trace": {"()": TraceIds}},
        "formatters": {"main": formatter},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "main",
                "filters": ["routine", "trace"],
            },
        },
        "root": {"handlers": ["stderr"], "level": level},
        # Django's own loggers propagate to the root handler; no duplicate console one.
        "loggers": {"django": {"handlers": [], "level": level, "propagate": True}},
    }


def apply(settings: dict[str, Any]) -> None:
    """Django's ``LOGGING_CONFIG`` (and Celery's set-up): ``dictConfig``, and Python
    warnings through the same handler (in JSON too) instead of bare stderr lines."""
    import logging.config

    logging.config.dictConfig(settings)
    logging.captureWarnings(True)


def log_commit(write_set: WriteSet) -> None:
    """An after-commit listener: one INFO line per commit, what moved and who moved it."""
    if not commits.isEnabledFor(logging.INFO):
        return
    commit = write_set.commit
    tasks = [
        {k: item[k] for k in ("id", "kind", "status", "phase", "outcome") if k in item}
        for item in commit.summary
        if item.get("type") == "task"
    ]
    moved = "; ".join(
        f"{t.get('kind')} {t['id']} {t.get('status')}/{t.get('phase')}"
        + (f" {t['outcome']}" if t.get("outcome") else "")
        for t in tasks[:5]
    ) + (f"; and {len(tasks) - 5} more tasks" if len(tasks) > 5 else "")
    commits.info(
        "commit %s#%d by %s: %s", commit.session_id, commit.seq, commit.actor,
        moved or "no task moved",
        extra={"session": commit.session_id, "seq": commit.seq, "actor": commit.actor,
               "tasks": tasks[:20]},
    )
