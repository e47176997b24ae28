"""The local email provider, tested as a real process through its HTTP contract.

These pin what the durable sender relies on: one message per idempotency key, a
lookup that tells accepted from never-seen, and faults that produce each of the
client's three failure classes with the provider's store telling the truth.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from controlplane.dev.processes import RunningProvider, start_provider
from controlplane.dev.provider_admin import ProviderAdmin
from controlplane.dev.provider_server import Faults, ProviderState
from controlplane.reference.notices.provider import (
    DeliveryUncertain,
    HttpEmailProvider,
    Message,
    ProviderRejected,
    ProviderUnavailable,
    Receipt,
)


@pytest.fixture(scope="module")
def running_provider() -> Iterator[RunningProvider]:
    with start_provider() as provider:
        yield provider


@pytest.fixture
def provider_url(running_provider: RunningProvider) -> str:
    """The shared provider, emptied and with no faults, so tests do not see each other."""
    ProviderAdmin(running_provider.url).reset()
    return running_provider.url


@pytest.fixture
def admin(provider_url: str) -> ProviderAdmin:
    return ProviderAdmin(provider_url)


@pytest.fixture
def client(provider_url: str) -> HttpEmailProvider:
    return HttpEmailProvider(provider_url, timeout=5.0)


def notice(to: str = "a@example.com", body: str = "Your notice.") -> Message:
    return Message(to=to, subject="Notice", body=body, metadata={"batch": "b-1"})


def raw_post(url: str, payload: Any, headers: dict[str, str]) -> tuple[int, Any]:
    """POST bypassing the client, to send what the client would never send."""
    parts = urlsplit(url)
    assert parts.hostname is not None
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=5)
    try:
        connection.request("POST", "/messages", body=json.dumps(payload), headers=headers)
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def test_same_key_twice_stores_one_message_and_answers_the_same_receipt(
    client: HttpEmailProvider, admin: ProviderAdmin
) -> None:
    first = client.send(notice(), "op-1")
    second = client.send(notice(), "op-1")

    assert second == first
    assert first.id.startswith("msg_")
    assert (first.idempotency_key, first.to) == ("op-1", "a@example.com")
    stored = admin.messages()
    assert [(m["id"], m["to"], m["body"], m["metadata"]) for m in stored] == [
        (first.id, "a@example.com", "Your notice.", {"batch": "b-1"})
    ]
    assert [(r["outcome"], r["status"]) for r in admin.requests()] == [
        ("accepted", 202),
        ("duplicate", 200),
    ]


def test_reusing_a_key_for_a_different_message_is_a_conflict(
    client: HttpEmailProvider, admin: ProviderAdmin
) -> None:
    client.send(notice(body="Original."), "op-1")

    with pytest.raises(ProviderRejected) as rejected:
        client.send(notice(body="Edited."), "op-1")

    assert (rejected.value.status, rejected.value.field) == (409, "Idempotency-Key")
    assert [m["body"] for m in admin.messages()] == ["Original."]
    assert admin.requests()[-1]["outcome"] == "conflict"


def test_lookup_returns_the_receipt_or_none(client: HttpEmailProvider) -> None:
    # A key with characters that need quoting in a URL path still round-trips.
    receipt = client.send(notice(), "batch/7 op#1")

    assert client.lookup("batch/7 op#1") == receipt
    assert client.lookup("op-never-sent") is None


def test_messages_and_receipts_round_trip_through_json(client: HttpEmailProvider) -> None:
    # Task handlers store both in Documents and rebuild them on recovery.
    message = notice()
    receipt = client.send(message, "op-1")

    assert Message.from_json(message.to_json()) == message
    assert Receipt.from_json(receipt.to_json()) == receipt


def test_lookup_at_a_wrong_url_raises_instead_of_reporting_not_found(provider_url: str) -> None:
    # A misconfigured URL must not pass for "never sent", or the sender would send again.
    misconfigured = HttpEmailProvider(provider_url + "/wrong-prefix", timeout=5.0)

    with pytest.raises(ProviderRejected) as rejected:
        misconfigured.lookup("op-1")

    assert rejected.value.status == 404


def test_request_log_records_every_send_and_lookup_in_order(
    client: HttpEmailProvider, admin: ProviderAdmin, provider_url: str
) -> None:
    client.send(notice(), "op-1")
    client.send(notice(), "op-1")
    client.lookup("op-1")
    client.lookup("op-2")
    raw_post(provider_url, notice().to_json(), headers={})
    admin.messages()  # admin calls are not part of the log

    log = admin.requests()

    assert [(r["seq"], r["method"], r["idempotency_key"], r["outcome"], r["status"])
            for r in log] == [
        (1, "POST", "op-1", "accepted", 202),
        (2, "POST", "op-1", "duplicate", 200),
        (3, "GET", "op-1", "found", 200),
        (4, "GET", "op-2", "not_found", 404),
        (5, "POST", None, "invalid", 422),
    ]
    assert log[0]["message_id"] == log[1]["message_id"] == log[2]["message_id"]
    assert [r["send_no"] for r in log] == [1, 2, None, None, None]


def test_a_missing_idempotency_key_is_refused_naming_the_header(
    client: HttpEmailProvider, admin: ProviderAdmin, provider_url: str
) -> None:
    status, answer = raw_post(provider_url, notice().to_json(), headers={})
    with pytest.raises(ProviderRejected) as blank_key:
        client.send(notice(), "  ")

    assert (status, answer["field"]) == (422, "Idempotency-Key")
    assert (blank_key.value.status, blank_key.value.field) == (422, "Idempotency-Key")
    assert admin.messages() == []


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"subject": "s", "body": "b"}, "to"),
        ({"to": "not-an-address", "subject": "s", "body": "b"}, "to"),
        ({"to": "a@example.com", "subject": 3, "body": "b"}, "subject"),
        ({"to": "a@example.com", "subject": "s"}, "body"),
        ({"to": "a@example.com", "subject": "s", "body": "b", "metadata": []}, "metadata"),
        ({"to": "a@example.com", "subject": "s", "body": "b", "cc": "c@example.com"}, "cc"),
    ],
)
def test_a_bad_body_is_refused_naming_the_field(
    admin: ProviderAdmin, provider_url: str, body: dict[str, Any], field: str
) -> None:
    status, answer = raw_post(provider_url, body, headers={"Idempotency-Key": "op-1"})

    assert (status, answer["field"]) == (422, field)
    assert admin.messages() == []


def test_the_client_reports_a_refused_field(client: HttpEmailProvider) -> None:
    with pytest.raises(ProviderRejected) as rejected:
        client.send(Message(to="not-an-address", subject="s", body="b"), "op-1")

    assert (rejected.value.status, rejected.value.field) == (422, "to")


def test_error_rate_one_makes_the_provider_unavailable_and_stores_nothing(
    client: HttpEmailProvider, admin: ProviderAdmin
) -> None:
    admin.set_faults(error_rate=1.0)

    with pytest.raises(ProviderUnavailable):
        client.send(notice(), "op-1")
    with pytest.raises(ProviderUnavailable):
        client.lookup("op-1")

    assert admin.messages() == []
    assert [(r["outcome"], r["status"]) for r in admin.requests()] == [
        ("error", 503),
        ("error", 503),
    ]
    admin.set_faults()  # no faults: the retry with the same key now goes through
    assert client.send(notice(), "op-1").idempotency_key == "op-1"


def test_drop_after_accept_leaves_the_client_uncertain_while_the_message_is_stored(
    client: HttpEmailProvider, admin: ProviderAdmin
) -> None:
    admin.set_faults(drop_after_accept={"nth": 2})

    client.send(notice(to="a@example.com"), "op-1")
    with pytest.raises(DeliveryUncertain):
        client.send(notice(to="b@example.com"), "op-2")
    client.send(notice(to="c@example.com"), "op-3")

    assert [m["idempotency_key"] for m in admin.messages()] == ["op-1", "op-2", "op-3"]
    found = client.lookup("op-2")
    assert found is not None and found.to == "b@example.com"
    dropped = admin.requests()[1]
    assert (dropped["outcome"], dropped["status"], dropped["created"]) == ("dropped", None, True)
    # Re-sending under the same key, as a recovering sender may, creates nothing new.
    assert client.send(notice(to="b@example.com"), "op-2") == found
    assert len(admin.messages()) == 3


def test_drop_after_accept_by_recipient_stops_after_the_given_number_of_times(
    client: HttpEmailProvider, admin: ProviderAdmin
) -> None:
    admin.set_faults(drop_after_accept={"to": "d@example.com", "times": 1})

    client.send(notice(to="a@example.com"), "op-a")
    with pytest.raises(DeliveryUncertain):
        client.send(notice(to="d@example.com"), "op-d")
    retried = client.send(notice(to="d@example.com"), "op-d")

    assert retried.to == "d@example.com"
    assert Counter(m["to"] for m in admin.messages()) == {"a@example.com": 1, "d@example.com": 1}
    assert admin.faults()["fired"]["drop_after_accept"] == 1


def test_a_stall_after_store_times_the_client_out_while_the_message_is_stored(
    provider_url: str, admin: ProviderAdmin
) -> None:
    impatient = HttpEmailProvider(provider_url, timeout=0.3)
    admin.set_faults(stall={"to": "d@example.com", "ms": 2000, "when": "after_store"})

    started = time.monotonic()
    with pytest.raises(DeliveryUncertain):
        impatient.send(notice(to="d@example.com"), "op-d")

    assert time.monotonic() - started < 1.5  # gave up on its own timeout, not the stall's end
    assert [m["idempotency_key"] for m in admin.messages()] == ["op-d"]
    found = impatient.lookup("op-d")  # lookups are not stalled
    assert found is not None and found.to == "d@example.com"


def test_a_stall_before_store_stores_the_message_only_when_it_ends(
    provider_url: str, admin: ProviderAdmin
) -> None:
    impatient = HttpEmailProvider(provider_url, timeout=0.2)
    admin.set_faults(stall={"nth": 1, "ms": 1000, "when": "before_store"})

    with pytest.raises(DeliveryUncertain):
        impatient.send(notice(), "op-1")

    assert admin.messages() == []  # still stalled, not stored yet
    deadline = time.monotonic() + 5
    while not admin.messages() and time.monotonic() < deadline:
        time.sleep(0.05)
    # The provider finished the send although the client had given up on it.
    assert [m["idempotency_key"] for m in admin.messages()] == ["op-1"]


def test_ending_the_stalls_under_way_lets_them_go_on_and_leaves_later_sends_stalled() -> None:
    # A provider of its own: the shared one may still sleep an earlier test's stall.
    with start_provider() as provider:
        admin = ProviderAdmin(provider.url)
        impatient = HttpEmailProvider(provider.url, timeout=0.2)
        admin.set_faults(stall={"ms": 60_000, "when": "before_store"})
        with pytest.raises(DeliveryUncertain):
            impatient.send(notice(to="a@example.com"), "op-a")
        assert admin.messages() == []

        assert admin.end_stalls() == 1
        deadline = time.monotonic() + 5  # far less than the stall's 60 s
        while not admin.messages() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [m["idempotency_key"] for m in admin.messages()] == ["op-a"]
        assert admin.end_stalls() == 0  # none under way

        with pytest.raises(DeliveryUncertain):  # a later send stalls as before
            impatient.send(notice(to="b@example.com"), "op-b")
        time.sleep(0.3)
        assert [m["idempotency_key"] for m in admin.messages()] == ["op-a"]
        assert admin.end_stalls() == 1


def test_latency_delays_every_request(client: HttpEmailProvider, admin: ProviderAdmin) -> None:
    admin.set_faults(latency_ms=300)

    started = time.monotonic()
    assert client.lookup("op-1") is None

    assert time.monotonic() - started >= 0.3


@pytest.mark.parametrize(
    ("knobs", "field"),
    [
        ({"error_rate": 2}, "error_rate"),
        ({"latency_ms": -1}, "latency_ms"),
        ({"stall": {"to": "d@example.com"}}, "stall.ms"),
        ({"stall": {"ms": 10, "when": "later"}}, "stall.when"),
        ({"drop_after_accept": {"nth": 0}}, "drop_after_accept.nth"),
        ({"drop_after": {"nth": 1}}, "drop_after"),
    ],
)
def test_bad_fault_knobs_are_refused_naming_the_field(
    admin: ProviderAdmin, knobs: dict[str, Any], field: str
) -> None:
    with pytest.raises(ProviderRejected) as rejected:
        admin.set_faults(**knobs)

    assert (rejected.value.status, rejected.value.field) == (422, field)


def test_reset_forgets_messages_requests_and_faults(
    client: HttpEmailProvider, admin: ProviderAdmin
) -> None:
    client.send(notice(), "op-1")
    admin.set_faults(error_rate=1.0)

    admin.reset()

    assert admin.messages() == []
    assert admin.requests() == []
    assert admin.faults()["error_rate"] == 0.0
    assert client.lookup("op-1") is None


def test_fault_knobs_can_be_set_by_start_up_flags() -> None:
    with start_provider(drop_after_accept={"nth": 1}) as provider:
        admin = ProviderAdmin(provider.url)

        with pytest.raises(DeliveryUncertain):
            HttpEmailProvider(provider.url, timeout=5.0).send(notice(), "op-1")

        assert admin.faults()["drop_after_accept"]["nth"] == 1
        assert len(admin.messages()) == 1


def test_a_refused_connection_means_unavailable() -> None:
    with socket.socket() as probe:  # a port that nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    with pytest.raises(ProviderUnavailable):
        HttpEmailProvider(f"http://127.0.0.1:{port}", timeout=2.0).send(notice(), "op-1")


def test_the_state_file_survives_a_provider_sigkill_and_restart(tmp_path: Path) -> None:
    with start_provider(state_file=tmp_path / "provider.json") as provider:
        client = HttpEmailProvider(provider.url, timeout=5.0)
        first = client.send(notice(to="a@example.com"), "op-1")
        client.send(notice(to="b@example.com"), "op-2")
        url_before = provider.url

        provider.kill()
        with pytest.raises(ProviderUnavailable):
            client.lookup("op-1")
        provider.restart()

        admin = ProviderAdmin(provider.url)
        assert provider.url == url_before
        assert client.lookup("op-1") == first
        assert client.send(notice(to="a@example.com"), "op-1") == first
        assert [m["idempotency_key"] for m in admin.messages()] == ["op-1", "op-2"]
        assert [r["outcome"] for r in admin.requests()] == [
            "accepted", "accepted", "found", "duplicate",
        ]


def test_the_state_file_is_a_journal_that_drops_a_torn_last_line(tmp_path: Path) -> None:
    """One line per change (a request never rewrites the whole state); a line cut short
    by a SIGKILL in mid-append was never acknowledged, so a restart drops it."""
    path = tmp_path / "provider.jsonl"
    state = ProviderState(Faults(), path)
    message = {"to": "a@example.com", "subject": "s", "body": "b", "metadata": {}}
    state.store("op-1", message, 1, {"method": "POST", "faults": []})
    state.log({"method": "GET", "outcome": "found"})
    lines = path.read_text().splitlines()
    assert [next(iter(json.loads(line))) for line in lines] == [
        "version", "message", "request", "request"]
    with path.open("a") as journal:
        journal.write('{"request": {"seq": 3, "meth')  # the kill
    restarted = ProviderState(Faults(), path)
    assert [m["idempotency_key"] for m in restarted.messages()] == ["op-1"]
    assert [r["seq"] for r in restarted.requests()] == [1, 2]
    restarted.log({"method": "GET", "outcome": "not_found"})  # appends after a clean line
    assert [r["seq"] for r in ProviderState(Faults(), path).requests()] == [1, 2, 3]


def test_a_state_file_of_the_first_version_is_read_and_rewritten(tmp_path: Path) -> None:
    path = tmp_path / "provider.json"
    message = {"id": "msg_1", "idempotency_key": "op-1", "accepted_at": "2026-01-01T00:00:00",
               "to": "a@example.com", "subject": "s", "body": "b", "metadata": {}}
    path.write_text(json.dumps({"version": 1, "messages": [message],
                                "requests": [{"seq": 1, "method": "POST"}]}))
    state = ProviderState(Faults(), path)
    assert [m["id"] for m in state.messages()] == ["msg_1"]
    assert json.loads(path.read_text().splitlines()[0]) == {"version": 2}
    assert [r["seq"] for r in ProviderState(Faults(), path).requests()] == [1]


def test_concurrent_sends_of_one_key_create_exactly_one_message(
    client: HttpEmailProvider, admin: ProviderAdmin
) -> None:
    senders = 20
    start_together = threading.Barrier(senders)
    receipts = []
    errors = []

    def send() -> None:
        start_together.wait()
        try:
            receipts.append(client.send(notice(), "op-1"))
        except Exception as exc:  # collected so the assertion below shows it
            errors.append(exc)

    threads = [threading.Thread(target=send) for _ in range(senders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)

    assert errors == []
    assert len(receipts) == senders and len(set(receipts)) == 1
    assert len(admin.messages()) == 1
    assert Counter(r["outcome"] for r in admin.requests()) == {"accepted": 1, "duplicate": 19}
