"""Live-page renders taken in turns by account.

A process renders its live pages on a few threads (``page_threads.PAGE_THREADS``). Renders
are shared per page view (page, role, parameters), so an account that opens many
sockets on distinct filters asks for as many renders per commit; taken first come,
first served, they would hold every thread and queue every other account's page
behind them. Here a render waits for its turn:

- at most ``per_account`` renders of one account run at once (``RENDERS_PER_ACCOUNT``,
  1 of the 4 threads), so one account never holds more than that many threads and
  the others always have the rest (and the CPU it would take: a heavy render is mostly
  the database's work, and two heavy renders of one account on a small machine would
  take the cores every other account's page needs);
- when a thread frees, it goes to the waiting account whose last turn is the oldest
  (accounts with no render running that had no turn since they began waiting go
  first, in the order they came), to that account's oldest waiting render: with
  several accounts waiting, a render waits behind at most one render of each other
  account, however many sockets those accounts hold.

A render shared by several accounts waits in each of their queues and is made at the
first turn any of them gets, charged to that account.
"""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Hashable
from typing import TypeVar

T = TypeVar("T")

RENDERS_PER_ACCOUNT = 1
"""Renders one account may have running at once in a process."""


class Turn:
    """One render waiting for a thread, for the accounts that asked for it."""

    def __init__(self, accounts: set[Hashable]) -> None:
        self.accounts = set(accounts)
        self.granted: asyncio.Future[Hashable] = asyncio.get_running_loop().create_future()
        self.left = False  # its caller stopped waiting

    @property
    def waiting(self) -> bool:
        return not self.left and not self.granted.done()


class RenderTurns:
    """Hands the render threads out fairly between accounts (module docstring)."""

    def __init__(self, threads: int, per_account: int = RENDERS_PER_ACCOUNT) -> None:
        self.threads = threads
        self.per_account = per_account
        self.running: Counter[Hashable] = Counter()
        self._busy = 0
        self._queues: dict[Hashable, deque[Turn]] = {}
        # Accounts with renders waiting, in the order they get turns: those that have had
        # none since they began waiting first (in the order they came), then the others,
        # the one whose last turn is the oldest first.
        self._order: list[Hashable] = []
        self._unserved: set[Hashable] = set()

    def ask(self, accounts: set[Hashable]) -> Turn:
        turn = Turn(accounts)
        for account in turn.accounts:
            self._enqueue(account, turn)
        self._hand_out()
        return turn

    def join(self, turn: Turn, account: Hashable) -> None:
        """Another account wants what ``turn`` renders: it waits in its queue too."""
        if turn.waiting and account not in turn.accounts:
            turn.accounts.add(account)
            self._enqueue(account, turn)
            self._hand_out()

    async def run(self, turn: Turn, work: Callable[[], Awaitable[T]]) -> T:
        """``work()`` once ``turn`` is granted; its thread handed on when it ends."""
        try:
            account = await asyncio.shield(turn.granted)
        except asyncio.CancelledError:
            turn.left = True
            if turn.granted.done():  # granted just as the caller left: hand it on
                self._finish(turn.granted.result())
            raise
        try:
            return await work()
        finally:
            self._finish(account)

    def _enqueue(self, account: Hashable, turn: Turn) -> None:
        queue = self._queues.get(account)
        if queue is None:
            queue = self._queues[account] = deque()
            if self.running[account]:  # it has a turn under way: last in line
                self._order.append(account)
            else:
                self._order.insert(len(self._unserved), account)
                self._unserved.add(account)
        queue.append(turn)

    def _finish(self, account: Hashable) -> None:
        self._busy -= 1
        self.running[account] -= 1
        if self.running[account] <= 0:
            del self.running[account]
        self._hand_out()

    def _hand_out(self) -> None:
        while self._busy < self.threads:
            for account in list(self._order):
                queue = self._queues[account]
                while queue and not queue[0].waiting:
                    queue.popleft()
                if queue and self.running[account] >= self.per_account:
                    continue
                self._order.remove(account)
                self._unserved.discard(account)
                if not queue:
                    del self._queues[account]
                    continue
                turn = queue.popleft()
                if queue:
                    self._order.append(account)  # its turn is taken: last in line
                else:
                    del self._queues[account]
                self._busy += 1
                self.running[account] += 1
                turn.granted.set_result(account)
                break
            else:
                return
