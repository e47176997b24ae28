"""Prepare the demo: an operator account and the five-email batch of the seed."""

from __future__ import annotations

from django.contrib.auth.models import Group, Permission, User
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser

RECIPIENTS = [f"{name}@example.com" for name in ("ana", "ben", "cai", "dee", "eve")]


class Command(BaseCommand):
    help = "Create the demo operator (and viewer) and seed the five-email notice batch."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--url", default="http://127.0.0.1:8000/", help="printed for you")
        parser.add_argument("--password", default="operator", help="demo operator password")

    def handle(self, *args: object, **options: object) -> None:
        password = str(options["password"])
        can_view = Permission.objects.filter(
            content_type__app_label="controlplane", codename__startswith="view_"
        )
        for name in ("operator", "viewer"):
            group, _ = Group.objects.get_or_create(name=name)
            group.permissions.add(*can_view)
            user, created = User.objects.get_or_create(username=name, defaults={"is_staff": True})
            if created:
                user.set_password(password if name == "operator" else "viewer")
                user.save()
            user.groups.add(group)
        call_command("send_notices", *RECIPIENTS, actor="user:operator", stdout=self.stdout)
        self.stdout.write(
            f"\n  demo ready: {options['url']}  (dashboard; the read-only admin at /admin/)\n"
            f"  login: operator / {password}   (read-only: viewer / viewer)\n"
            "  watch the batch: .venv/bin/python manage.py tasks\n"
        )
