"""The control plane's commands: everything an operator or a program changes, a module
per noun (tasks, graphs, bulk actions, sessions, tokens, retention, approvals), each
action committed as :mod:`.actions` says.

Each command checks the caller's role, checks that the records allow it, and makes one
durable commit naming who acted and why (an operator action is also an entry in the
session's operations log). They raise domain errors (:mod:`controlplane.errors`, or
the kernel's ``UnknownRecord`` / ``CommitRejected``), never web types: the API, the
pages and the management commands are thin callers that translate them at their edge.

Operator actions carry a client-chosen ``action_id`` that becomes the commit's
idempotency key, so a retried request (a double click, a timeout) does nothing new and
answers with the commit that did it (``replayed``). An id means one action on one target:
duplicates are recognised by (action, target, id), and an id already used in the session
for another action or target is refused (Conflict), never answered "replayed".
"""

from __future__ import annotations

from controlplane.commands.actions import (
    ActionResult,
    Step,
)
from controlplane.commands.approvals import (
    decide_call,
)
from controlplane.commands.bulk import (
    MAX_BULK,
    BulkAction,
    BulkItem,
    BulkResult,
    bulk_act,
    bulk_preview,
    retry_all_failed,
)
from controlplane.commands.graphs import (
    fork_graph,
    resume_graph,
    start_graph,
)
from controlplane.commands.retention import (
    prune,
    retention_policy,
    sweep_artifacts,
)
from controlplane.commands.sessions import (
    BranchResult,
    branch_turn,
    compact_conversation,
    create_conversation,
    create_session,
    resubmit,
    start_task,
    submit,
)
from controlplane.commands.tasks import (
    cancel_task,
    migrate_environment,
    resolve_task,
    restart_preview,
    restart_task,
    retry_task,
    wake_task,
)
from controlplane.commands.tokens import (
    revoke_token,
    revoke_tokens,
)

__all__ = [
    "ActionResult",
    "BranchResult",
    "BulkAction",
    "BulkItem",
    "BulkResult",
    "MAX_BULK",
    "Step",
    "branch_turn",
    "bulk_act",
    "bulk_preview",
    "cancel_task",
    "compact_conversation",
    "create_conversation",
    "create_session",
    "decide_call",
    "fork_graph",
    "migrate_environment",
    "prune",
    "resolve_task",
    "restart_preview",
    "restart_task",
    "resubmit",
    "resume_graph",
    "retention_policy",
    "retry_all_failed",
    "retry_task",
    "revoke_token",
    "revoke_tokens",
    "start_graph",
    "start_task",
    "submit",
    "sweep_artifacts",
    "wake_task",
]
