"""The loopback SMTP stand-in: it receives mail and can make a send uncertain."""

from __future__ import annotations

import smtplib
from collections.abc import Iterator

import pytest

from controlplane.notices.smtp_server import ReceivedMessage, SmtpStandIn, start_smtp_server


@pytest.fixture
def smtp() -> Iterator[SmtpStandIn]:
    with start_smtp_server() as server:
        yield server


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
