"""Prepare the demo: an operator account, the five-email batch of the seed, and (when
the demo's Pydantic AI agent is registered, as ``make demo`` does) a session that it
answers.

The demo accounts have a role but no staff rights: the admin (``/admin/``) is for staff
accounts made with ``manage.py createsuperuser``, never for a known demo password."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.models import Group, Permission, User
from django.core.management import call_command
from django.core.management.base import CommandError, CommandParser

from controlplane import commands
from controlplane.management.base import ShellCommand
from kernel.agent import WhenBusy

RECIPIENTS = [f"{name}@example.com" for name in ("ana", "ben", "cai", "dee", "eve")]
DEMO_AGENT = "helpdesk"
"""``KERNEL_AGENTS`` name of the demo's Pydantic AI agent (kernel.hosts.pydantic_ai.demo)."""
DEMO_REQUEST = "Please send the notice to ana@example.com."


def agent_session(operator: User) -> str | None:
    """A session whose conversation the demo agent answers, started by ``operator``;
    None when the agent is not registered."""
    if DEMO_AGENT not in settings.KERNEL_AGENTS:
        return None
    session = commands.create_session(operator, {"title": "Pydantic AI helpdesk"}, "demo")
    conversation = commands.create_conversation(operator, session.id, None, None)
    commands.submit(operator, session.id, conversation.id,
                    {"text": DEMO_REQUEST, "agent": DEMO_AGENT}, "demo-helpdesk",
                    WhenBusy.FOLLOW_UP)
    return session.id


def demo_accounts(password: str) -> None:
    """``operator`` (with ``password``) and ``viewer`` / ``viewer``: roles, no staff rights."""
    can_view = Permission.objects.filter(
        content_type__app_label="controlplane", codename__startswith="view_"
    )
    for name in ("operator", "viewer"):
        group, _ = Group.objects.get_or_create(name=name)
        group.permissions.add(*can_view)
        user, created = User.objects.get_or_create(username=name)
        if created:
            user.set_password(password if name == "operator" else "viewer")
        user.is_staff = False  # never staff, even an account an earlier demo made staff
        user.save()
        user.groups.add(group)


class Command(ShellCommand):
    help = "Create the demo operator (and viewer) and seed the five-email notice batch."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--url", default="http://127.0.0.1:8000/", help="printed for you")
        parser.add_argument("--password", default="operator", help="demo operator password")
        parser.add_argument(
            "--force", action="store_true",
            help="make the demo accounts without DJANGO_DEBUG=1 (a throwaway database only)")

    def handle(self, *args: object, **options: object) -> None:
        if not settings.DEBUG and not options["force"]:
            raise CommandError(
                "the demo makes accounts with known passwords (operator / operator, viewer / "
                "viewer): refused without DJANGO_DEBUG=1, which only a laptop sets. On a "
                "throwaway database, --force makes them anyway."
            )
        password = str(options["password"])
        demo_accounts(password)
        call_command("send_notices", *RECIPIENTS, actor="user:operator", stdout=self.stdout)
        helpdesk = agent_session(User.objects.get(username="operator"))
        if helpdesk is not None:
            self.stdout.write(f"  the Pydantic AI helpdesk answers in session {helpdesk}: "
                              "approve its notice on the session page\n")
        self.stdout.write(
            f"\n  demo ready: {options['url']}\n"
            f"  login: operator / {password}   (read-only: viewer / viewer)\n"
            "  watch the batch: DJANGO_DEBUG=1 .venv/bin/python manage.py tasks\n"
        )
