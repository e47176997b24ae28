"""Send-batch tasks the browser tests start, each in a session of its own."""

from __future__ import annotations

from controlplane.worker.runtime import runtime
from kernel import Draft


def send_batch(subject: str, channel: str) -> str:
    """A session with one send-batch; an unknown channel makes it fail in its plan."""
    handle = runtime().kernel.create_session(metadata={"title": subject})
    draft = Draft(actor="user:test")
    task_id = draft.create_task("send-batch", {"recipients": ["ana@example.com"],
                                               "subject": subject, "body": "b",
                                               "channel": channel})
    handle.commit(draft)
    return task_id
