"""A loopback SMTP server for tests, with faults that make a send uncertain.

Plain SMTP has no idempotency key and no way to ask "did you get it?". When the
connection drops after the DATA was transmitted but before the server's answer
arrives, the client cannot know whether the message went out: the durable sender
must treat it as uncertain and hand it to an operator. This stand-in can produce
exactly that: it records the message and then closes the connection without
answering, for the Nth message or for a given recipient. It can also record the
message and hold the answer back for a while, so that a chaos test can kill the
sender while the server has the message and the sender does not know it yet.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import NamedTuple

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, Envelope, Session


class ReceivedMessage(NamedTuple):
    """One message as the server got it: envelope sender, recipients, raw content."""

    mail_from: str
    rcpt_tos: tuple[str, ...]
    data: bytes


@dataclass(frozen=True)
class DropAfterData:
    """Which messages to record and then leave unanswered; every criterion given must hold.

    ``nth`` counts messages received since the rule was armed (1-based); ``to_prefix``
    matches every recipient that starts with it (a batch's addresses share their tag).
    """

    to: str | None = None
    nth: int | None = None
    to_prefix: str | None = None

    def matches(self, rcpt_tos: tuple[str, ...], message_no: int) -> bool:
        return _matches(self.to, self.nth, rcpt_tos, message_no) and (
            self.to_prefix is None or any(r.startswith(self.to_prefix) for r in rcpt_tos))


@dataclass(frozen=True)
class StallAfterData:
    """Which messages to record and then answer only ``seconds`` later; criteria as for
    :class:`DropAfterData`."""

    seconds: float
    to: str | None = None
    nth: int | None = None

    def matches(self, rcpt_tos: tuple[str, ...], message_no: int) -> bool:
        return _matches(self.to, self.nth, rcpt_tos, message_no)


def _matches(to: str | None, nth: int | None, rcpt_tos: tuple[str, ...], message_no: int) -> bool:
    return (to is None or to in rcpt_tos) and (nth is None or nth == message_no)


# A rule and the number of messages received before it was armed (``nth`` counts from there).
_Armed = tuple[DropAfterData | StallAfterData, int]


def _fires(armed: _Armed | None, rcpt_tos: tuple[str, ...], received: int) -> bool:
    return armed is not None and armed[0].matches(rcpt_tos, received - armed[1])


class _RecordingHandler:
    """aiosmtpd handler: records each message, then answers 250 (maybe late) or drops
    the connection.

    It runs on the controller's event loop thread while tests read from theirs,
    hence the lock.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._messages: list[ReceivedMessage] = []
        self._drop: tuple[DropAfterData, int] | None = None
        self._stall: tuple[StallAfterData, int] | None = None

    def messages(self) -> list[ReceivedMessage]:
        with self._lock:
            return list(self._messages)

    def arm(self, drop: DropAfterData | None) -> None:
        with self._lock:
            self._drop = None if drop is None else (drop, len(self._messages))

    def arm_stall(self, stall: StallAfterData | None) -> None:
        with self._lock:
            self._stall = None if stall is None else (stall, len(self._messages))

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        assert envelope.mail_from is not None and isinstance(envelope.content, bytes)
        message = ReceivedMessage(envelope.mail_from, tuple(envelope.rcpt_tos), envelope.content)
        with self._lock:
            self._messages.append(message)
            received = len(self._messages)
            drop = _fires(self._drop, message.rcpt_tos, received)
            stall = self._stall
            delay = stall[0].seconds if stall and _fires(stall, message.rcpt_tos, received) else 0
        if delay:
            # Only this connection waits for its answer; the others are served meanwhile.
            await asyncio.sleep(delay)
        if drop and server.transport is not None:
            # Closing the transport makes aiosmtpd discard the answer below (the
            # connection is gone), so the client reads EOF instead of "250".
            server.transport.close()
        return "250 OK"


class _AnyPortController(Controller):
    """A Controller that also works with port 0.

    aiosmtpd 1.4 checks the server is up by connecting to the configured port, which
    fails for port 0 (aio-libs/aiosmtpd#388). Once the server is bound, we read the
    port the OS picked before that check runs.
    """

    def _trigger_server(self) -> None:
        assert isinstance(self.server, asyncio.Server)
        self.port = self.server.sockets[0].getsockname()[1]
        super()._trigger_server()


class SmtpStandIn:
    """Handle on a running stand-in: where it listens, what it got, which faults to inject."""

    def __init__(self, controller: Controller, handler: _RecordingHandler) -> None:
        self.host: str = controller.hostname
        self.port: int = controller.port
        self._handler = handler

    def messages(self) -> list[ReceivedMessage]:
        """A snapshot of every message received so far (dropped ones included)."""
        return self._handler.messages()

    def drop_after_data(
        self, *, to: str | None = None, nth: int | None = None, to_prefix: str | None = None
    ) -> None:
        """Record matching messages, then close the connection without answering."""
        self._handler.arm(DropAfterData(to=to, nth=nth, to_prefix=to_prefix))

    def stall_after_data(
        self, *, seconds: float, to: str | None = None, nth: int | None = None
    ) -> None:
        """Record matching messages, then wait ``seconds`` before answering.

        The message is in :meth:`messages` at once, while the client still waits
        for its answer: a sender killed meanwhile never learns that it was received.
        """
        self._handler.arm_stall(StallAfterData(seconds=seconds, to=to, nth=nth))

    def clear_faults(self) -> None:
        """Answer every message normally again (a stall already started runs out)."""
        self._handler.arm(None)
        self._handler.arm_stall(None)


@contextmanager
def start_smtp_server(host: str = "127.0.0.1", port: int = 0) -> Iterator[SmtpStandIn]:
    """Run the stand-in in a background thread for the duration of the block."""
    handler = _RecordingHandler()
    controller = _AnyPortController(handler, hostname=host, port=port)
    controller.start()
    try:
        yield SmtpStandIn(controller, handler)
    finally:
        controller.stop()
