"""Delivery channels for notices, told apart by what they can promise (DESIGN §10).

The HTTP provider takes an idempotency key and can be asked about it later, so
an interrupted send is confirmed by a lookup. SMTP can do neither: an
interrupted SMTP send is *uncertain* and goes to an operator.

Every channel reports failures in the same three words, so the task code reads
the same for both:

- :class:`NotAccepted`: certainly not sent; retrying (with the same key) is safe.
- :class:`Uncertain`: may have been sent; confirm before doing anything else.
- :class:`Rejected`: will never be accepted; give up.
"""

from __future__ import annotations

import contextlib
import smtplib
import time
from email.utils import make_msgid
from typing import Protocol

from django.core.mail import EmailMessage, get_connection

from controlplane.reference.notices.provider import (
    DeliveryUncertain,
    HttpEmailProvider,
    Message,
    ProviderRejected,
    ProviderUnavailable,
    Receipt,
)


class NotAccepted(Exception):
    pass


class Uncertain(Exception):
    pass


class Rejected(Exception):
    pass


class CannotConfirm(Exception):
    """The channel has no way to find out whether a message was sent."""


class Channel(Protocol):
    def send(
        self, message: Message, operation_id: str, deadline: float | None = None
    ) -> dict[str, str]:
        """``deadline`` (Unix time): the send ends by then; where the channel can, the
        other side also refuses to take the message later."""
        ...

    def lookup(self, operation_id: str) -> dict[str, str] | None: ...


class HttpChannel:
    def __init__(self, base_url: str, timeout: float = 10.0) -> None:
        self.provider = HttpEmailProvider(base_url, timeout)

    def send(
        self, message: Message, operation_id: str, deadline: float | None = None
    ) -> dict[str, str]:
        try:
            return self.provider.send(message, operation_id, deadline).to_json()
        except ProviderUnavailable as exc:
            raise NotAccepted(str(exc)) from exc
        except DeliveryUncertain as exc:
            raise Uncertain(str(exc)) from exc
        except ProviderRejected as exc:
            raise Rejected(str(exc)) from exc

    def lookup(self, operation_id: str) -> dict[str, str] | None:
        try:
            found: Receipt | None = self.provider.lookup(operation_id)
        except ProviderUnavailable as exc:
            raise NotAccepted(str(exc)) from exc
        except ProviderRejected as exc:
            raise Rejected(str(exc)) from exc
        return found.to_json() if found else None


class SmtpChannel:
    """Plain SMTP through Django's email backend: no idempotency, no query."""

    def __init__(self, host: str, port: int, sender: str, timeout: float = 10.0) -> None:
        self.host, self.port, self.sender, self.timeout = host, port, sender, timeout

    def send(
        self, message: Message, operation_id: str, deadline: float | None = None
    ) -> dict[str, str]:
        """SMTP has no deadline of its own: the socket timeout ends the call by
        ``deadline``, but a server may still take a message whose sender gave up, which is
        why an interrupted SMTP send goes to an operator."""
        message_id = make_msgid(domain="notices.local")
        timeout = self.timeout if deadline is None else min(self.timeout, deadline - time.time())
        if timeout <= 0:
            raise NotAccepted("the send's deadline passed before it was sent")
        email = EmailMessage(
            message.subject,
            message.body,
            self.sender,
            [message.to],
            headers={"X-Operation-Id": operation_id, "Message-ID": message_id},
        )
        connection = get_connection(
            "django.core.mail.backends.smtp.EmailBackend",
            host=self.host,
            port=self.port,
            timeout=timeout,
            fail_silently=False,
        )
        try:
            connection.open()
        except (OSError, smtplib.SMTPException) as exc:
            raise NotAccepted(f"SMTP server unreachable: {exc}") from exc
        try:
            connection.send_messages([email])
        except smtplib.SMTPRecipientsRefused as exc:
            raise Rejected(f"recipient refused: {exc}") from exc
        except (TimeoutError, smtplib.SMTPServerDisconnected, OSError) as exc:
            raise Uncertain(f"SMTP connection lost during the send: {exc}") from exc
        finally:
            with contextlib.suppress(Exception):  # closing a dropped connection tells nothing
                connection.close()
        return {"id": message_id, "to": message.to, "idempotency_key": operation_id}

    def lookup(self, operation_id: str) -> dict[str, str] | None:
        raise CannotConfirm("SMTP cannot be asked whether a message was delivered")
