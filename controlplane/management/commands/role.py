"""Roles from the shell: ``manage.py role olga operator`` (or ``viewer``, or ``none``), and
``manage.py role --list``. The admin is read-only, accounts included, so this is where a
role is given or taken; each change is logged with who ran it (``controlplane.audit``).
An account that loses its role has its open sockets closed within
``WEBSOCKET_RECHECK_SECONDS`` (4403)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import Group, User
from django.core.management.base import CommandError, CommandParser

from controlplane.access import OPERATOR, VIEWER, audit, role_of, shell_actor
from controlplane.management.base import ShellCommand

ROLES = (VIEWER, OPERATOR)


class Command(ShellCommand):
    help = "Give an account a role (viewer or operator), take it away (none), or list them."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username", nargs="?", help="the account whose role to set")
        parser.add_argument("role", nargs="?", choices=[*ROLES, "none"],
                            help="viewer (reads), operator (reads and acts), none (neither)")
        parser.add_argument("--list", action="store_true", help="every account and its role")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["list"]:
            for user in User.objects.order_by("username"):
                self.stdout.write(f"{user.username}\t{role_of(user) or '-'}"
                                  + ("\tsuperuser" if user.is_superuser else ""))
            return
        username, role = options["username"], options["role"]
        if not username or not role:
            raise CommandError("usage: manage.py role USERNAME viewer|operator|none (or --list)")
        user = User.objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"no user {username!r} (make one: manage.py createsuperuser, "
                               "or User.objects.create_user in manage.py shell)")
        before = role_of(user)
        user.groups.remove(*Group.objects.filter(name__in=ROLES))
        if role != "none":
            user.groups.add(Group.objects.get_or_create(name=role)[0])
        after = role_of(user)
        who = shell_actor()
        audit.info("role of %s: %s -> %s, by %s", username, before or "none", after or "none",
                   who, extra={"user": username, "before": before, "after": after, "by": who})
        self.stdout.write(f"{username}: {after or 'no role'}"
                          + (" (a superuser acts whatever its groups)" if user.is_superuser
                             else ""))
