"""Start a batch of notices: ``manage.py send_notices a@x b@y --subject S --body B``."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.management.base import CommandError, CommandParser
from django.core.validators import validate_email

from controlplane import commands
from controlplane.access import shell_actor
from controlplane.management.base import ShellCommand
from kernel import UnknownRecord


def _is_address(text: str) -> bool:
    # validate_email takes control characters inside a quoted local part ("a\x07"@b):
    # valid in the RFC, but not what anyone means to send a notice to.
    if not text.isprintable():
        return False
    try:
        validate_email(text)
    except ValidationError:
        return False
    return True


class Command(ShellCommand):
    help = "Start a send-batch task that emails one notice to each recipient."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("recipients", nargs="+", help="email addresses")
        parser.add_argument("--subject", default="Service notice",
                            help="the notice's subject line")
        parser.add_argument("--body", default="Please read the approved notice.",
                            help="the notice's text")
        parser.add_argument("--channel", choices=["http", "smtp"], default="http",
                            help="send through the email provider's HTTP API or by SMTP")
        parser.add_argument("--session", help="add to this session instead of a new one")
        parser.add_argument(
            "--actor", default=None,
            help="who asked, recorded in the commit (default: the shell user, shell:NAME)")

    def handle(self, *args: object, **options: object) -> None:
        recipients = [str(r) for r in options["recipients"]]  # type: ignore[attr-defined]
        bad = [r for r in recipients if not _is_address(r)]
        if bad:
            # Quoted: an address may hold a newline or another control character.
            raise CommandError(f"not email addresses: {', '.join(map(repr, bad))}")
        try:
            session_id, task_id = commands.start_task(
                str(options["actor"] or shell_actor()),
                "send-batch",
                {
                    "recipients": recipients,
                    "subject": options["subject"],
                    "body": options["body"],
                    "channel": options["channel"],
                },
                str(options["session"]) if options["session"] else None,
                title=f"notices to {len(recipients)}",
            )
        except UnknownRecord as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"session {session_id}\ntask {task_id}")
