"""Request rates (controlplane.web.rates): one account, or one client address, asking faster
than its rate is answered 429 with ``Retry-After`` before anything is read, whether it
comes with a token, a browser's login or nothing at all; others are not held up; the
probes always get through; the schema says so; a Redis that is down counts nothing."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client

from controlplane.access import issue_token
from controlplane.dev.ports import free_port
from controlplane.web import rates, turns

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def counted(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rates on, in keys of this test's own (Redis is shared by every run here). One
    request's worth comes back every ``SLOW`` seconds, far longer than a test's requests
    take however loaded the machine: a burst is used up by the requests a test makes, not
    by how fast it makes them."""
    monkeypatch.setattr(rates, "KEY_PREFIX", f"test:rate:{uuid.uuid4().hex}")
    settings.USER_REQUESTS_PER_SECOND = 1 / SLOW
    settings.USER_REQUEST_BURST = 3
    settings.ADDRESS_REQUESTS_PER_SECOND = 1 / SLOW
    settings.ADDRESS_REQUEST_BURST = 6


SLOW = 30


def account(name: str, group: str = "viewer") -> User:
    user = User.objects.create_user(name)
    user.groups.add(Group.objects.get_or_create(name=group)[0])
    return user


def quiet_session() -> str:
    """A session with no commits: a long-poll on it waits its whole ``wait``."""
    from controlplane.worker.runtime import runtime

    return runtime().kernel.create_session().id


def bearer(user: User, address: str) -> Client:
    return Client(REMOTE_ADDR=address,
                  headers={"Authorization": f"Bearer {issue_token(user, 't')}"})


def test_a_token_past_its_accounts_rate_is_answered_429_then_served_again(
    settings: Any,
) -> None:
    settings.USER_REQUESTS_PER_SECOND = 1  # so that waiting a second serves one more
    client = bearer(account("vic"), "10.0.0.1")
    assert [client.get("/api/sessions").status_code for _ in range(3)] == [200] * 3
    refused = client.get("/api/sessions")
    assert refused.status_code == 429
    assert refused["Retry-After"] == "1"
    assert "too many requests from this account (USER_REQUESTS_PER_SECOND)" in (
        refused.json()["detail"])
    # Another account from another address is not held up; the refusal took nothing.
    assert bearer(account("ann"), "10.0.0.2").get("/api/sessions").status_code == 200
    time.sleep(1.1)  # one request's worth at 1 a second
    assert client.get("/api/sessions").status_code == 200
    assert client.get("/api/sessions").status_code == 429


def test_a_browser_past_its_accounts_rate_is_refused_on_pages_and_actions() -> None:
    user = account("olga", "operator")
    tabs = [Client(REMOTE_ADDR=f"10.1.0.{n}") for n in range(2)]
    for tab in tabs:
        tab.force_login(user)
    assert tabs[0].get("/").status_code == 200
    assert tabs[1].get("/tasks/").status_code == 200
    assert tabs[0].get("/workers/").status_code == 200
    refused = tabs[1].post("/tasks/t1/cancel", {"reason": "r"})
    assert refused.status_code == 429
    assert 1 <= int(refused["Retry-After"]) <= SLOW  # when the next request's worth is due
    assert b"this account" in refused.content
    assert tabs[0].get("/api/sessions").status_code == 429


def test_an_address_past_its_rate_is_refused_before_anyone_logs_in() -> None:
    guesser = Client(REMOTE_ADDR="10.2.0.1")
    answers = [guesser.get("/accounts/login/").status_code for _ in range(7)]
    assert answers == [200] * 6 + [429]
    refused = guesser.post("/accounts/login/", {"username": "x", "password": "y"})
    assert refused.status_code == 429 and b"this address" in refused.content
    assert guesser.get("/api/openapi.json").status_code == 429
    assert guesser.get("/healthz").status_code == 200  # probes are never counted
    assert guesser.get("/readyz").status_code == 200
    assert Client(REMOTE_ADDR="10.2.0.2").get("/accounts/login/").status_code == 200
    # An IPv6 client's whole /64 is one address.
    for n in range(6):
        Client(REMOTE_ADDR=f"2001:db8:5:6::{n + 1}").get("/accounts/login/")
    assert Client(REMOTE_ADDR="2001:db8:5:6::ff").get("/accounts/login/").status_code == 429


def test_a_token_counts_against_its_address_too() -> None:
    vic = account("vic")
    for n in range(6):
        assert bearer(account(f"user{n}"), "10.3.0.1").get("/api/sessions").status_code == 200
    refused = bearer(vic, "10.3.0.1").get("/api/sessions")
    assert refused.status_code == 429 and "this address" in refused.json()["detail"]


def test_every_operation_documents_the_429_and_its_retry_after() -> None:
    schema = Client().get("/api/openapi.json").json()
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            answer = operation["responses"]["429"]
            assert answer["headers"]["Retry-After"]["schema"] == {"type": "integer"}, (
                path, method)


