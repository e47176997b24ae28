"""Accounts, and test clients logged in as them, that call the API and the pages; and a JSON
post. ``client_for`` and ``login`` make a new account on each call (a second call with the
same name fails); ``client_as`` and ``login_as`` make it on the first call and log in as
it again on the next."""

from __future__ import annotations

import json
from typing import Any

from django.contrib.auth.models import Group, User
from django.test import Client


def user(name: str, group: str | None) -> User:
    account = User.objects.create_user(name)  # force_login: no password hashing needed
    if group:
        account.groups.add(Group.objects.get_or_create(name=group)[0])
    return account


def user_in(group: str | None, name: str = "vera") -> User:
    user = User.objects.create_user(name)  # no password: hashing one costs a second
    if group is not None:
        user.groups.add(Group.objects.get_or_create(name=group)[0])
    return user


def client_for(name: str, group: str | None) -> Client:
    client = Client()
    client.force_login(user(name, group))
    return client


def client_as(name: str, group: str) -> Client:
    """A logged-in client of ``name`` in ``group`` (made on first use)."""
    account, _ = User.objects.get_or_create(username=name)
    account.groups.add(Group.objects.get_or_create(name=group)[0])
    client = Client()
    client.force_login(account)
    return client


def login(role: str) -> Client:
    """A new ``{role}-user`` with a password, logged in on a client that checks CSRF tokens
    as a browser's requests are checked."""
    user = User.objects.create_user(f"{role}-user", password="pw")
    user.groups.add(Group.objects.get_or_create(name=role)[0])
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    return client


def login_as(role: str) -> Client:
    """``{role}-user`` (made on first use), logged in on a client that skips CSRF checks."""
    user = User.objects.filter(username=f"{role}-user").first() or User.objects.create_user(
        f"{role}-user", password="pw")
    user.groups.add(Group.objects.get_or_create(name=role)[0])
    client = Client()
    client.force_login(user)
    return client


def post(client: Client, url: str, body: dict[str, Any]) -> Any:
    return client.post(url, json.dumps(body), content_type="application/json")
