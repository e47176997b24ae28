"""The due channel: what a commit announces to listening workers, the tasks it made due.

A commit that takes a task's dispatch row to deliver it at once (``Dispatcher.attach``:
the row is written taken, not marked for a burst) also NOTIFYs :data:`CHANNEL` with the task's queue
and id. Postgres delivers the notification when the transaction commits, before the
committer's broker message is even sent, so an idle worker that LISTENs
(:mod:`controlplane.worker.announcements`) can claim the task at once. The notification is
only a
head start: the message and the sweep deliver as they always did, and the claim
decides.

The payload is one ``queue<TAB>task id`` line per task; a commit sends one notification
(a burst's rows go to queue messages instead, and are never announced), of the lines that
fit in a payload Postgres sends (:data:`MOST_BYTES`): the tasks of the others wait for
their messages.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from kernel.dispatch import announced_row
from kernel.records import Dispatch

CHANNEL = "kernel_due"
NOTIFY = "SELECT pg_notify(%s, %s)"
# The announcement of a commit that went without it (another commit of the process was
# announcing), sent right after that commit in a transaction of its own. It need not
# wait for the log flush: it writes nothing a crash must keep, and a lost announcement
# leaves the task to its message. So it holds Postgres's notify lock only for a moment.
NOTIFY_UNFLUSHED = (
    "SELECT pg_notify(%s, %s) FROM (SELECT set_config('synchronous_commit', 'off', true)) "
    "AS unflushed"
)
LISTEN = f"LISTEN {CHANNEL}"
MOST_BYTES = 7999
"""The longest payload Postgres takes: a longer one fails the statement that sends it, and
so the commit that carries it."""


def payload(dispatches: Iterable[Dispatch]) -> str | None:
    """The announcement for a commit's dispatch rows: those taken for a message each, as
    many as fit in :data:`MOST_BYTES`. ``None`` if there are none (nothing to notify)."""
    lines: list[str] = []
    size = -1  # no line break before the first line
    for row in dispatches:
        if not announced_row(row):
            continue
        line = f"{row.queue}\t{row.task_id}"
        size += len(line.encode()) + 1
        if size > MOST_BYTES:
            break
        lines.append(line)
    return "\n".join(lines) if lines else None


def parse(text: str) -> Iterator[tuple[str, str]]:
    """``(queue, task id)`` of each line of a payload; lines not in that shape (another
    sender on the channel) are skipped."""
    for line in text.splitlines():
        queue, sep, task_id = line.partition("\t")
        if sep and queue and task_id:
            yield queue, task_id
