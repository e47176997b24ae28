"""Logs say what happened and stay quiet otherwise (issue 14, point 6): the routine
sweep lines are DEBUG, every line is one JSON object with LOG_FORMAT=json, a commit is
one line naming its actor and the tasks it moved. (tests/e2e/test_processes.py checks the
same on real worker, beat and web processes.)"""

from __future__ import annotations

import io
import json
import logging
import logging.config
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from controlplane.process import logs
from kernel.records import Commit, WriteSet


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    """The root logger configured by ``logs.config('INFO', 'json')``, writing to a buffer."""
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    stream = io.StringIO()
    config = logs.config(level="INFO", fmt="json")
    config["handlers"]["stderr"]["stream"] = stream
    logging.config.dictConfig(config)
    try:
        yield stream
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])


def lines(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_the_sweeps_routine_lines_are_dropped_at_info(captured: io.StringIO) -> None:
    logging.getLogger("celery.beat").info(
        "Scheduler: Sending due task %s (%s)", "sweep", "controlplane.sweep")
    logging.getLogger("celery.app.trace").info(
        "Task %(name)s[%(id)s] succeeded in %(runtime)ss: %(return_value)s",
        {"name": "controlplane.sweep", "id": "x", "runtime": 0.01, "return_value": "{}"})
    logging.getLogger("celery.app.trace").info(
        "Task %(name)s[%(id)s] succeeded in %(runtime)ss: %(return_value)s",
        {"name": "controlplane.advance", "id": "y", "runtime": 0.01, "return_value": True})
    assert [line["message"] for line in lines(captured)] == [
        "Task controlplane.advance[y] succeeded in 0.01s: True"]


def test_at_debug_the_routine_lines_are_kept_as_debug(captured: io.StringIO) -> None:
    logging.getLogger().setLevel(logging.DEBUG)
    logging.getLogger("celery.beat").info(
        "Scheduler: Sending due task %s (%s)", "sweep", "controlplane.sweep")
    (line,) = lines(captured)
    assert line["level"] == "DEBUG" and "controlplane.sweep" in line["message"]


def test_a_commit_is_one_line_with_its_actor_and_tasks(captured: io.StringIO) -> None:
    summary = [{"type": "task", "id": "task_1", "kind": "send-notice", "status": "terminal",
                "phase": "confirm", "outcome": "succeeded"}, {"type": "document", "id": "d"}]
    commit = Commit("sess_1", 7, datetime.now(UTC), "user:olga", summary, id=70)
    logs.log_commit(WriteSet(commit, [], [], [], [], [], [], [], [], []))
    (line,) = lines(captured)
    assert line["logger"] == "controlplane.commits"
    assert line["message"] == (
        "commit sess_1#7 by user:olga: send-notice task_1 terminal/confirm succeeded")
    assert (line["session"], line["seq"], line["actor"]) == ("sess_1", 7, "user:olga")
    assert line["tasks"] == [{k: v for k, v in summary[0].items() if k != "type"}]


def test_json_lines_carry_exceptions_and_text_is_the_default() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed %s", ("it",),
                                   exc_info=__import__("sys").exc_info())
    out = json.loads(logs.JsonFormatter().format(record))
    assert out["message"] == "failed it" and "ValueError: boom" in out["exception"]
    assert logs.config(fmt=None)["formatters"]["main"] == {"format": logs.TEXT_FORMAT}
    with pytest.raises(ValueError, match="LOG_FORMAT"):
        logs.config(fmt="xml")


def test_a_line_logged_in_a_span_names_its_trace() -> None:
    from opentelemetry.sdk.trace import TracerProvider

    from kernel import tracing

    for fmt in ("json", "text"):
        root = logging.getLogger()
        saved = (root.handlers[:], root.level)
        stream = io.StringIO()
        config = logs.config(level="INFO", fmt=fmt)
        config["handlers"]["stderr"]["stream"] = stream
        logging.config.dictConfig(config)
        provider = TracerProvider()
        tracing.use(provider)
        try:
            logging.getLogger("controlplane.test").info("outside")
            with tracing.span("phase x.y"):
                trace_id = tracing.current_trace_id()
                logging.getLogger("controlplane.test").info("inside")
        finally:
            tracing.use(None)
            root.handlers[:] = saved[0]
            root.setLevel(saved[1])
        assert trace_id is not None and len(trace_id) == 32
        outside, inside = stream.getvalue().splitlines()
        if fmt == "json":
            assert "trace_id" not in json.loads(outside) and "trace" not in json.loads(outside)
            assert json.loads(inside)["trace_id"] == trace_id
        else:
            assert "trace=" not in outside and "controlplane.test: outside" in outside
            assert f"controlplane.test trace={trace_id}: inside" in inside
