"""Issue an API token for a user: ``manage.py api_token olga --name ci``."""

from __future__ import annotations

from django.contrib.auth.models import User
from django.core.management.base import BaseCommand, CommandError, CommandParser

from controlplane.access import issue_token, role_of


class Command(BaseCommand):
    help = "Create a bearer token for a user (shown once; only its digest is stored)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--name", default="cli", help="what the token is for")

    def handle(self, *args: object, **options: object) -> None:
        user = User.objects.filter(username=str(options["username"])).first()
        if user is None:
            raise CommandError(f"no user {options['username']!r}")
        if role_of(user) is None:
            raise CommandError(
                f"{user.username} has no role: add them to the 'viewer' or 'operator' group"
            )
        key = issue_token(user, str(options["name"]))
        self.stdout.write(key)
