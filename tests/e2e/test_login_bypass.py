"""The login throttle against the web role as deployed (``controlplane.process.entrypoint``
web: Daphne with production settings), driven the way a guesser would get around it: a fresh
``X-Forwarded-For`` with every try, the username in its Unicode compatibility forms
(``ｏｌｇａ``, ``𝐨𝐥𝐠𝐚``, ``𝕠𝕝𝕘𝕒`` all log in as ``olga``), and the admin's login
beside the dashboard's. Each try counts, and the guesser is refused at the limit, the
right password included."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.contrib.auth.models import Group, User

from .logins import log_in
from .server import web_role

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

PER_ACCOUNT, PER_ADDRESS = 3, 5
LIMITS = {"LOGIN_FAILURES_PER_ACCOUNT": str(PER_ACCOUNT),
          "LOGIN_FAILURES_PER_ADDRESS": str(PER_ADDRESS), "LOGIN_THROTTLE_SECONDS": "600"}
FORMS = ["ｏｌｇａ", "𝐨𝐥𝐠𝐚", "𝕠𝕝𝕘𝕒", "ⓞⓛⓖⓐ", "ᵒˡᵍᵃ"]


def account(name: str, **extra: bool) -> None:
    user = User.objects.create_user(name, password="right-pw", **extra)
    user.groups.add(Group.objects.get_or_create(name="operator")[0])


def test_new_forwarded_addresses_and_unicode_forms_of_the_name_share_one_budget(
    tmp_path: Path,
) -> None:
    account("olga", is_staff=True)
    with web_role(tmp_path, **LIMITS) as base:
        # No proxy is trusted: each try names another client address, and the peer's
        # address is counted all the same. Each try names olga in another form.
        tries = [log_in(base, name, "guess", f"203.0.113.{n}, 198.51.100.{n}",
                        path="/admin/login/" if n == 1 else "/accounts/login/")
                 for n, name in enumerate(FORMS[:PER_ACCOUNT])]
        assert tries == ["refused"] * PER_ACCOUNT
        for n, name in enumerate(["olga", *FORMS], start=10):
            assert log_in(base, name, "right-pw", f"203.0.113.{n}") == "throttled", name
        assert log_in(base, "olga", "right-pw", "203.0.113.99", path="/admin/login/") == (
            "throttled")


def test_a_trusted_proxy_tells_the_address_and_only_its_own_entry_is_believed(
    tmp_path: Path,
) -> None:
    for name in ("vic", *(f"guess{n}" for n in range(PER_ADDRESS))):
        account(name)
    # 127.0.0.1 plays nginx here; the client puts whatever it likes before nginx's entry
    # (what `$proxy_add_x_forwarded_for` would pass on).
    with web_role(tmp_path, DJANGO_TRUSTED_PROXIES="127.0.0.1", **LIMITS) as base:
        for n in range(PER_ADDRESS):
            assert log_in(base, f"guess{n}", "guess", f"10.{n}.0.1, 192.0.2.7") == "refused"
        assert log_in(base, "vic", "right-pw", "10.9.9.9, 192.0.2.7") == "throttled"
        assert log_in(base, "vic", "right-pw", "192.0.2.7", path="/admin/login/") == (
            "throttled")
        # Another client behind the same proxy is not held up by the first.
        assert log_in(base, "vic", "right-pw", "192.0.2.8") == "in"
