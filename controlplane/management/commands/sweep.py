"""Run the dispatch sweep once: what beat does every second."""

from __future__ import annotations

from controlplane.management.base import ShellCommand
from controlplane.worker.runtime import runtime


class Command(ShellCommand):
    help = "Re-deliver due and lost dispatches and expired leases once, then exit."

    def handle(self, *args: object, **options: object) -> None:
        report = runtime().dispatcher.sweep()
        self.stdout.write(f"delivered {report.delivered}, failed {report.failed}")
