"""API tokens from the shell: issue, list, revoke.

``manage.py api_token olga --name ci [--expires-in-days 90]`` issues one (the key is
printed once; only its digest is stored); ``manage.py api_token --list [olga]`` lists
tokens (never keys); ``manage.py api_token [olga] --revoke ID [ID ...]`` revokes tokens
(with a user named, only theirs), and sockets opened with them close within
``WEBSOCKET_RECHECK_SECONDS``.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth.models import User
from django.core.management.base import CommandError, CommandParser
from django.utils import timezone

from controlplane import commands
from controlplane.access import issue_token, listed_name, role_of, shell_actor, token_name
from controlplane.errors import Invalid
from controlplane.management.base import ShellCommand
from controlplane.reads.tokens import TokenView, tokens
from kernel import UnknownRecord


def _when(at: datetime | None) -> str:
    return at.isoformat(timespec="seconds") if at is not None else "-"


def line(token: TokenView) -> str:
    return (f"{token.id}\t{token.user}\t{listed_name(token.name)}\t{token.state}\tcreated "
            f"{_when(token.created_at)}\tlast used {_when(token.last_used_at)}\t"
            f"expires {_when(token.expires_at)}\tissued by {token.issued_by or '-'}"
            + (f"\trevoked by {token.revoked_by or '-'}" if token.revoked_at else ""))


class Command(ShellCommand):
    help = "Issue a bearer token for a user (shown once), or list or revoke tokens."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username", nargs="?",
                            help="the account to issue a token for (with --list: whose to list; "
                                 "with --revoke: whose tokens the ids must be)")
        parser.add_argument("--name", default="cli", help="what the token is for")
        parser.add_argument("--expires-in-days", type=float, default=None,
                            help="the token stops working after this many days (default never)")
        parser.add_argument("--list", action="store_true",
                            help="list tokens (the user's, or everyone's)")
        parser.add_argument("--revoke", type=int, nargs="+", metavar="ID",
                            help="revoke these tokens (ids from --list)")

    def handle(self, *args: Any, **options: Any) -> None:
        username = options["username"]
        if options["list"]:
            if username and not User.objects.filter(username=str(username)).exists():
                raise CommandError(f"no user {username!r}")
            for token in tokens(username=str(username) if username else None):
                self.stdout.write(line(token))
            return
        if options["revoke"]:
            if username and not User.objects.filter(username=str(username)).exists():
                raise CommandError(f"no user {username!r}: none revoked")
            try:
                revoked = commands.revoke_tokens(
                    options["revoke"], by=shell_actor(),
                    username=str(username) if username else None)
            except UnknownRecord as exc:
                raise CommandError(f"{exc}: none revoked") from None
            for token in revoked:
                self.stdout.write(line(token))
            return
        if not username:
            raise CommandError("name the user to issue a token for (or --list / --revoke)")
        try:
            token_name(str(options["name"]))
        except Invalid as exc:
            raise CommandError(f"--name: {exc}") from None
        user = User.objects.filter(username=str(username)).first()
        if user is None:
            raise CommandError(f"no user {username!r}")
        if role_of(user) is None:
            raise CommandError(
                f"{user.username} has no role: add them to the 'viewer' or 'operator' group"
            )
        days = options["expires_in_days"]
        if days is not None and not 0 < days <= 3650:
            raise CommandError("--expires-in-days must be above 0 and at most 3650")
        expires = timezone.now() + timedelta(days=days) if days is not None else None
        self.stdout.write(issue_token(user, str(options["name"]), expires,
                                      issued_by=shell_actor()))
