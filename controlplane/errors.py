"""What the control plane's commands and reads refuse with: domain errors, no web types.

A command or a read raises one of these (or a kernel error: ``UnknownRecord`` for "no
such record", ``CommitRejected`` for "the state does not allow it"); each edge (the
API, the pages, the sockets, the management commands) says it in its own way.
:func:`http_status` is the one table the HTTP edges share.
"""

from __future__ import annotations

from kernel import CommitRejected, UnknownRecord


class ControlPlaneError(Exception):
    """Base of the control plane's own refusals."""


class Forbidden(ControlPlaneError):
    """The caller's role does not allow this (a viewer asked to act, or no role at all)."""


class Conflict(ControlPlaneError):
    """The records' state does not allow this now (or not any more): nothing was changed."""


class Invalid(ControlPlaneError):
    """The input is wrong; the message names the field. Nothing was changed."""


class TooBusy(ControlPlaneError):
    """The account holds as much of this as it may at once (controlplane.sockets.slots): nothing
    was done; try again after ``retry_after`` seconds."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def http_status(exc: Exception) -> int | None:
    """The HTTP status an edge answers for a domain error; None for anything else."""
    if isinstance(exc, Forbidden):
        return 403
    if isinstance(exc, Invalid):
        return 422
    if isinstance(exc, UnknownRecord):  # before CommitRejected: it is one
        return 404
    if isinstance(exc, Conflict | CommitRejected):
        return 409
    if isinstance(exc, TooBusy):
        return 429
    return None