def test_without_redis_requests_are_not_counted(settings: Any) -> None:
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
    client = bearer(account("vic"), "10.4.0.1")
    assert {client.get("/api/sessions").status_code for _ in range(8)} == {200}


@pytest.fixture
def budgeted(settings: Any) -> None:
    """Server time counted, the rates out of the way: a tenth of a second of the
    server's time per second, half a second of it at once: a request that takes 0.3 s
    puts its account 3 s in arrears, and more than 5 s is refused."""
    settings.USER_REQUESTS_PER_SECOND = 0
    settings.ADDRESS_REQUESTS_PER_SECOND = 0
    settings.USER_SERVER_SECONDS_PER_SECOND = 0.1
    settings.USER_SERVER_SECONDS_BURST = 0.5


def test_an_account_whose_requests_took_its_share_of_server_time_waits_until_paid_off(
    budgeted: None, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from controlplane.reads import pages

    searched = pages.tasks_page

    def costly(search: Any) -> Any:  # a search that keeps the server busy
        time.sleep(0.3)
        return searched(search)

    monkeypatch.setattr(pages, "tasks_page", costly)
    heavy = Client(REMOTE_ADDR="10.5.0.1")
    heavy.force_login(account("vic"))
    # Far fewer requests than any rate allows: what they cost is what is counted.
    assert [heavy.get("/tasks/?q=ren&sort=-status").status_code for _ in range(2)] == [200] * 2
    refused = heavy.get("/tasks/")
    assert refused.status_code == 429
    # Over 6 s owed (the pages' own time besides), 5 s allowed: paid off in a second or
    # two, however slow the machine made them.
    retry_after = int(refused["Retry-After"])
    assert 1 <= retry_after <= 3
    assert b"share of the server's time (USER_SERVER_SECONDS_PER_SECOND)" in refused.content
    # The same account through a token is refused too; another account is served.
    vics_token = bearer(User.objects.get(username="vic"), "10.5.0.2")
    assert vics_token.get("/api/sessions").status_code == 429
    other = Client(REMOTE_ADDR="10.5.0.3")
    other.force_login(account("ann"))
    assert other.get("/tasks/").status_code == 200
    time.sleep(retry_after + 0.1)
    assert heavy.get("/tasks/").status_code == 200


def test_a_tokens_requests_are_charged_to_its_account(budgeted: None) -> None:
    vic = account("vic")
    client = bearer(vic, "10.6.0.1")
    assert client.get("/api/sessions").status_code == 200
    rates.charge(rates.server_time(vic.pk), 0.6)  # as a request of 0.6 s would: 6 s owed
    refused = client.get("/api/sessions")
    assert refused.status_code == 429
    assert "USER_SERVER_SECONDS_PER_SECOND" in refused.json()["detail"]


def test_a_long_polls_wait_is_not_charged_as_server_time(budgeted: None) -> None:
    client = bearer(account("vic"), "10.7.0.1")
    # A second's wait for a commit that never comes: 10 s of budget if it were charged.
    waited = client.get(f"/api/sessions/{quiet_session()}/changes?after=0&wait=1")
    assert waited.status_code == 200 and waited.json()["changes"] == []
    assert client.get("/api/sessions").status_code == 200
    assert client.get("/api/sessions").status_code == 200


@pytest.mark.django_db(transaction=True)  # the requests run on threads of their own
def test_an_account_can_start_only_so_many_requests_at_once(
    budgeted: None, settings: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each request is charged START_SECONDS as it is let in: with 5 s of server time
    at once, six start (the sixth finds its account exactly at the burst) and the rest
    are refused while those run, before their cost is known."""
    from concurrent.futures import ThreadPoolExecutor

    from django.db import connections

    from controlplane.reads import pages

    settings.USER_SERVER_SECONDS_BURST = 5 * rates.START_SECONDS
    settings.USER_TURN_WAIT_SECONDS = 0  # the budget alone: the account's work not in turns
    inside, release = threading.Semaphore(0), threading.Event()
    searched = pages.tasks_page

    def held(search: Any) -> Any:  # a search that runs until the test lets it go
        inside.release()
        release.wait(60)
        return searched(search)

    monkeypatch.setattr(pages, "tasks_page", held)
    user = account("vic")

    def ask(n: int) -> int:
        try:
            tab = Client(REMOTE_ADDR=f"10.8.0.{n}")
            tab.force_login(user)
            return tab.get("/tasks/?q=ren").status_code
        finally:
            connections.close_all()  # this thread's, before the test database goes

    with ThreadPoolExecutor(8) as pool:
        asked = [pool.submit(ask, n) for n in range(8)]
        for _ in range(6):
            assert inside.acquire(timeout=60)
        deadline = time.monotonic() + 60
        while sum(f.done() for f in asked) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        refused = [f.result() for f in asked if f.done()]
        release.set()
        answers = sorted(f.result(timeout=60) for f in asked)
    # Six at once (START_SECONDS each against 5 s, the last taken at the burst), the two
    # others refused, while the six were still running.
    assert answers == [200] * 6 + [429] * 2
    assert refused == [429, 429]


@pytest.fixture
def held_searches(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Semaphore, threading.Event]:
    """The tasks page's search held until the test lets it go: (a search came in, let
    them go)."""
    from controlplane.reads import pages

    inside, release = threading.Semaphore(0), threading.Event()
    searched = pages.tasks_page

    def held(search: Any) -> Any:
        inside.release()
        release.wait(60)
        return searched(search)

    monkeypatch.setattr(pages, "tasks_page", held)
    return inside, release


def _tab(user: User, address: str, path: str) -> int:
    """A browser tab's request on a thread of its own: its answer's status."""
    from django.db import connections

    try:
        tab = Client(REMOTE_ADDR=address)
        tab.force_login(user)
        return tab.get(path).status_code
    finally:
        connections.close_all()  # this thread's, before the test database goes


@pytest.mark.django_db(transaction=True)  # the requests run on threads of their own
def test_an_accounts_requests_take_turns_and_another_accounts_are_not_held(
    settings: Any, held_searches: tuple[threading.Semaphore, threading.Event],
) -> None:
    """While one of vic's searches runs, vic's next one waits for its turn (it has not
    started), and ann's request is answered meanwhile; once the first ends, the second
    runs."""
    from concurrent.futures import ThreadPoolExecutor

    settings.USER_TURN_WAIT_SECONDS = 60
    inside, release = held_searches
    vic, ann = account("vic"), account("ann")
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(_tab, vic, "10.9.0.1", "/tasks/?q=ren")
        assert inside.acquire(timeout=60)
        second = pool.submit(_tab, vic, "10.9.0.2", "/tasks/?q=inv")
        assert not inside.acquire(timeout=1)  # waiting for vic's turn, not searching
        assert not second.done()
        assert bearer(ann, "10.9.0.3").get("/api/sessions").status_code == 200
        release.set()
        assert inside.acquire(timeout=60)  # its turn came
        assert (first.result(timeout=60), second.result(timeout=60)) == (200, 200)
    assert turns.account_turns.waiting(vic.pk) == 0


@pytest.mark.django_db(transaction=True)
def test_a_request_whose_turn_does_not_come_is_answered_429_and_runs_nothing(
    settings: Any, held_searches: tuple[threading.Semaphore, threading.Event],
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    settings.USER_TURN_WAIT_SECONDS = 0.3
    settings.USER_REQUESTS_PER_SECOND = 0  # the turns alone
    inside, release = held_searches
    vic = account("vic")
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(_tab, vic, "10.10.0.1", "/tasks/?q=ren")
        assert inside.acquire(timeout=60)
        tab = Client(REMOTE_ADDR="10.10.0.2")
        tab.force_login(vic)
        refused = tab.get("/tasks/?q=inv")
        by_token = bearer(vic, "10.10.0.3").get("/api/sessions")
        release.set()
        assert first.result(timeout=60) == 200
    assert refused.status_code == 429 and refused["Retry-After"] == "1"
    assert b"other requests are still running (USER_TURN_WAIT_SECONDS)" in refused.content
    assert by_token.status_code == 429
    assert "USER_TURN_WAIT_SECONDS" in by_token.json()["detail"]
    assert not inside.acquire(timeout=0.1)  # the refused search never ran
    assert tab.get("/tasks/?q=inv").status_code == 200  # the turn is free again


@pytest.mark.django_db(transaction=True)
def test_a_long_poll_waiting_for_news_does_not_hold_its_accounts_turn(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from concurrent.futures import ThreadPoolExecutor
    from contextlib import asynccontextmanager

    from django.db import connections

    settings.USER_TURN_WAIT_SECONDS = 60
    vic = account("vic")
    quiet = quiet_session()
    waits = threading.Event()
    wait_for_news = rates.Meter.waiting

    @asynccontextmanager
    async def told(meter: rates.Meter) -> Any:
        async with wait_for_news(meter):
            waits.set()
            yield

    monkeypatch.setattr(rates.Meter, "waiting", told)

    def poll() -> int:
        try:
            return bearer(vic, "10.11.0.1").get(
                f"/api/sessions/{quiet}/changes?after=0&wait=5").status_code
        finally:
            connections.close_all()

    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(poll)
        # The poll took its turn and gave it up to wait for news: vic's next request is
        # answered before the poll's five seconds are over.
        assert waits.wait(timeout=30)
        assert bearer(vic, "10.11.0.2").get("/api/sessions").status_code == 200
        assert not waiting.done()
        assert waiting.result(timeout=60) == 200
