"""Retention: remove the history of finished sessions past the policy (what beat runs daily)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from controlplane import commands
from controlplane.errors import ControlPlaneError
from controlplane.management.base import ShellCommand


class Command(ShellCommand):
    help = (
        "Make the commit log's partitions ahead, then remove the commits, entries and old "
        "document versions of finished sessions older than the retention policy "
        "(KERNEL_RETENTION_DAYS, KERNEL_RETENTION_DAYS_BY_STATUS, a session's "
        "metadata retention_days). Never touches a session with an unfinished task or an "
        "unsettled submission."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--dry-run", action="store_true", help="count what would be removed; change nothing"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        # The progress lines end with the summary.
        try:
            commands.prune(
                dry_run=options["dry_run"], progress=lambda line: self.stdout.write(line)
            )
        except ControlPlaneError as exc:
            raise CommandError(str(exc)) from exc
