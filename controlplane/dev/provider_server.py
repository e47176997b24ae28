"""A local HTTP email provider with idempotency keys, a request log and fault knobs.

It stands in for a real email API in the demo and in tests. It runs as its own
process so that what it accepted survives a worker being SIGKILLed mid-send: chaos
tests then ask it how many messages each recipient got and which requests arrived.
The HTTP contract is documented in docs/email-provider.md; a real provider that
honours it can be plugged in by URL.

Run it with::

    python -m controlplane.dev.provider_server --host 127.0.0.1 --port 0 \
        [--state-file PATH] [--latency-ms 50] [--error-rate 0.1] [--seed 1] \
        [--drop-after-accept '{"nth": 4}'] [--stall '{"to": "d@example.com", "ms": 5000}']

It prints ``listening on http://HOST:PORT`` once bound, so port 0 can be used.

This module uses the standard library only and imports nothing from the project,
so it can also be run as a plain script (which is what ``processes.start_provider`` does).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import socket
import sys
import threading
import time
import uuid
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn
from urllib.parse import unquote, urlsplit

IDEMPOTENCY_HEADER = "Idempotency-Key"
DEADLINE_HEADER = "Request-Deadline"  # Unix seconds: never accept the message later
MAX_IDEMPOTENCY_KEY_LENGTH = 255
MESSAGE_FIELDS = ("to", "subject", "body", "metadata")
STALL_WHEN = ("before_store", "after_store")
STATE_FILE_VERSION = 2  # 1: one JSON document, rewritten whole on every change


def _now() -> str:
    return datetime.now(UTC).isoformat()


class InvalidInput(Exception):
    """A request value outside the contract; answered 422 naming the offending field."""

    def __init__(self, field: str, error: str) -> None:
        super().__init__(f"{field}: {error}")
        self.field = field
        self.error = error


# --- fault knobs -------------------------------------------------------------------


@dataclass(frozen=True)
class SendMatch:
    """Which sends a fault applies to. Every criterion given must hold.

    ``nth`` counts POST /messages requests that passed validation since the faults
    were last set (1-based), so a test can target "the 4th send" without knowing
    the keys in advance. ``times`` disarms the fault after that many firings, so a
    retry of the same send is answered normally.
    """

    to: str | None = None
    nth: int | None = None
    times: int | None = None

    def matches(self, to: str, send_no: int, fired: int) -> bool:
        return (
            (self.to is None or self.to == to)
            and (self.nth is None or self.nth == send_no)
            and (self.times is None or fired < self.times)
        )

    def to_json(self) -> dict[str, Any]:
        return {"to": self.to, "nth": self.nth, "times": self.times}


@dataclass(frozen=True)
class Stall:
    """Delay matching sends by ``ms``, either before the message is stored or after."""

    match: SendMatch
    ms: int
    when: str

    def to_json(self) -> dict[str, Any]:
        return {**self.match.to_json(), "ms": self.ms, "when": self.when}


@dataclass(frozen=True)
class Faults:
    """The fault knobs, as set by CLI flags at start-up or by PUT /faults."""

    latency_ms: int = 0
    error_rate: float = 0.0
    seed: int | None = None
    drop_after_accept: SendMatch | None = None
    stall: Stall | None = None

    @classmethod
    def from_json(cls, data: object) -> Faults:
        """Validate a PUT /faults body; knobs left out take their no-fault default."""
        if not isinstance(data, dict):
            raise InvalidInput("$", "must be a JSON object")
        unknown = sorted(set(data) - {"latency_ms", "error_rate", "seed", "drop_after_accept",
                                      "stall"})
        if unknown:
            raise InvalidInput(unknown[0], "unknown fault knob")
        error_rate = data.get("error_rate", 0.0)
        if isinstance(error_rate, bool) or not isinstance(error_rate, int | float) or not (
            0.0 <= error_rate <= 1.0
        ):
            raise InvalidInput("error_rate", "must be a number between 0 and 1")
        return cls(
            latency_ms=_optional_int(data, "latency_ms", "latency_ms", minimum=0) or 0,
            error_rate=float(error_rate),
            seed=_optional_int(data, "seed", "seed", minimum=None),
            drop_after_accept=_send_match(data.get("drop_after_accept"), "drop_after_accept"),
            stall=_stall(data.get("stall")),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "latency_ms": self.latency_ms,
            "error_rate": self.error_rate,
            "seed": self.seed,
            "drop_after_accept": self.drop_after_accept and self.drop_after_accept.to_json(),
            "stall": self.stall and self.stall.to_json(),
        }


def _optional_int(
    data: dict[str, Any], key: str, field: str, *, minimum: int | None
) -> int | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(field, "must be an integer")
    if minimum is not None and value < minimum:
        raise InvalidInput(field, f"must be >= {minimum}")
    return value


def _send_match(data: object, name: str, extra: tuple[str, ...] = ()) -> SendMatch | None:
    if data is None:
        return None
    if not isinstance(data, dict):
        raise InvalidInput(name, "must be an object or null")
    unknown = sorted(set(data) - {"to", "nth", "times", *extra})
    if unknown:
        raise InvalidInput(f"{name}.{unknown[0]}", "unknown field")
    to = data.get("to")
    if to is not None and not isinstance(to, str):
        raise InvalidInput(f"{name}.to", "must be a string")
    return SendMatch(
        to=to,
        nth=_optional_int(data, "nth", f"{name}.nth", minimum=1),
        times=_optional_int(data, "times", f"{name}.times", minimum=1),
    )


def _stall(data: object) -> Stall | None:
    match = _send_match(data, "stall", extra=("ms", "when"))
    if match is None:
        return None
    assert isinstance(data, dict)  # _send_match returned a match, so data is an object
    ms = _optional_int(data, "ms", "stall.ms", minimum=0)
    if ms is None:
        raise InvalidInput("stall.ms", "is required")
    when = data.get("when", "after_store")
    if when not in STALL_WHEN:
        raise InvalidInput("stall.when", f"must be one of {', '.join(STALL_WHEN)}")
    return Stall(match=match, ms=ms, when=when)


# --- messages ----------------------------------------------------------------------


def parse_message(data: object) -> dict[str, Any]:
    """Validate a POST /messages body, returning the message with defaults filled in.

    Unknown fields are refused rather than ignored, so that a client relying on a
    field this provider does not implement finds out at once.
    """
    if not isinstance(data, dict):
        raise InvalidInput("$", "body must be a JSON object")
    unknown = sorted(set(data) - set(MESSAGE_FIELDS))
    if unknown:
        raise InvalidInput(unknown[0], "unknown field")
    to = data.get("to")
    if not isinstance(to, str) or "@" not in to:
        raise InvalidInput("to", "must be an email address")
    for field in ("subject", "body"):
        if not isinstance(data.get(field), str):
            raise InvalidInput(field, "must be a string")
    metadata = data.get("metadata", {})
    if not isinstance(metadata, dict):
        raise InvalidInput("metadata", "must be an object")
    return {"to": to, "subject": data["subject"], "body": data["body"], "metadata": metadata}


def receipt_of(record: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": record["id"],
        "idempotency_key": record["idempotency_key"],
        "status": "accepted",
        "accepted_at": record["accepted_at"],
        "to": record["to"],
    }


@dataclass(frozen=True)
class SendPlan:
    """What the faults decided for one send before it reached the store."""

    send_no: int
    fail: bool
    stall: Stall | None


@dataclass(frozen=True)
class StoreResult:
    outcome: str  # accepted | duplicate | conflict | dropped | expired
    record: dict[str, Any]
    created: bool
    conflicting_fields: tuple[str, ...] = ()


# --- state -------------------------------------------------------------------------


class ProviderState:
    """Messages, request log and faults, shared by all handler threads.

    Every change happens under one lock and, with a state file, is appended to it
    before the request is answered, so a provider restarted after a SIGKILL holds
    everything it ever acknowledged. The file is a journal (JSON lines: a header, then
    one line per stored message or logged request), so a request costs one short
    append however long the provider has run, not a rewrite of the whole state.
    """

    def __init__(self, faults: Faults, state_file: Path | None = None) -> None:
        self._lock = threading.Lock()
        self._state_file = state_file
        self._messages: dict[str, dict[str, Any]] = {}
        self._requests: list[dict[str, Any]] = []
        self._set_faults_locked(faults)
        self._stalls_end = threading.Event()  # set by end_stalls(), then replaced
        self._stalled = 0  # sends inside a stall now
        if state_file is not None:
            if state_file.exists():
                self._replay(state_file)
            self._rewrite_locked()  # a clean journal: no torn line, the current version

    def _replay(self, state_file: Path) -> None:
        lines = state_file.read_text().split("\n")
        if lines == [""]:
            return  # an empty file: nothing was ever saved
        header = json.loads(lines[0])
        if header.get("version") == 1:  # one document, on one line
            self._messages = {m["idempotency_key"]: m for m in header["messages"]}
            self._requests = header["requests"]
            return
        if header != {"version": STATE_FILE_VERSION}:
            raise ValueError(f"{state_file}: unsupported state file version")
        # The last line may be torn by a SIGKILL in mid-append: that change was never
        # acknowledged, so it is dropped. A bad line anywhere else is corruption.
        complete = lines[1:-1]
        for number, line in enumerate(complete, start=2):
            try:
                change = json.loads(line)
            except ValueError as exc:
                raise ValueError(f"{state_file}:{number}: unreadable journal line") from exc
            if "message" in change:
                self._messages[change["message"]["idempotency_key"]] = change["message"]
            else:
                self._requests.append(change["request"])

    def _set_faults_locked(self, faults: Faults) -> None:
        self._faults = faults
        self._rng = random.Random(faults.seed)
        self._sends_since_set = 0
        self._fired = {"drop_after_accept": 0, "stall": 0}

    def faults(self) -> Faults:
        with self._lock:
            return self._faults

    def faults_json(self) -> dict[str, Any]:
        with self._lock:
            return {
                **self._faults.to_json(),
                "sends_since_set": self._sends_since_set,
                "fired": dict(self._fired),
            }

    def set_faults(self, faults: Faults) -> None:
        with self._lock:
            self._set_faults_locked(faults)

    def reset(self) -> None:
        with self._lock:
            self._messages.clear()
            self._requests.clear()
            self._set_faults_locked(Faults())
            self._rewrite_locked()

    def messages(self) -> list[dict[str, Any]]:
        with self._lock:
            return [{**receipt_of(m), **_message_fields(m)} for m in self._messages.values()]

    def requests(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._requests)  # entries are never changed once logged

    def roll_error(self) -> bool:
        """Decide whether the error_rate fault fails this request."""
        with self._lock:
            return self._rng.random() < self._faults.error_rate

    def begin_send(self, to: str) -> SendPlan:
        """Number a validated send and decide the faults that act before storing.

        A send failed by error_rate never reaches the store, so it is not stalled.
        """
        with self._lock:
            self._sends_since_set += 1
            send_no = self._sends_since_set
            if self._rng.random() < self._faults.error_rate:
                return SendPlan(send_no=send_no, fail=True, stall=None)
            stall = self._faults.stall
            if stall is None or not stall.match.matches(to, send_no, self._fired["stall"]):
                return SendPlan(send_no=send_no, fail=False, stall=None)
            self._fired["stall"] += 1
            return SendPlan(send_no=send_no, fail=False, stall=stall)

    def stall(self, seconds: float) -> None:
        """Sleep a send's stall: ``seconds``, or until :meth:`end_stalls` ends it."""
        with self._lock:
            ends = self._stalls_end
            self._stalled += 1
        try:
            ends.wait(seconds)
        finally:
            with self._lock:
                self._stalled -= 1

    def end_stalls(self) -> int:
        """End the stalls under way now (not later ones); how many there were."""
        with self._lock:
            ended, self._stalls_end = self._stalls_end, threading.Event()
            count = self._stalled
        ended.set()
        return count

    def store(
        self,
        key: str,
        message: dict[str, Any],
        send_no: int,
        log_entry: dict[str, Any],
        deadline: float | None = None,
    ) -> StoreResult:
        """Store the message unless its key is known, and log the request, atomically.

        The check and the insert share the lock, which is what makes concurrent
        sends with one key produce exactly one message. A new message whose
        ``deadline`` has passed is not stored (outcome ``expired``): its sender has
        stopped waiting and may already have concluded that it was never sent.
        """
        with self._lock:
            existing = self._messages.get(key)
            if existing is None and deadline is not None and time.time() > deadline:
                self._log_locked({**log_entry, "outcome": "expired", "status": 503,
                                  "message_id": None, "created": False})
                return StoreResult(outcome="expired", record={}, created=False)
            if existing is None:
                record = {
                    "id": f"msg_{uuid.uuid4().hex}",
                    "idempotency_key": key,
                    "accepted_at": _now(),
                    **message,
                }
                self._messages[key] = record
                self._append_locked({"message": record})
                result = StoreResult(outcome="accepted", record=record, created=True)
            else:
                conflicts = tuple(
                    f for f in MESSAGE_FIELDS if existing[f] != message[f]
                )
                outcome = "conflict" if conflicts else "duplicate"
                result = StoreResult(outcome=outcome, record=existing, created=False,
                                     conflicting_fields=conflicts)
            drop = self._faults.drop_after_accept
            if (
                result.outcome != "conflict"
                and drop is not None
                and drop.matches(message["to"], send_no, self._fired["drop_after_accept"])
            ):
                self._fired["drop_after_accept"] += 1
                result = replace(result, outcome="dropped")
                log_entry = {**log_entry, "faults": [*log_entry["faults"], "drop_after_accept"]}
            self._log_locked({
                **log_entry,
                "outcome": result.outcome,
                "status": _SEND_STATUS[result.outcome],
                "message_id": result.record["id"] if result.outcome != "conflict" else None,
                "created": result.created,
            })
            return result

    def lookup(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            record = self._messages.get(key)
            return None if record is None else receipt_of(record)

    def log(self, entry: dict[str, Any]) -> None:
        with self._lock:
            self._log_locked(entry)

    def _log_locked(self, entry: dict[str, Any]) -> None:
        request = {"seq": len(self._requests) + 1, **entry}
        self._requests.append(request)
        self._append_locked({"request": request})

    def _append_locked(self, change: dict[str, Any]) -> None:
        # No fsync: the goal is surviving a killed process, not a lost machine; once
        # write() returns, the line is the kernel's to keep.
        if self._state_file is None:
            return
        with self._state_file.open("a") as journal:
            journal.write(json.dumps(change) + "\n")

    def _rewrite_locked(self) -> None:
        """Write the whole state as a fresh journal (write-then-rename keeps it whole)."""
        if self._state_file is None:
            return
        tmp = self._state_file.with_name(self._state_file.name + ".tmp")
        lines: list[dict[str, Any]] = [{"version": STATE_FILE_VERSION}]
        lines += [{"message": m} for m in self._messages.values()]
        lines += [{"request": r} for r in self._requests]
        tmp.write_text("".join(json.dumps(line) + "\n" for line in lines))
        os.replace(tmp, self._state_file)


_SEND_STATUS: dict[str, int | None] = {
    "accepted": 202,
    "duplicate": 200,
    "conflict": 409,
    "dropped": None,  # the connection is closed without an answer
    "expired": 503,  # its Request-Deadline passed before it could be stored
}


def _message_fields(record: dict[str, Any]) -> dict[str, Any]:
    return {f: record[f] for f in MESSAGE_FIELDS}


# --- HTTP --------------------------------------------------------------------------


class ProviderHTTPServer(ThreadingHTTPServer):
    """One thread per connection, so a stalled send does not hold up the others."""

    # Twenty clients connecting at once must not overflow the accept backlog.
    request_queue_size = 128
    # A stalled handler thread must not delay shutdown.
    block_on_close = False

    def __init__(self, address: tuple[str, int], state: ProviderState) -> None:
        super().__init__(address, ProviderHandler)
        self.state = state


class ProviderHandler(BaseHTTPRequestHandler):
    """Routes requests; the email API (sends, lookups) goes to the request log."""

    server: ProviderHTTPServer
    server_version = "LocalEmailProvider/1"

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_PUT(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        # The request log (GET /requests) is the record; keep stderr for errors.
        pass

    @property
    def state(self) -> ProviderState:
        return self.server.state

    def _dispatch(self) -> None:
        # Stamped on arrival, before any injected latency: "when did the request reach
        # the provider" is what tests compare with commit times.
        self.received_at = _now()
        latency_ms = self.state.faults().latency_ms
        if latency_ms:
            time.sleep(latency_ms / 1000)
        path = urlsplit(self.path).path
        method = self.command
        if path == "/messages":
            if method == "POST":
                return self._send()
            if method == "GET":
                return self._respond(HTTPStatus.OK, {"messages": self.state.messages()})
        elif path.startswith("/messages/"):
            if method == "GET":
                return self._lookup(unquote(path.removeprefix("/messages/")))
        elif path == "/requests":
            if method == "GET":
                return self._respond(HTTPStatus.OK, {"requests": self.state.requests()})
        elif path == "/faults":
            if method == "GET":
                return self._respond(HTTPStatus.OK, self.state.faults_json())
            if method == "PUT":
                return self._put_faults()
        elif path == "/stalls":
            if method == "DELETE":
                return self._respond(HTTPStatus.OK, {"ended": self.state.end_stalls()})
        elif path == "/state":
            if method == "DELETE":
                self.state.reset()
                return self._respond(HTTPStatus.OK, {"status": "reset"})
        elif path == "/healthz":
            if method == "GET":
                return self._respond(HTTPStatus.OK, {"status": "ok"})
        else:
            return self._refuse_logged(HTTPStatus.NOT_FOUND, "no_route", "no such route")
        return self._refuse_logged(
            HTTPStatus.METHOD_NOT_ALLOWED, "method_not_allowed", "method not allowed"
        )

    def _send(self) -> None:
        entry = self._log_base(key=self.headers.get(IDEMPOTENCY_HEADER, "").strip() or None)
        try:
            # Read the body before refusing anything: closing a socket with unread
            # input makes the kernel reset the connection, and the client would see
            # a lost connection instead of our 422.
            data = self._read_json()
            key = self._idempotency_key()
            deadline = self._deadline()
            message = parse_message(data)
        except InvalidInput as exc:
            return self._refuse_invalid(entry, exc)
        except ValueError as exc:
            return self._refuse_bad_json(entry, str(exc))
        entry["to"] = message["to"]

        plan = self.state.begin_send(message["to"])
        entry["send_no"] = plan.send_no
        if plan.fail:
            self.state.log({**entry, "outcome": "error", "status": 503, "faults": ["error_rate"]})
            return self._respond(HTTPStatus.SERVICE_UNAVAILABLE,
                                 {"error": "injected fault: provider unavailable"})
        if plan.stall is not None:
            entry["faults"] = ["stall"]
            if plan.stall.when == "before_store":
                self.state.stall(plan.stall.ms / 1000)
        result = self.state.store(key, message, plan.send_no, entry, deadline)
        if plan.stall is not None and plan.stall.when == "after_store":
            self.state.stall(plan.stall.ms / 1000)

        if result.outcome == "dropped":
            return self._drop_connection()
        if result.outcome == "expired":
            return self._respond(HTTPStatus.SERVICE_UNAVAILABLE, {
                "error": f"{DEADLINE_HEADER} passed before the message could be stored: "
                         "not accepted",
            })
        if result.outcome == "conflict":
            return self._respond(HTTPStatus.CONFLICT, {
                "error": "Idempotency-Key was already used for a different message",
                "field": IDEMPOTENCY_HEADER,
                "conflicting_fields": list(result.conflicting_fields),
            })
        status = HTTPStatus.ACCEPTED if result.created else HTTPStatus.OK
        self._respond(status, receipt_of(result.record))

    def _lookup(self, key: str) -> None:
        entry = self._log_base(key=key)
        if self.state.roll_error():
            self.state.log({**entry, "outcome": "error", "status": 503, "faults": ["error_rate"]})
            return self._respond(HTTPStatus.SERVICE_UNAVAILABLE,
                                 {"error": "injected fault: provider unavailable"})
        receipt = self.state.lookup(key)
        if receipt is None:
            self.state.log({**entry, "outcome": "not_found", "status": 404})
            return self._respond(HTTPStatus.NOT_FOUND, {"status": "not_found"})
        self.state.log({**entry, "outcome": "found", "status": 200, "to": receipt["to"],
                        "message_id": receipt["id"]})
        self._respond(HTTPStatus.OK, receipt)

    def _put_faults(self) -> None:
        try:
            faults = Faults.from_json(self._read_json())
        except InvalidInput as exc:
            return self._respond(HTTPStatus.UNPROCESSABLE_ENTITY,
                                 {"error": exc.error, "field": exc.field})
        except ValueError as exc:
            return self._respond(HTTPStatus.BAD_REQUEST, {"error": str(exc)})
        self.state.set_faults(faults)
        self._respond(HTTPStatus.OK, self.state.faults_json())

    def _idempotency_key(self) -> str:
        key = self.headers.get(IDEMPOTENCY_HEADER, "").strip()
        if not key:
            raise InvalidInput(IDEMPOTENCY_HEADER, "header is required")
        if len(key) > MAX_IDEMPOTENCY_KEY_LENGTH:
            raise InvalidInput(IDEMPOTENCY_HEADER,
                               f"must be at most {MAX_IDEMPOTENCY_KEY_LENGTH} characters")
        return key

    def _deadline(self) -> float | None:
        raw = self.headers.get(DEADLINE_HEADER, "").strip()
        if not raw:
            return None
        try:
            return float(raw)
        except ValueError:
            raise InvalidInput(DEADLINE_HEADER, "must be a Unix time in seconds") from None

    def _read_json(self) -> object:
        """Read the whole request body and decode it; ValueError if it is not JSON."""
        length = self.headers.get("Content-Length") or "0"
        if not length.isdigit():
            raise ValueError(f"bad Content-Length: {length!r}")
        raw = self.rfile.read(int(length))
        try:
            return json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"request body is not valid JSON: {exc}") from exc

    def _log_base(self, key: str | None) -> dict[str, Any]:
        """A request log entry with every field present, filled in as the request goes."""
        return {
            "time": getattr(self, "received_at", None) or _now(),
            "method": self.command,
            "path": self.path,
            "idempotency_key": key,
            "to": None,
            "send_no": None,
            "outcome": None,
            "status": None,
            "message_id": None,
            "created": None,
            "faults": [],
            "error": None,
        }

    def _refuse_invalid(self, entry: dict[str, Any], exc: InvalidInput) -> None:
        self.state.log({**entry, "outcome": "invalid", "status": 422, "error": str(exc)})
        self._respond(HTTPStatus.UNPROCESSABLE_ENTITY, {"error": exc.error, "field": exc.field})

    def _refuse_bad_json(self, entry: dict[str, Any], error: str) -> None:
        self.state.log({**entry, "outcome": "invalid", "status": 400, "error": error})
        self._respond(HTTPStatus.BAD_REQUEST, {"error": error})

    def _refuse_logged(self, status: HTTPStatus, outcome: str, error: str) -> None:
        self.state.log({**self._log_base(key=None), "outcome": outcome, "status": int(status)})
        self._respond(status, {"error": error})

    def _respond(self, status: HTTPStatus, payload: dict[str, Any]) -> None:
        body = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            # The client gave up (e.g. timed out during a stall, or was killed). What
            # the provider did is already stored and logged; there is nobody to tell.
            self.close_connection = True

    def _drop_connection(self) -> None:
        """Close the connection without answering: the client cannot tell what happened."""
        self.close_connection = True
        # If the client is already gone, the effect on it is the same.
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)


# --- command line ------------------------------------------------------------------


def build_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Local HTTP email provider with idempotency keys and fault knobs.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8025, help="0 picks a free port")
    parser.add_argument("--state-file", type=Path,
                        help="persist messages and the request log here across restarts")
    faults = parser.add_argument_group(
        "fault knobs", "each takes the JSON value of the PUT /faults knob of the same name"
    )
    for knob in ("latency-ms", "error-rate", "seed", "drop-after-accept", "stall"):
        faults.add_argument(f"--{knob}", type=json.loads, metavar="JSON")
    return parser


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> NoReturn:
    sys.exit(0)


def main(argv: list[str] | None = None) -> None:
    parser = build_arg_parser()
    args = parser.parse_args(argv)
    knobs = {
        name: getattr(args, name)
        for name in ("latency_ms", "error_rate", "seed", "drop_after_accept", "stall")
        if getattr(args, name) is not None
    }
    try:
        faults = Faults.from_json(knobs)
    except InvalidInput as exc:
        parser.error(f"--{exc.field.split('.')[0].replace('_', '-')}: {exc}")
    server = ProviderHTTPServer((args.host, args.port), ProviderState(faults, args.state_file))
    print(f"listening on http://{args.host}:{server.server_port}", flush=True)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
