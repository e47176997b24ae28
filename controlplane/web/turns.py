"""One account's requests and live-page renders take turns in a web process.

The budget of server time (:mod:`controlplane.web.rates`) bounds how much of the
server an account takes over time, not how much of it at once: a search that keeps a
core busy for half a second, asked from two tabs while one of the account's live pages
renders another, takes every core of a small machine, and every other account's page
then waits for one. So in each web process an account runs one piece of work at a time:
a request (a browser's or a token's, from the moment its account is known to its
answer, less a long-poll's wait for news) or a live page's render. The others wait for
their turn, up to ``USER_TURN_WAIT_SECONDS``; a request still waiting then is answered
429 with ``Retry-After``, and a render is not made (the page's next update brings it up
to date). ``USER_TURN_WAIT_SECONDS = 0`` lets an account's work run at once.

This costs a well-behaved account little: its requests are already counted against a
rate (``USER_REQUESTS_PER_SECOND``) far below what one at a time can serve, and a
browser's page asks for its parts one after another anyway. The turns are per process,
as the render threads are (:mod:`controlplane.sockets.render_turns`): an account spread
over several web processes has a turn in each.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable
from dataclasses import dataclass, field

from django.conf import settings

RETRY_AFTER_SECONDS = 1
"""What a request refused for want of a turn is told to wait."""


@dataclass
class _Line:
    """An account's turn: the lock, and how many hold or wait for it (the line is
    forgotten when none do, so that accounts gone leave nothing behind)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    users: int = 0


class Turn:
    """A turn taken: :meth:`end` gives it to the next in line (once; later calls do
    nothing)."""

    def __init__(self, turns: AccountTurns, account: Hashable, line: _Line | None) -> None:
        self.turns, self.account, self._line = turns, account, line
        self._ended = threading.Lock()
        self.ended = False

    def end(self) -> None:
        with self._ended:
            if self.ended:
                return
            self.ended = True
        if self._line is None:  # turns off: it held nothing up
            return
        self._line.lock.release()
        self.turns._leave(self.account, self._line)


class AccountTurns:
    """Each account's turns in this process (module docstring)."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._lines: dict[Hashable, _Line] = {}

    def take(self, account: Hashable, wait: float | None = None) -> Turn | None:
        """Wait up to ``wait`` seconds (``USER_TURN_WAIT_SECONDS`` when None) for
        ``account``'s turn: the turn, or None if it did not come. With turns off (a wait of
        0), a turn that holds nothing up."""
        wait = settings.USER_TURN_WAIT_SECONDS if wait is None else wait
        if wait <= 0:
            return Turn(self, account, None)
        with self._guard:
            line = self._lines.setdefault(account, _Line())
            line.users += 1
        if line.lock.acquire(timeout=wait):
            return Turn(self, account, line)
        self._leave(account, line)
        return None

    def waiting(self, account: Hashable) -> int:
        """How many of ``account``'s pieces of work hold or wait for its turn."""
        with self._guard:
            line = self._lines.get(account)
            return line.users if line is not None else 0

    def _leave(self, account: Hashable, line: _Line) -> None:
        with self._guard:
            line.users -= 1
            if line.users <= 0 and self._lines.get(account) is line:
                del self._lines[account]


account_turns = AccountTurns()
