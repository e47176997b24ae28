"""The live pages' sockets: a feed socket in its HTML-partials mode (:class:`PageMode`),
for the session page and for the pages over every session (:mod:`controlplane.ui.live`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Hashable
from contextlib import suppress
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async

from controlplane import access
from controlplane.reads.feed import settled_global
from controlplane.reads.pages import head_seq
from controlplane.sockets.feed import (
    ENDED,
    REFUSED,
    FeedConsumer,
    GlobalFeedConsumer,
    Rows,
    SessionFeedConsumer,
)
from controlplane.sockets.page_threads import on_page_thread
from controlplane.sockets.sharing import shared_reads, shared_renders
from controlplane.ui.live import GLOBAL_PAGES, SESSION_PAGE
from controlplane.web import rates
from controlplane.web.turns import account_turns

PAID_UP_SECONDS = 0.5
"""How long a process trusts that an account was within its budget of server time
before it asks Redis again (an account found in arrears is not asked again before it
could have paid off)."""


class RenderBudget:
    """A live page's renders are paid for from its account's budget of server time
    (:mod:`controlplane.web.rates`), as its requests are: each render is charged what it
    took, and while the account is past what it may take at once its pages get no
    render, so one account's sockets take no more of the server than its requests could. A page in
    arrears shows nothing new until the account has paid off; its next read then brings
    it up to the newest commit at once."""

    def __init__(self) -> None:
        self._known: dict[Hashable, tuple[float, bool]] = {}  # account: (until, paid up)

    async def paid_up(self, account: Hashable) -> bool:
        until, paid = self._known.get(account, (0.0, True))
        if time.monotonic() < until:
            return paid
        self._learn(account, await asyncio.to_thread(rates.arrears, rates.server_time(account)))
        return self._known[account][1]

    def owes(self, account: Hashable) -> bool:
        """Whether ``account`` was last known in arrears (no Redis call): a render that
        waited for its turn while the account's other renders tipped it over is not made."""
        until, paid = self._known.get(account, (0.0, True))
        return not paid and time.monotonic() < until

    def _learn(self, account: Hashable, owed: float) -> None:
        now = time.monotonic()
        paid = owed == 0
        self._known[account] = (now + (PAID_UP_SECONDS if paid else owed), paid)
        if len(self._known) > 10_000:  # accounts gone long ago
            self._known = {a: v for a, v in self._known.items() if v[0] > now}

    def charged(self, account: Hashable, render: Callable[..., Any]) -> Callable[..., Any]:
        """``render`` in ``account``'s turn (:mod:`controlplane.web.turns`; None, with
        nothing rendered, if the turn does not come), charging what it takes to
        ``account`` (on the render's own thread: the turn is waited for and the charge
        is a Redis call)."""
        def run(*args: Any, **kwargs: Any) -> Any:
            turn = account_turns.take(account)
            if turn is None:
                return None
            started = time.perf_counter()
            try:
                return render(*args, **kwargs)
            finally:
                turn.end()
                # The charge answers what the account owes after it: it may have tipped it over.
                owed = rates.charge(rates.server_time(account), time.perf_counter() - started)
                if owed is not None:
                    self._learn(account, owed)

        return run


render_budget = RenderBudget()


class SettledCommits:
    """The newest global commit this process has read as settled (every commit up to it
    is visible: :func:`~controlplane.reads.feed.settled_global`), for the pages over every
    session. A page socket reads from there, not from its own position: the commits in
    between are settled already, and so every page socket of the process, whatever its
    position, shares one read per hint (:data:`~controlplane.sockets.sharing.shared_reads`)
    instead of each socket at a position of its own reading for itself."""

    def __init__(self) -> None:
        self.known = 0

    async def newest_after(self, after: int, limit: int) -> int | None:
        """The newest settled commit id after ``after`` (at most ``limit`` past where the
        read starts), or None if none is."""
        start = max(after, self.known)

        async def settled() -> Rows:
            return await settled_global(start, limit, select="c.id", run=on_page_thread)

        rows = await shared_reads.read(("global-ids", start, limit), settled)
        if rows:
            self.known = max(self.known, int(rows[-1][0]))
        newest = int(rows[-1][0]) if rows else start
        return newest if newest > after else None

    def forget(self) -> None:
        """Read from each socket's own position again (for tests that drop the database
        the ids came from)."""
        self.known = 0


