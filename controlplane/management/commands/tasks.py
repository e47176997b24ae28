"""Operator views of tasks: what is stuck or blocked, and one task's history."""

from __future__ import annotations

import json
from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db.models import Q
from django.utils import timezone

from controlplane import models
from controlplane.execution import runtime


class Command(BaseCommand):
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
            self.stuck(float(options["older_than"]))  # type: ignore[arg-type]

    def stuck(self, older_than: float) -> None:
        now = timezone.now()
        cutoff = now - timedelta(seconds=older_than)
        rows = models.Task.objects.filter(
            Q(status="running", lease_until__lt=now)
            | Q(status="sleeping", wake_at__lt=cutoff)
            | Q(status="waiting", wait__has_key="signal")
            | Q(status="pending", id__in=models.Dispatch.objects.filter(
                not_before__lt=cutoff).values("task_id"))
        ).order_by("session_id", "created_seq")
        kernel = runtime().kernel
        blocked = {
            task.id: reason
            for session_id in rows.values_list("session_id", flat=True).distinct()
            for task, reason in kernel.blocked(session_id)
        }
        lines = []
        for row in rows:
            why = {
                "running": f"lease of {row.lease_owner} expired {row.lease_until:%H:%M:%S}",
                "sleeping": f"overdue since {row.wake_at:%H:%M:%S}" if row.wake_at else "",
                "waiting": f"waiting for {(row.wait or {}).get('signal')}",
                "pending": "not picked up",
            }[row.status]
            if row.id in blocked:
                why = f"blocked: {blocked.pop(row.id)}"
            lines.append(f"{row.id}  {row.kind:<12} {row.status:<9} {row.phase:<10} {why}")
        if not lines:
            self.stdout.write("nothing stuck")
        for line in lines:
            self.stdout.write(line)

    def show(self, task_id: str) -> None:
        task = runtime().kernel.storage.task(task_id)
        if task is None:
            raise CommandError(f"no task {task_id}")
        self.stdout.write(f"task {task.id} ({task.kind} v{task.version}) in {task.session_id}")
        self.stdout.write(f"status {task.status}, phase {task.phase}, restarts {task.restarts}, "
                          f"epoch {task.epoch}, lease {task.lease_owner or '-'}")
        for label, value in (("input", task.input), ("checkpoint", task.checkpoint),
                             ("wait", task.wait), ("cancel", task.cancel),
                             ("outcome", task.outcome)):
            if value:
                self.stdout.write(f"{label}: {json.dumps(value, sort_keys=True)}")
        self.stdout.write("history:")
        commits = models.Commit.objects.filter(
            session_id=task.session_id, summary__contains=[{"id": task_id}]
        ).order_by("seq")
        for commit in commits:
            for item in commit.summary:
                if item.get("id") == task_id:
                    outcome = f" -> {item['outcome']}" if "outcome" in item else ""
                    self.stdout.write(
                        f"  #{commit.seq} {commit.at:%H:%M:%S.%f} {commit.actor:<24} "
                        f"{item['status']:<10} {item['phase']}{outcome}"
                    )
