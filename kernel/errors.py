"""Errors the kernel raises.

Each one names a rule of the commit protocol (DESIGN §4-§5) so that callers can
react precisely: a stale lease means "stop, someone else owns this task now", an
uncertain commit means "this handle can no longer be trusted".
"""

from __future__ import annotations


class KernelError(Exception):
    """Base class of every error the kernel raises on purpose."""


class CommitRejected(KernelError):
    """The draft breaks a rule; nothing was written."""


class StaleLease(CommitRejected):
    """The committing worker no longer holds the task's lease (fencing, invariant 5)."""

    def __init__(self, task_id: str, epoch: int, current_epoch: int | None) -> None:
        super().__init__(
            f"task {task_id}: commit with epoch {epoch} rejected, current epoch is {current_epoch}"
        )
        self.task_id = task_id
        self.epoch = epoch
        self.current_epoch = current_epoch


class IllegalTransition(CommitRejected):
    """A task transition that the state machine does not allow."""


class StaleStep(IllegalTransition):
    """A signal meant for a step (a signal name at an epoch) the task no longer waits on:
    someone answered it first, or the task moved on to another step."""


class DocumentConflict(CommitRejected):
    """A document was changed since the version the draft expected."""


class WaitCycle(CommitRejected):
    """A wait that would make tasks wait on each other forever."""


class ReservedConversation(CommitRejected):
    """The draft writes to the session's operations log other than by recording an
    operation (a submission, an entry of its own, a fork of it): the log holds only what
    operators did, written by the commits that did it."""


class UnstorableValue(CommitRejected):
    """A value no storage can hold (text with NUL, a value JSON does not encode); the
    message names the record, the field and where in the value the problem is."""


class UnknownRecord(CommitRejected):
    """The draft refers to a record that does not exist in this session."""


class CommitUncertain(KernelError):
    """Storage failed in a way that leaves unknown whether the commit was made.

    Storage raises this; the session handle turns it into :class:`SessionPoisoned`.
    """


class StorageUnavailable(KernelError):
    """Storage could not be reached (a lost connection, a restarting server) before
    anything was written. A phase that meets it stops and is restarted, as after a crash;
    it is never the task's failure."""


class SessionPoisoned(KernelError):
    """The handle saw an uncertain commit: it publishes nothing and must be reopened."""


class NotRegistered(KernelError):
    """A task or document kind that the registry does not know."""