settled_commits = SettledCommits()


ROLE_SECONDS = 1.0
"""How long a page socket renders with the role it last read before it reads it again
(at its next render): an operator demoted to viewer gets pages without action forms
from then on, without a query per render of a busy page."""


class PageMode(FeedConsumer):
    """The HTML-partials mode of a feed socket, for the browser pages (controlplane.ui).

    The socket keeps its feed's protocol (cursor in-band, replay then live, each position
    sent once, gaps impossible), but a read returns one message per batch of commits: the
    page's parts re-rendered at the newest commit, as htmx out-of-band swaps tagged with
    its position. Heartbeats are partials too ("caught up to seq N"). Renders are shared
    per commit across the process's sockets
    (:class:`~controlplane.sockets.sharing.SharedRenders`); a viewer's and an operator's
    pages differ (action buttons), so theirs are not shared with each other.
    """

    can_act: bool = False
    role_read_at: float | None = None

    async def page_role(self) -> None:
        self.can_act = await database_sync_to_async(access.may_act)(self.user)
        self.role_read_at = time.monotonic()

    async def role_stands(self) -> bool:
        """Before a render: whether the socket's credential still stands, with
        :attr:`can_act` the role the account holds now (read again once
        :data:`ROLE_SECONDS` passed). A login session or token that ended closes the
        socket with 4401, an account without a role (or deactivated) with 4403, as the
        feed's own re-check does, and nothing is rendered."""
        if self.closing:
            return False
        now = time.monotonic()
        if self.credential is None or (
                self.role_read_at is not None and now - self.role_read_at < ROLE_SECONDS):
            return True
        self.role_read_at = now
        found = await database_sync_to_async(access.standing)(self.credential)
        if found == access.ENDED:
            await self.refuse(ENDED, "the token or login session has ended")
            return False
        if found == access.NO_ROLE:
            await self.refuse(REFUSED, "this account no longer has a role")
            return False
        self.can_act = found == access.OPERATOR
        return True

    def heartbeat_frame(self) -> str:
        return SESSION_PAGE.heartbeat(self.last or 0)


