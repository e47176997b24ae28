"""Operator views of tasks: what is stuck or blocked, and one task's history."""

from __future__ import annotations

import json
import math
from datetime import timedelta

from django.core.management.base import CommandError, CommandParser

from controlplane.management.base import ShellCommand
from controlplane.process.kernel import process_kernel
from controlplane.reads import pages
from controlplane.reads import tasks as reads
from kernel import UnknownRecord

MOST_SECONDS = 10 * 365 * 24 * 3600
"""The largest ``--older-than``: further back than any task, and well inside the dates
the clock can subtract to."""


class Command(ShellCommand):
    help = (
        "List stuck tasks (expired leases, pending or overdue too long, waiting for an "
        "operator) and blocked tasks, or show one task with its phase history."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("task_id", nargs="?", help="show this task and its history")
        parser.add_argument(
            "--older-than", type=float, default=60.0, metavar="SECONDS",
            help="how long pending or overdue counts as stuck (default 60)",
        )

    def handle(self, *args: object, **options: object) -> None:
        if options["task_id"]:
            self.show(str(options["task_id"]))
        else:
            older_than = float(options["older_than"])  # type: ignore[arg-type]
            if not (math.isfinite(older_than) and 0 <= older_than <= MOST_SECONDS):
                raise CommandError(
                    f"--older-than must be a number of seconds from 0 to {MOST_SECONDS}"
                )
            self.stuck(older_than)

    def stuck(self, older_than: float) -> None:
        now = process_kernel().clock.now()  # leases and due times are the database's
        found = reads.stuck(now, now - timedelta(seconds=older_than), pages.BLOCKED_SCAN)
        if not found:
            self.stdout.write("nothing stuck")
        for task, why in found:
            self.stdout.write(
                f"{task.id}  {task.kind:<12} {task.status:<9} {task.phase:<10} {why}"
            )

    def show(self, task_id: str) -> None:
        try:
            task = reads.get(task_id).task
        except UnknownRecord as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"task {task.id} ({task.kind} v{task.version}) in {task.session_id}")
        self.stdout.write(f"status {task.status}, phase {task.phase}, run {task.run}, "
                          f"restarts {task.restarts}, epoch {task.epoch}, "
                          f"seq {task.updated_seq}, lease {task.lease_owner or '-'}")
        for label, value in (("input", task.input), ("checkpoint", task.checkpoint),
                             ("wait", task.wait), ("cancel", task.cancel),
                             ("outcome", task.outcome)):
            if value:
                self.stdout.write(f"{label}: {json.dumps(value, sort_keys=True)}")
        self.stdout.write("history:")
        steps = pages.timeline(task_id, task.session_id, task.terminal).commits
        pruned = pages.pruned_before(task.session_id, task.created_seq)
        if pruned:  # an empty or partial history says why, as the task's page does
            self.stdout.write(
                f"  Retention removed the session's history up to commit {pruned}, with "
                f"this task's commits until then{': those after it follow' if steps else ''}."
                " Its input, checkpoint and outcome above are kept.")
        for step in steps:
            self.stdout.write(
                f"  #{step.seq} {step.at:%H:%M:%S.%f} {step.actor:<24} "
                f"{step.outcome or step.status:<10} {step.phase}"
            )
