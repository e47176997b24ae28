"""Login throttling (issue 15, point 3): the dashboard's and the admin's login, by account
and by address, with a clear message; the right password works again after the window."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client

pytestmark = pytest.mark.django_db

THROTTLED = "Too many failed logins for this account or from this address"
WRONG = "Please enter a correct username and password"


@pytest.fixture(autouse=True)
def quick(settings: Any) -> None:
    settings.LOGIN_FAILURES_PER_ACCOUNT = 3
    settings.LOGIN_FAILURES_PER_ADDRESS = 5
    settings.LOGIN_THROTTLE_SECONDS = 3
    # Each login hashes a password: fast, so that the window is not spent hashing.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def account(name: str, **extra: Any) -> User:
    user = User.objects.create_user(name, password="right-pw", **extra)
    user.groups.add(Group.objects.get_or_create(name="operator")[0])
    return user


def log_in(name: str, password: str, address: str = "10.0.0.1", url: str = "/accounts/login/"
           ) -> Any:
    return Client(REMOTE_ADDR=address).post(url, {"username": name, "password": password})


def test_repeated_wrong_passwords_are_throttled_then_the_right_one_works_after_the_window(
) -> None:
    account("olga")
    for _ in range(3):
        assert WRONG in log_in("olga", "guess").content.decode()
    refused = log_in("olga", "right-pw")
    assert refused.status_code == 200 and THROTTLED in refused.content.decode()
    assert re.search(r"try again in [123] seconds\.", refused.content.decode())
    # By account: another address is refused too.
    assert THROTTLED in log_in("OLGA", "right-pw", address="10.9.9.9").content.decode()
    time.sleep(3.1)
    welcome = log_in("olga", "right-pw")
    assert welcome.status_code == 302 and welcome.url == "/"


def test_guessing_across_accounts_from_one_address_is_throttled() -> None:
    account("vic")
    for name in ("a", "b", "c", "d", "e"):
        log_in(name, "guess", address="10.6.6.6")
    assert THROTTLED in log_in("vic", "right-pw", address="10.6.6.6").content.decode()
    assert log_in("vic", "right-pw", address="10.0.0.2").status_code == 302


def test_a_good_login_forgives_the_accounts_earlier_failures() -> None:
    account("olga")
    for _ in range(2):
        log_in("olga", "guess")
    assert log_in("olga", "right-pw").status_code == 302
    for _ in range(2):
        log_in("olga", "guess")
    assert log_in("olga", "right-pw").status_code == 302


def test_the_admin_login_is_throttled_the_same_way() -> None:
    account("root", is_staff=True, is_superuser=True)
    admin = "/admin/login/"
    for _ in range(3):
        assert log_in("root", "guess", url=admin).status_code == 200
    refused = log_in("root", "right-pw", url=admin)
    assert THROTTLED in refused.content.decode()
    time.sleep(3.1)
    assert log_in("root", "right-pw", url=admin).status_code == 302