class SessionPageConsumer(PageMode, SessionFeedConsumer):
    """``ws/ui/sessions/<id>/``: the session page's live parts, by seq."""

    async def subscribe(self) -> bool:
        await self.page_role()
        self.shown_as = self.can_act
        self.previews: dict[tuple[str, ...], dict[str, Any]] = {}
        return await super().subscribe()

    async def send_previews(self, previews: list[dict[str, Any]]) -> None:
        """Show uncommitted progress in the page's ``#previews`` until the next commit."""
        for preview in previews:
            self.previews[(preview["task_id"], *preview["path"])] = preview
        await self.send_shown_previews()

    async def send_rows(self, rows: Rows) -> None:
        """A commit holds the previews before it: they leave the page with its update.
        Only those made before it: a render that reaches the page late (it waited for
        its turn) shows a commit the preview came after, which does not hold it."""
        await super().send_rows(rows)
        if rows and self.previews:
            upto = max(seq for seq, _ in rows)
            held = [k for k, p in self.previews.items() if int(p.get("after") or 0) < upto]
            for key in held:
                del self.previews[key]
            if held:
                await self.send_shown_previews()

    def on_hint(self, hint: dict[str, Any]) -> None:
        """A commit of a task holds the previews the task made before it (``held``: task
        -> the seq of its commit): they leave the page, also those that reach this
        socket after it read the commit (a poll may read it before its hint comes, and
        a preview sent before the commit can come after that read)."""
        held = hint.get("held")
        shown = getattr(self, "previews", None)
        if isinstance(held, dict) and held and shown is not None:

            def stale(preview: dict[str, Any]) -> bool:
                return int(held.get(preview.get("task_id"), 0)) > int(preview.get("after") or 0)

            gone = [key for key, preview in shown.items() if stale(preview)]
            for key in gone:
                del shown[key]
            previews = hint.get("previews")
            if isinstance(previews, list):
                hint = {**hint, "previews": [p for p in previews if not stale(p)]}
            elif gone and self.last is not None and not self.closing:
                asyncio.get_running_loop().create_task(self.send_shown_previews())
        super().on_hint(hint)

    async def send_shown_previews(self) -> None:
        with suppress(Exception):  # the socket may be closing: a preview may be lost
            await self.send(text_data=SESSION_PAGE.previews(list(self.previews.values())))

    async def read(self, after: int, limit: int) -> Rows:
        """The parts changed after ``after``, at the session's head: a socket at the same
        cursor takes the process's render of them if it shows the head already."""
        if not await self.role_stands() or not await render_budget.paid_up(self.user.pk):
            return []
        session_id, can_act = self.session_id, self.can_act
        # Parts not changed since keep the forms of the role they were made for: once the
        # role changed, every part is made again (this page shows only changed parts).
        since = after if can_act == self.shown_as else 0

        async def head() -> int | None:
            return await on_page_thread(head_seq)(session_id)  # type: ignore[no-any-return]

        now = await shared_reads.read(("session-head", session_id), head)
        if now is None or now <= after:
            return []

        async def render(_: int) -> tuple[int, str | None]:
            if render_budget.owes(self.user.pk):
                return after, None
            update = render_budget.charged(self.user.pk, SESSION_PAGE.update)
            found = await on_page_thread(update)(session_id, since, can_act)
            return found if found is not None else (after, None)

        seq, html = await shared_renders.render(
            ("session-page", session_id, can_act, since), now, render, self.user.pk)
        if html is None:
            return []
        self.shown_as = can_act
        return [(seq, html)]


class GlobalPageConsumer(PageMode, GlobalFeedConsumer):
    """``ws/ui/<page>/`` (a :data:`~controlplane.ui.live.GLOBAL_PAGES` name): a page over
    every session, by commit id; any commit re-renders the page's live parts."""

    async def subscribe(self) -> bool:
        await self.page_role()
        return await super().subscribe()

    def heartbeat_frame(self) -> str:
        return GLOBAL_PAGES[self.page_name].heartbeat(self.last or 0)

    @property
    def page_name(self) -> str:
        return str(self.scope["url_route"]["kwargs"]["page"])

    async def read(self, after: int, limit: int) -> Rows:
        if not await self.role_stands() or not await render_budget.paid_up(self.user.pk):
            return []
        page, can_act, account = GLOBAL_PAGES[self.page_name], self.can_act, self.user.pk
        # The page's parameters as it was opened (the overview's filter): updates keep to it.
        asked = parse_qs(self.scope.get("query_string", b"").decode("latin-1"))
        params = {name: asked.get(name, [""])[-1][:200] for name in page.params}
        newest = await settled_commits.newest_after(after, limit)
        if newest is None:
            return []

        async def render(upto: int) -> tuple[int, str | None]:
            # Run once its turn came (it may have waited): made at the newest settled
            # commit by then, so the commits that passed meanwhile need no render of
            # their own. Not made if the account fell into arrears meanwhile (position 0:
            # never kept for anyone's later ask).
            if render_budget.owes(account):
                return 0, None
            upto = await settled_commits.newest_after(upto, limit) or upto
            update = render_budget.charged(account, page.update)
            html = await on_page_thread(update)(upto, can_act, **params)
            return (upto, html) if html is not None else (0, None)  # None: no turn came

        # Made at the highest commit id any socket asked for (settled: every commit up to
        # it is in the render's snapshot), and good for any socket asking for no more.
        key = ("page", page.name, can_act, *params.values())
        upto, html = await shared_renders.render(key, newest, render, account)
        return [(upto, html)] if html is not None else []
