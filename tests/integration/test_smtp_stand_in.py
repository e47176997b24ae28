"""The loopback SMTP stand-in: it receives mail and can make a send uncertain."""

from __future__ import annotations

import smtplib
import threading
import time

import pytest

from controlplane.dev.smtp_server import ReceivedMessage, SmtpStandIn


def send(server: SmtpStandIn, to: str, text: str) -> None:
    """One message per connection, as a sender that reconnects after a failure would."""
    with smtplib.SMTP(server.host, server.port, timeout=5) as client:
        client.sendmail("notices@example.com", [to], f"Subject: Notice\r\n\r\n{text}\r\n")


def test_it_records_the_messages_it_receives(smtp: SmtpStandIn) -> None:
    assert smtp.port != 0

    send(smtp, "a@example.com", "first")
    send(smtp, "b@example.com", "second")

    assert smtp.messages() == [
        ReceivedMessage("notices@example.com", ("a@example.com",),
                        b"Subject: Notice\r\n\r\nfirst\r\n"),
        ReceivedMessage("notices@example.com", ("b@example.com",),
                        b"Subject: Notice\r\n\r\nsecond\r\n"),
    ]


def test_the_nth_message_is_recorded_but_left_unanswered(smtp: SmtpStandIn) -> None:
    smtp.drop_after_data(nth=2)

    send(smtp, "a@example.com", "one")
    with pytest.raises(smtplib.SMTPServerDisconnected):
        send(smtp, "b@example.com", "two")
    send(smtp, "c@example.com", "three")

    # The client saw a failure, yet the server has the message: an uncertain send.
    assert [m.rcpt_tos for m in smtp.messages()] == [
        ("a@example.com",), ("b@example.com",), ("c@example.com",),
    ]


def test_messages_to_a_recipient_are_left_unanswered_until_cleared(smtp: SmtpStandIn) -> None:
    smtp.drop_after_data(to="d@example.com")

    send(smtp, "a@example.com", "to a")
    for attempt in ("first try", "second try"):
        with pytest.raises(smtplib.SMTPServerDisconnected):
            send(smtp, "d@example.com", attempt)
    smtp.clear_faults()
    send(smtp, "d@example.com", "third try")

    assert [m.data.split(b"\r\n\r\n")[1] for m in smtp.messages()] == [
        b"to a\r\n", b"first try\r\n", b"second try\r\n", b"third try\r\n",
    ]


def test_messages_to_every_address_with_a_prefix_are_left_unanswered(smtp: SmtpStandIn) -> None:
    smtp.drop_after_data(to_prefix="b-7-")

    for to in ("b-7-0@example.com", "b-7-1@example.com"):
        with pytest.raises(smtplib.SMTPServerDisconnected):
            send(smtp, to, "uncertain")
    send(smtp, "b-70-0@example.com", "another batch's")

    assert len(smtp.messages()) == 3


def test_a_stalled_message_is_recorded_at_once_and_answered_late(smtp: SmtpStandIn) -> None:
    smtp.stall_after_data(to="b@example.com", seconds=1.0)
    outcome: list[BaseException | None] = []

    def send_stalled() -> None:
        try:
            send(smtp, "b@example.com", "held")
            outcome.append(None)
        except BaseException as exc:  # reported by the assertion below
            outcome.append(exc)

    started = time.monotonic()
    sender = threading.Thread(target=send_stalled)
    sender.start()
    deadline = started + 5
    while not any("b@example.com" in m.rcpt_tos for m in smtp.messages()):
        assert time.monotonic() < deadline, "the stalled message was never recorded"
        time.sleep(0.01)
    # The server has it, the sender does not know yet; other senders are not held up.
    assert sender.is_alive()
    send(smtp, "a@example.com", "not held")
    assert sender.is_alive()

    sender.join(timeout=5)
    assert outcome == [None] and time.monotonic() - started >= 1.0
    assert [m.rcpt_tos for m in smtp.messages()] == [("b@example.com",), ("a@example.com",)]


def test_a_sender_that_stops_waiting_during_a_stall_cannot_know(smtp: SmtpStandIn) -> None:
    smtp.stall_after_data(nth=1, seconds=2.0)

    client = smtplib.SMTP(smtp.host, smtp.port, timeout=0.3)
    with pytest.raises(smtplib.SMTPServerDisconnected, match="timed out"):
        client.sendmail("notices@example.com", ["a@example.com"], "Subject: N\r\n\r\none\r\n")
    send(smtp, "b@example.com", "the second is answered at once")
    smtp.stall_after_data(to="c@example.com", seconds=2.0)
    smtp.clear_faults()
    send(smtp, "c@example.com", "cleared")

    assert [m.rcpt_tos for m in smtp.messages()] == [
        ("a@example.com",), ("b@example.com",), ("c@example.com",),
    ]
