"""Client for an HTTP email provider that takes idempotency keys (docs/email-provider.md).

A durable sender must know, after every failed call, whether the provider may
have accepted the message. So failures are split by what the caller can conclude:

- ``ProviderRejected``: the provider answered 4xx. It will answer the same again;
  do not retry.
- ``ProviderUnavailable``: known not accepted (connection refused, or the provider
  answered 503/429). Retrying with the same idempotency key is safe.
- ``DeliveryUncertain``: the request may have reached the provider but no usable
  answer came back (dropped connection, timeout, other 5xx). The message may have
  been accepted: look it up by idempotency key before deciding anything.

Each call uses a fresh connection: a reused keep-alive connection that the server
had already closed would fail in a way indistinguishable from a dropped send, and
turn a certain "not sent" into an uncertain one.

Uses the standard library only.
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit

IDEMPOTENCY_HEADER = "Idempotency-Key"
DEADLINE_HEADER = "Request-Deadline"
"""Unix time (seconds) after which the provider must not accept the message
(docs/email-provider.md): what lets a sender know that no call of its can reach the
provider later."""
# Answers meaning "not accepted, try again later" (docs/email-provider.md).
RETRY_LATER_STATUSES = frozenset({429, 503})


class ProviderError(Exception):
    """Base class of every failure reported by this module."""


class ProviderRejected(ProviderError):
    """The provider refused the request (4xx): permanent, retrying cannot help."""

    def __init__(self, status: int, error: str, field: str | None = None) -> None:
        super().__init__(f"provider rejected the request ({status}): {error}"
                         + (f" [field: {field}]" if field else ""))
        self.status = status
        self.error = error
        self.field = field


class ProviderUnavailable(ProviderError):
    """The provider did not take the request: it certainly holds no new message."""


class DeliveryUncertain(ProviderError):
    """The request may have been accepted; only a lookup by idempotency key can tell."""


@dataclass(frozen=True)
class Message:
    """An email to send. ``metadata`` travels with it and is stored by the provider."""

    to: str
    subject: str
    body: str
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "to": self.to,
            "subject": self.subject,
            "body": self.body,
            "metadata": dict(self.metadata),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Message:
        return cls(
            to=data["to"],
            subject=data["subject"],
            body=data["body"],
            metadata=dict(data.get("metadata", {})),
        )


@dataclass(frozen=True)
class Receipt:
    """The provider's proof of acceptance, kept verbatim so it can be stored durably.

    ``accepted_at`` is the provider's ISO 8601 timestamp, left as text so that a
    stored receipt is exactly what the provider said.
    """

    id: str
    idempotency_key: str
    accepted_at: str
    to: str

    def to_json(self) -> dict[str, str]:
        return {
            "id": self.id,
            "idempotency_key": self.idempotency_key,
            "accepted_at": self.accepted_at,
            "to": self.to,
        }

    @classmethod
    def from_json(cls, data: object) -> Receipt:
        """Parse a receipt; ValueError if any field is missing or not a string."""
        if not isinstance(data, Mapping):
            raise ValueError(f"a receipt must be a JSON object, got {data!r}")
        fields = ("id", "idempotency_key", "accepted_at", "to")
        missing = [name for name in fields if not isinstance(data.get(name), str)]
        if missing:
            raise ValueError(f"receipt lacks string field(s) {missing}: {data!r}")
        return cls(
            id=data["id"],
            idempotency_key=data["idempotency_key"],
            accepted_at=data["accepted_at"],
            to=data["to"],
        )


@dataclass(frozen=True)
class _Answer:
    status: int
    payload: Any  # the decoded JSON body, or None if it was not JSON


class _Endpoint:
    """Makes one HTTP request per connection and reports how far it got.

    Raises ProviderUnavailable when the connection could not be opened (nothing was
    sent) and DeliveryUncertain when it failed after the request may have been sent.
    """

    def __init__(self, base_url: str, timeout: float) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"provider URL must be http(s)://host[:port][/path], got {base_url!r}")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port
        self._prefix = parts.path.rstrip("/")
        self._timeout = timeout

    def request(
        self,
        method: str,
        path: str,
        payload: Any = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> _Answer:
        connection_class = (
            http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        )
        wait = self._timeout if timeout is None else max(0.001, min(self._timeout, timeout))
        connection = connection_class(self._host, self._port, timeout=wait)
        body = None if payload is None else json.dumps(payload).encode()
        all_headers = {"Accept": "application/json", "Connection": "close", **(headers or {})}
        if body is not None:
            all_headers["Content-Type"] = "application/json"
        try:
            try:
                connection.connect()
            except OSError as exc:
                raise ProviderUnavailable(f"cannot connect to the provider: {exc}") from exc
            try:
                connection.request(method, self._prefix + path, body=body, headers=all_headers)
                response = connection.getresponse()
                raw = response.read()
            except (OSError, http.client.HTTPException) as exc:
                raise DeliveryUncertain(
                    f"{method} {path}: no answer after the request was sent: {exc!r}"
                ) from exc
        finally:
            connection.close()
        try:
            decoded = json.loads(raw) if raw else None
        except ValueError:
            decoded = None
        return _Answer(status=response.status, payload=decoded)


def _error_of(answer: _Answer) -> tuple[str, str | None]:
    if isinstance(answer.payload, dict):
        return str(answer.payload.get("error", answer.payload)), answer.payload.get("field")
    return f"HTTP {answer.status}", None


class HttpEmailProvider:
    """Sends messages with an idempotency key and looks them up by that key."""

    def __init__(self, base_url: str, timeout: float = 10.0) -> None:
        self._endpoint = _Endpoint(base_url, timeout)

    def send(
        self, message: Message, idempotency_key: str, deadline: float | None = None
    ) -> Receipt:
        """Send once under ``idempotency_key``; a repeat with the same key sends nothing new.

        ``deadline`` (Unix time): the call ends by then, and the provider refuses to
        accept the message after it, so nothing sent now can reach it later.

        Returns the receipt (the original one if the key was used before). Raises
        ProviderRejected, ProviderUnavailable or DeliveryUncertain (see the module
        docstring for what each means to a durable sender).
        """
        headers = {IDEMPOTENCY_HEADER: idempotency_key}
        timeout = None
        if deadline is not None:
            timeout = deadline - time.time()
            if timeout <= 0:
                raise ProviderUnavailable("the send's deadline passed before it was sent")
            headers[DEADLINE_HEADER] = f"{deadline:.3f}"
        answer = self._endpoint.request("POST", "/messages", message.to_json(), headers, timeout)
        if answer.status in (200, 202):
            try:
                return Receipt.from_json(answer.payload)
            except ValueError as exc:
                # It said yes, but we cannot read the receipt: a lookup may do better.
                raise DeliveryUncertain(f"unreadable receipt: {exc}") from exc
        if answer.status in RETRY_LATER_STATUSES:
            raise ProviderUnavailable(f"provider answered {answer.status}: {_error_of(answer)[0]}")
        if 400 <= answer.status < 500:
            raise ProviderRejected(answer.status, *_error_of(answer))
        # Any other answer (500, 502, 504, ...) may come from after the message was stored.
        raise DeliveryUncertain(f"provider answered {answer.status}: {_error_of(answer)[0]}")

    def lookup(self, idempotency_key: str) -> Receipt | None:
        """Return the receipt of the message sent under this key, or None if there is none.

        None is returned only for the contract's explicit not-found answer (404 with
        ``{"status": "not_found"}``), never for an error, so a misconfigured URL is
        not mistaken for "never sent". Raises ProviderUnavailable when no trustworthy
        answer was obtained (a lookup changes nothing, so it is always safe to retry),
        ProviderRejected for any other 4xx.
        """
        try:
            answer = self._endpoint.request("GET", "/messages/" + quote(idempotency_key, safe=""))
        except DeliveryUncertain as exc:
            raise ProviderUnavailable(str(exc)) from exc
        if answer.status == 200:
            try:
                return Receipt.from_json(answer.payload)
            except ValueError as exc:
                raise ProviderUnavailable(f"unreadable receipt: {exc}") from exc
        if answer.status == 404 and answer.payload == {"status": "not_found"}:
            return None
        if 400 <= answer.status < 500:
            raise ProviderRejected(answer.status, *_error_of(answer))
        raise ProviderUnavailable(f"provider answered {answer.status}: {_error_of(answer)[0]}")
