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


FORMS = ["ｏｌｇａ", "𝐨𝐥𝐠𝐚", "𝕠𝕝𝕘𝕒", "𝓸𝓵𝓰𝓪", "ⓞⓛⓖⓐ", "ᵒˡᵍᵃ", "OLGA"]


def forwarded(name: str, password: str, peer: str, xff: str, url: str = "/accounts/login/"
              ) -> Any:
    return Client(REMOTE_ADDR=peer, HTTP_X_FORWARDED_FOR=xff).post(
        url, {"username": name, "password": password})


def test_every_unicode_form_of_a_name_counts_against_the_account_it_logs_in_as() -> None:
    account("olga")
    # Django authenticates the NFKC form: each of these is olga, with her password.
    assert log_in(FORMS[0], "right-pw").status_code == 302
    for n, name in enumerate(FORMS[1:4]):
        assert WRONG in log_in(name, "guess", address=f"10.1.0.{n}").content.decode()
    for n, name in enumerate(["olga", *FORMS]):
        refused = log_in(name, "right-pw", address=f"10.2.0.{n}")
        assert THROTTLED in refused.content.decode(), name


def test_the_dashboard_and_the_admin_login_share_the_count() -> None:
    account("root", is_staff=True, is_superuser=True)
    log_in("root", "guess", url="/admin/login/")
    log_in("ｒｏｏｔ", "guess")
    log_in("𝐫𝐨𝐨𝐭", "guess", url="/admin/login/")
    assert THROTTLED in log_in("root", "right-pw").content.decode()
    assert THROTTLED in log_in("root", "right-pw", url="/admin/login/").content.decode()


def test_a_forwarded_address_from_a_peer_not_trusted_is_not_believed() -> None:
    for n in range(5):
        forwarded(f"nobody{n}", "guess", "10.6.6.6", f"192.0.2.{n}")
    account("vic")
    assert THROTTLED in forwarded("vic", "right-pw", "10.6.6.6", "192.0.2.99").content.decode()


def test_a_trusted_proxy_is_believed_for_its_own_entry_only(settings: Any) -> None:
    settings.TRUSTED_PROXIES = ["10.0.0.0/30", "172.16.0.9"]
    account("vic")
    # What nginx's `$proxy_add_x_forwarded_for` passes on: the client's own list first.
    for n in range(5):
        forwarded(f"nobody{n}", "guess", "10.0.0.2", f"192.0.2.{n}, 198.51.100.7")
    refused = forwarded("vic", "right-pw", "10.0.0.1", "203.0.113.1, 198.51.100.7")
    assert THROTTLED in refused.content.decode()
    # Through two trusted proxies, the address the outer one saw.
    refused = forwarded("vic", "right-pw", "10.0.0.1", "1.2.3.4, 198.51.100.7, 172.16.0.9")
    assert THROTTLED in refused.content.decode()
    assert forwarded("vic", "right-pw", "10.0.0.1", "198.51.100.8").status_code == 302


def test_an_ipv6_client_is_counted_by_its_64_and_a_mapped_ipv4_as_itself() -> None:
    account("vic")
    for n in range(5):
        log_in(f"nobody{n}", "guess", address=f"2001:db8:1:2::{n + 1:x}")
    assert THROTTLED in log_in("vic", "right-pw", address="2001:db8:1:2:ffff::1").content.decode()
    assert log_in("vic", "right-pw", address="2001:db8:1:3::1").status_code == 302
    for n in range(5):
        log_in(f"nobody{n}", "guess", address="::ffff:10.8.8.8" if n % 2 else "10.8.8.8")
    assert THROTTLED in log_in("vic", "right-pw", address="::ffff:10.8.8.8").content.decode()


def test_failures_that_left_the_window_are_forgotten_whoever_made_them() -> None:
    from controlplane.models import LoginFailure

    for n in range(4):
        log_in(f"gone{n}", "guess", address=f"10.3.0.{n}")
    assert LoginFailure.objects.count() == 8
    time.sleep(3.1)
    log_in("someone", "guess", address="10.4.0.1")
    assert sorted(LoginFailure.objects.values_list("key", flat=True)) == [
        "addr:10.4.0.1", "user:someone"]
