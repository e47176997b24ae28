"""The durable execution kernel: sessions, commits, tasks, leases. No Django, no Celery.

See DESIGN.md. The public surface is re-exported here.
"""

from .clock import Clock, ManualClock, SystemClock
from .commit import Draft, DuplicateCommit, DuplicateRequest
from .documents import DocumentKind
from .errors import (
    CommitRejected,
    CommitUncertain,
    DocumentConflict,
    IllegalTransition,
    KernelError,
    NotRegistered,
    ReservedConversation,
    SessionPoisoned,
    StaleLease,
    StaleStep,
    StorageUnavailable,
    UnknownRecord,
    UnstorableValue,
    WaitCycle,
)
from .memory import InMemoryStorage
from .records import (
    SHOWN_STATUSES,
    JoinPolicy,
    Outcome,
    Preview,
    Status,
    SubmissionStatus,
    Task,
    WaitsOn,
)
from .registry import Blocked, Decision, Receipt, Registry, TaskDefinition
from .run import Run
from .scheduler import Scheduler
from .session import Kernel, SessionHandle
from .storage import CommitReads, Storage
from .tasks import Finish, Next, Sleep, Transition, WaitSignal, WaitTasks
from .worker import Worker

__all__ = [
    "SHOWN_STATUSES",
    "Blocked",
    "Clock",
    "CommitRejected",
    "CommitUncertain",
    "Decision",
    "DocumentConflict",
    "DocumentKind",
    "Draft",
    "DuplicateCommit",
    "DuplicateRequest",
    "Finish",
    "IllegalTransition",
    "InMemoryStorage",
    "JoinPolicy",
    "Kernel",
    "KernelError",
    "ManualClock",
    "Next",
    "NotRegistered",
    "Outcome",
    "Receipt",
    "Registry",
    "ReservedConversation",
    "Run",
    "Scheduler",
    "Preview",
    "SessionHandle",
    "SessionPoisoned",
    "StorageUnavailable",
    "Sleep",
    "StaleLease",
    "StaleStep",
    "Status",
    "Storage",
    "SubmissionStatus",
    "SystemClock",
    "Task",
    "TaskDefinition",
    "CommitReads",
    "Transition",
    "UnknownRecord",
    "UnstorableValue",
    "WaitCycle",
    "WaitSignal",
    "WaitTasks",
    "WaitsOn",
    "Worker",
]
