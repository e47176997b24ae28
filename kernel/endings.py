"""Endings held back: phases that ended their tasks, committed together later.

A queue message's worker (``Worker.advance_queue``) runs many quick tasks one after
another. The phase that ends each one is not committed at once: its result waits here,
the lease still held (and renewed), and is committed with the others of its session in
one commit (one turn of the session's lock, one flush to disk), or carried by the next
commit another lease of this thread makes in that session (:meth:`HeldEndings.carry`: an
intent commit before an external call must never leave an ending waiting behind that
call). What follows from a commit is as if each had been committed alone when its phase
returned:

- One that cannot be committed with the others (refused, a value no storage holds, the
  storage unreachable, an outcome unknown, any error at all) is committed on its own,
  where its own rules apply to it alone; one that cannot be committed on its own either
  is given up (its lease then runs out and the sweep recovers it). No error leaves an
  ending held and its lease renewed, or puts one task's error on another.
- An ending whose commit may change other tasks (a failure, which a ``fail_fast`` join
  answers by cancelling its siblings; a task that owns children, which its ending
  cancels) is committed before the worker starts anything else, so that what it cancels
  never starts meanwhile.

One :class:`HeldEndings` per worker thread: a thread pool's threads hold their own.
"""

from __future__ import annotations

import copy
import logging
from typing import Protocol

from .commit import Draft
from .errors import CommitRejected
from .records import Outcome
from .run import Carried, Lease
from .session import SessionHandle
from .tasks import Finish

log = logging.getLogger(__name__)


class Holder(Protocol):
    """What held endings need of the worker that holds their leases."""

    id: str

    def commit_ending(self, lease: Lease, finish: Finish) -> None:
        """Commit ``finish`` through ``lease`` on its own, and stop holding the lease."""
        ...

    def forget(self, lease: Lease) -> None:
        """Stop holding (and renewing) ``lease``: its ending is committed."""
        ...

    def handle(self, session_id: str) -> SessionHandle:
        """A handle on the session that is not poisoned."""
        ...


def knocks_on(lease: Lease, finish: Finish) -> bool:
    """Whether committing ``finish`` may change tasks other than the lease's own: a
    failure (a ``fail_fast`` join cancels the failed task's siblings) or the ending of a
    task that spawned owned children (they are cancelled)."""
    return finish.outcome is not Outcome.SUCCEEDED or lease.spawned_owned()


class HeldEndings:
    """The endings one worker thread holds back (see the module's docstring)."""

    def __init__(self, holder: Holder) -> None:
        self.holder = holder
        self._ended: list[tuple[Lease, Finish]] = []

    def __len__(self) -> int:
        return len(self._ended)

    def hold(self, lease: Lease, finish: Finish) -> None:
        """Hold ``finish`` back; committed at once (with what is held) if it
        :func:`knocks_on` other tasks."""
        self._ended.append((lease, finish))
        if knocks_on(lease, finish):
            self.flush()

    def flush(self) -> None:
        """Commit every held ending: one commit per session, each on its own if that
        one cannot be committed."""
        ended, self._ended = self._ended, []
        sessions: dict[str, list[tuple[Lease, Finish]]] = {}
        for lease, finish in ended:
            sessions.setdefault(lease.task.session_id, []).append((lease, finish))
        for group in sessions.values():
            if len(group) > 1 and self._together(group):
                for lease, _ in group:
                    self.holder.forget(lease)
                continue
            self._each_alone(group)

    def carry(self, session_id: str) -> Carried | None:
        """The endings held for ``session_id``, for a lease's next commit to carry (the
        other sessions' are committed now: that commit cannot hold them); ``None`` if
        there are none."""
        mine = [held for held in self._ended if held[0].task.session_id == session_id]
        self._ended = [held for held in self._ended if held[0].task.session_id != session_id]
        self.flush()
        if not mine:
            return None
        try:
            draft = self._joint(mine)
        except CommitRejected:
            self._each_alone(mine)  # they cannot be one commit
            return None
        return Carried(draft, lambda committed: self._settle(mine, committed))

    def _settle(self, carried: list[tuple[Lease, Finish]], committed: bool) -> None:
        """The commit that carried these was committed, or not (then each is committed on
        its own; one that was committed after all is refused there by its epoch)."""
        if committed:
            for lease, _ in carried:
                self.holder.forget(lease)
        else:
            self._each_alone(carried)

    def _joint(self, group: list[tuple[Lease, Finish]]) -> Draft:
        draft = Draft(actor=f"worker:{self.holder.id}")
        for lease, finish in group:
            draft.absorb(lease.add_transition(copy.deepcopy(lease.draft), finish))
        return draft

    def _together(self, group: list[tuple[Lease, Finish]]) -> bool:
        try:
            draft = self._joint(group)
            self.holder.handle(group[0][0].task.session_id).commit(draft)
        except Exception as exc:  # any error: each is committed on its own, by its rules
            log.info("committing %d endings together failed, one by one instead: %s",
                     len(group), exc)
            return False
        return True

    def _each_alone(self, group: list[tuple[Lease, Finish]]) -> None:
        for lease, finish in group:
            try:
                self.holder.commit_ending(lease, finish)
            except Exception:
                log.exception("could not commit the ending of %s; its lease runs out instead",
                              lease.task.id)
                self.holder.forget(lease)
