"""API tokens you can manage (issue 15, point 5): list and revoke (API and shell), an
optional expiry, and a revoked or expired token authenticates nothing."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import CommandError, call_command
from django.test import Client
from django.utils import timezone

from controlplane.access import issue_token
from controlplane.errors import Invalid
from controlplane.models import ApiToken

pytestmark = pytest.mark.django_db


def account(name: str, group: str) -> User:
    user = User.objects.create_user(name)
    user.groups.add(Group.objects.get_or_create(name=group)[0])
    return user


def bearer(key: str) -> Client:
    return Client(headers={"Authorization": f"Bearer {key}"})


def test_an_operator_lists_and_revokes_their_own_tokens_and_no_one_elses() -> None:
    olga, vic = account("olga", "operator"), account("vic", "viewer")
    ci = issue_token(olga, "ci")
    old = issue_token(olga, "old", timezone.now() - timedelta(seconds=1))
    theirs = issue_token(vic, "vic's")
    client = bearer(ci)

    listed = client.get("/api/tokens").json()
    assert [(t["name"], t["state"]) for t in listed] == [("old", "expired"), ("ci", "active")]
    assert all(set(t) == {"id", "name", "created_at", "last_used_at", "expires_at",
                          "revoked_at", "state", "issued_by", "revoked_by"}
               for t in listed)  # never the key or digest
    assert ci not in str(listed)

    vic_token = ApiToken.objects.get(user=vic).pk
    assert client.post(f"/api/tokens/{vic_token}/revoke").status_code == 404
    assert bearer(theirs).get("/api/sessions").status_code == 200

    ci_id = next(t["id"] for t in listed if t["name"] == "ci")
    revoked = client.post(f"/api/tokens/{ci_id}/revoke")
    assert revoked.status_code == 200 and revoked.json()["state"] == "revoked"
    assert client.get("/api/tokens").status_code == 401  # it was the one it used
    assert bearer(old).get("/api/sessions").status_code == 401  # expired

    # A browser session revokes too, and revoking again changes nothing.
    browser = Client()
    browser.force_login(olga)
    again = browser.post(f"/api/tokens/{ci_id}/revoke")
    assert again.status_code == 200 and again.json()["revoked_at"] == revoked.json()["revoked_at"]
    assert browser.post("/api/tokens/99999999999999999999/revoke").status_code == 422


def test_a_viewer_may_revoke_their_own_leaked_token() -> None:
    vic = account("vic", "viewer")
    key = issue_token(vic, "laptop")
    token_id = ApiToken.objects.get(user=vic).pk
    assert bearer(key).post(f"/api/tokens/{token_id}/revoke").status_code == 200
    assert bearer(key).get("/api/sessions").status_code == 401


def test_the_shell_issues_lists_and_revokes_tokens() -> None:
    account("olga", "operator")
    out = StringIO()
    call_command("api_token", "olga", "--name", "ci", "--expires-in-days", "30", stdout=out)
    key = out.getvalue().strip()
    assert key.startswith("dcp_") and bearer(key).get("/api/sessions").status_code == 200
    token = ApiToken.objects.get()
    assert token.expires_at is not None
    assert timedelta(days=29) < token.expires_at - timezone.now() <= timedelta(days=30)

    listing = StringIO()
    call_command("api_token", "--list", stdout=listing)
    assert f"{token.pk}\tolga\tci\tactive" in listing.getvalue() and key not in listing.getvalue()

    call_command("api_token", "--revoke", str(token.pk), stdout=StringIO())
    assert bearer(key).get("/api/sessions").status_code == 401
    listing = StringIO()
    call_command("api_token", "--list", "olga", stdout=listing)
    assert "\trevoked\t" in listing.getvalue()
    with pytest.raises(CommandError, match="no token 424242"):
        call_command("api_token", "--revoke", "424242")
    with pytest.raises(CommandError, match="above 0"):
        call_command("api_token", "olga", "--expires-in-days", "0")


def test_the_shell_lists_a_name_stored_before_names_were_checked_on_one_line() -> None:
    """A name holding a tab, a line break or another control character (stored before
    names were checked) is listed escaped, so each token stays one line of its fields."""
    olga = account("olga", "operator")
    digests = iter(["a" * 64, "b" * 64])
    for name in ["ci\tbot\nrevoked\x1b[2J\u2028", "back\\slash"]:
        ApiToken.objects.create(user=olga, name=name, digest=next(digests))
    listing = StringIO()
    call_command("api_token", "--list", stdout=listing)
    lines = listing.getvalue().splitlines()
    assert len(lines) == 2
    assert sorted(line.split("\t")[2] for line in lines) == [
        "back\\\\slash", "ci\\tbot\\nrevoked\\x1b[2J\\u2028"]


@pytest.mark.parametrize("name", ["", "   ", "ci\tbot", "ci\nbot", "ci\x1b[2J", "ci\u2028bot"])
def test_the_shell_refuses_a_token_name_that_is_blank_or_breaks_the_listing(name: str) -> None:
    """``--list`` prints a token a line, its fields between tabs: a name that is blank, or
    holds a tab, a line break or another control character, is refused in one line naming
    the argument, and no token is issued."""
    olga = account("olga", "operator")
    with pytest.raises(CommandError, match=r"^--name: ") as refused:
        call_command("api_token", "olga", "--name", name, stdout=StringIO())
    assert "\n" not in str(refused.value)
    with pytest.raises(Invalid, match="token's name"):
        issue_token(olga, name)
    assert not ApiToken.objects.exists()


def test_issuing_and_revoking_a_token_records_who_did_it(caplog: pytest.LogCaptureFixture
                                                         ) -> None:
    import getpass

    olga = account("olga", "operator")
    caplog.set_level("INFO", logger="controlplane.audit")
    out = StringIO()
    call_command("api_token", "olga", "--name", "ci", stdout=out)
    key = out.getvalue().strip()
    token = ApiToken.objects.get(user=olga)
    shell = f"shell:{getpass.getuser()}"
    assert token.issued_by == shell
    assert f"API token 'ci' (#{token.pk}) of olga issued by {shell}" in caplog.text
    listed = bearer(key).get("/api/tokens").json()
    assert listed[0]["issued_by"] == shell and listed[0]["revoked_by"] == ""
    revoked = bearer(key).post(f"/api/tokens/{token.pk}/revoke").json()
    assert revoked["revoked_by"] == "user:olga"
    assert f"API token 'ci' (#{token.pk}) of olga revoked by user:olga" in caplog.text
    # A second revocation keeps the first's name, and logs nothing new.
    other = ApiToken.objects.create(user=olga, name="old", digest="1" * 64)
    call_command("api_token", "--revoke", str(other.pk), str(token.pk), stdout=StringIO())
    assert ApiToken.objects.get(pk=token.pk).revoked_by == "user:olga"
    assert ApiToken.objects.get(pk=other.pk).revoked_by == shell
    assert caplog.text.count("revoked by") == 2


def test_the_shell_revokes_for_a_named_user_only_that_users_tokens() -> None:
    olga, vic = account("olga", "operator"), account("vic", "viewer")
    issue_token(olga, "ci")
    issue_token(vic, "laptop")
    olgas, vics = (ApiToken.objects.get(user=u).pk for u in (olga, vic))
    with pytest.raises(CommandError, match=f"no token {vics} of olga: none revoked"):
        call_command("api_token", "olga", "--revoke", str(olgas), str(vics), stdout=StringIO())
    assert not ApiToken.objects.filter(revoked_at__isnull=False).exists()
    with pytest.raises(CommandError, match="no user 'nobody'"):
        call_command("api_token", "nobody", "--revoke", str(olgas), stdout=StringIO())
    assert not ApiToken.objects.filter(revoked_at__isnull=False).exists()

    out = StringIO()
    call_command("api_token", "olga", "--revoke", str(olgas), stdout=out)
    assert f"{olgas}\tolga\tci\trevoked" in out.getvalue()
    assert list(ApiToken.objects.filter(revoked_at__isnull=False).values_list("pk", flat=True)) \
        == [olgas]
