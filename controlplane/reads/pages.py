"""What the dashboard's pages show, each read inside one :func:`~.snapshot.snapshot`.

Every read of a page (the first render, a page of children, a live update) runs in one
``REPEATABLE READ`` transaction that also reads the session's ``head_seq`` (or the
highest commit id), so that the ``data-seq`` a fragment carries is exactly the state it
shows: a fragment tagged N shows every commit up to N and none after. The browser drops
a fragment older than what it shows (see ``static/ui.js``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from django.db.models import QuerySet

from controlplane import models
from controlplane.errors import Invalid
from controlplane.process.kernel import process_kernel
from controlplane.reads import approvals as approval_reads
from controlplane.reads import graphs, tasks
from controlplane.reads import sessions as session_reads
from controlplane.reads import timeline as history
from controlplane.reads import transcript as conversations
from controlplane.reads.replica import prefer_replica
from controlplane.reads.snapshot import rows as sql_rows
from controlplane.reads.snapshot import snapshot
from controlplane.reads.tasks import TaskFilter, TaskView
from controlplane.storage.schema import SESSION
from kernel import Outcome, Status, UnknownRecord
from kernel.agent import turn
from kernel.commit import operations_log_id
from kernel.records import SHOWN_STATUSES, SessionRecord

CHILD_PAGE = 50
"""Children per page of a collapsed group (an htmx GET loads the next)."""
EXPAND_UP_TO = 50
"""A parent with at most this many children shows them at once, and live; a bigger one
shows its counts and loads its children by page."""
ROOT_PAGE = 200
ENTRY_TAIL = 50
"""The transcript shows the last entries of each conversation, as the tree shows a page
of children: the page's render grows with what it shows, and a long conversation's
latest page is what an operator reads first."""
ENTRY_PAGE = 50
"""Entries per page of a conversation's earlier entries (an htmx GET loads the next)."""
ENTRIES_COUNTED = 1000
"""How many entries of a conversation the transcript counts at most (past it, "more
than"): counting them all would read them all."""
PROGRESS = turn.PROGRESS  # the agent turn streams its text into these documents
MAX_CHANGED_ROWS = 500
"""Changed task rows re-rendered in one live update; past this an update re-renders the
counts and the shown groups only (collapsed groups are counts anyway)."""
SESSIONS_SHOWN = 100
ATTENTION_ROWS = 500
BLOCKED_SCAN = 2000


def head_seq(session_id: str) -> int | None:
    found = sql_rows("SELECT head_seq FROM kernel_session WHERE id = %s", [session_id])
    return int(found[0][0]) if found else None


def pruned_before(session_id: str, created_seq: int) -> int:
    """The session's ``pruned_seq`` when retention (a prune or a trim) removed commits
    from ``created_seq`` on (a task's first commit, say); 0 when it removed none of them."""
    found = sql_rows("SELECT pruned_seq FROM kernel_session WHERE id = %s", [session_id])
    pruned = int(found[0][0]) if found else 0
    return pruned if pruned >= created_seq else 0


def last_commit_id() -> int:
    return int(sql_rows("SELECT coalesce(max(id), 0) FROM kernel_commit")[0][0])


# -- the task tree ---------------------------------------------------------------------------


@dataclass
class Node:
    """A task row in the tree, with its children collapsed (counts) or shown (a page)."""

    task: TaskView
    counts: list[tuple[str, int]] = field(default_factory=list)
    total: int = 0
    children: list[Node] | None = None
    next_page: int | None = None

    @property
    def id(self) -> str:
        return self.task.id


def nodes(session_id: str, found: list[TaskView], depth: int = 0) -> list[Node]:
    """Tasks as tree nodes; small groups of children are shown (two levels at most)."""
    counts = tasks.child_counts(session_id, [t.id for t in found])
    made = []
    for task in found:
        mine = counts.get(task.id, {})
        node = Node(task, tasks.ordered(mine), sum(mine.values()))
        if node.total and node.total <= EXPAND_UP_TO and depth < 2:
            children = tasks.find(TaskFilter(session_id=session_id, parent_id=task.id),
                                  limit=EXPAND_UP_TO)
            node.children = nodes(session_id, children, depth + 1)
        made.append(node)
    return made


def roots(session_id: str) -> list[Node]:
    found = tasks.find(TaskFilter(session_id=session_id, parent_id="root"), limit=ROOT_PAGE)
    return nodes(session_id, found)


MAX_PAGE = 100_000
"""The last page number a URL may ask for (of children, of tasks): past it the OFFSET
would only cost, and far past it Postgres refuses it."""


def page_number(text: str) -> int:
    """A 1-based page number as a URL gives it: what is not plain digits reads as 1, a
    number past :data:`MAX_PAGE` as that (the page shows something either way)."""
    if not (text.isascii() and text.isdigit()):
        return 1
    return MAX_PAGE if len(text) > len(str(MAX_PAGE)) else min(max(int(text), 1), MAX_PAGE)


def children_page(session_id: str, parent_id: str, page: int) -> tuple[list[Node], int | None]:
    """One page of a parent's children (1-based) and the number of the next, if any."""
    start = (page - 1) * CHILD_PAGE
    found = tasks.find(TaskFilter(session_id=session_id, parent_id=parent_id), start,
                       CHILD_PAGE + 1)
    more = len(found) > CHILD_PAGE
    return nodes(session_id, found[:CHILD_PAGE], depth=2), page + 1 if more else None


# -- the session's other records ---------------------------------------------------------------


def plan_kinds() -> list[str]:
    """The document kinds an application shows in the session page's plans panel (the
    email app's plans): each a subject, a channel and recipients with receipts."""
    return process_kernel().registry.document_kinds("plans")


def plans(session_id: str) -> list[dict[str, Any]]:
    """The session's plans: each recipient with its receipt state."""
    kernel = process_kernel()
    found = []
    for kind, key, version in models.Document.objects.filter(
        session_id=session_id, kind__in=plan_kinds()
    ).order_by("id").values_list("kind", "key", "version"):
        value = kernel.document(session_id, kind, key) or {}
        recipients = [
            {"to": to, **entry} for to, entry in (value.get("recipients") or {}).items()
        ]
        found.append({"task_id": key, "subject": value.get("subject", ""),
                      "channel": value.get("channel", ""), "recipients": recipients,
                      "version": version})
    return found


def _streaming(session_id: str) -> QuerySet[models.Task]:
    """The tasks whose progress documents are still being written: not ended. An ended
    task's text is in the transcript, and a cancelled one's was never finished."""
    keys = models.Document.objects.filter(session_id=session_id, kind=PROGRESS).values("key")
    return models.Task.objects.filter(session_id=session_id, id__in=keys).exclude(
        status=Status.TERMINAL)


def progress(session_id: str) -> list[dict[str, Any]]:
    """Streamed text and tool output still being produced (progress documents of tasks
    that have not ended, with something in them)."""
    kernel = process_kernel()
    found = []
    live = _streaming(session_id).values("id")
    for key in models.Document.objects.filter(
        session_id=session_id, kind=PROGRESS, key__in=live
    ).order_by("-updated_seq").values_list("key", flat=True)[:5]:
        value = kernel.document(session_id, PROGRESS, key) or {}
        if value.get("text") or value.get("output"):
            found.append({"task_id": key, "text": value.get("text", ""),
                          "output": value.get("output", "")})
    return found


CONVERSATIONS_SHOWN = 10
"""The session page shows the last this many conversations (and the operations log);
the API pages through all of them."""
SUBMISSIONS_SHOWN = 50
"""The session page shows the last this many submissions; the API pages through all."""


@dataclass(frozen=True)
class Shown:
    """The last items of a list a page shows, and how many there are in all."""

    items: list[Any]
    total: int

    @property
    def earlier(self) -> int:
        return self.total - len(self.items)


def transcript(session_id: str) -> Shown:
    """The last conversations (the operations log last) with their last entries, as
    items; ``total`` counts the conversations besides the operations log."""
    ops = operations_log_id(session_id)
    found, total = session_reads.last_conversations(session_id, CONVERSATIONS_SHOWN, ops)
    agents = session_reads.own_history_agents([c.id for c in found if c.id != ops])
    shown = [
        conversations.conversation(session_id, c, c.id == ops, ENTRY_TAIL, ENTRIES_COUNTED,
                                   agents.get(c.id))
        for c in found
    ]
    empty = [(i, c.created_seq) for i, c in enumerate(found) if not shown[i].total]
    if empty:  # say why an empty transcript is empty when retention may be the reason
        pruned = pruned_before(session_id, min(seq for _, seq in empty))
        for i, created_seq in empty:
            if pruned >= created_seq:
                shown[i] = replace(shown[i], pruned_upto=pruned)
    return Shown(shown, total + sum(c.id == ops for c in found))


def earlier_entries(session_id: str, conversation_id: str, before: str,
                    after: str | None = None) -> conversations.Earlier:
    """The page of the session's conversation's entries before entry ``before`` (and
    after entry ``after``): UnknownRecord if the session has no such conversation, or
    its transcript no such entry."""
    if not models.Conversation.objects.filter(session_id=session_id,
                                              id=conversation_id).exists():
        raise UnknownRecord(f"no conversation {conversation_id} in session {session_id}")
    return conversations.earlier(session_id, conversation_id,
                                 conversation_id == operations_log_id(session_id), before,
                                 ENTRY_PAGE, after)


def submissions(session_id: str) -> Shown:
    found, total = session_reads.last_submissions(session_id, SUBMISSIONS_SHOWN)
    return Shown(conversations.submissions(session_id, found), total)


def timeline(task_id: str, session_id: str, terminal: bool) -> history.Timeline:
    """The task's commits on a time axis: a row per phase (see :mod:`.timeline`)."""
    return history.timeline(task_id, session_id, terminal)


# -- the session page ---------------------------------------------------------------------------


@dataclass
class SessionPage:
    """Everything the session page shows, at seq ``seq``."""

    session: SessionRecord
    seq: int
    counts: list[tuple[str, int]]
    roots: list[Node]
    plans: list[dict[str, Any]]
    progress: list[dict[str, Any]]
    transcript: Shown
    submissions: Shown
    graph: graphs.Thread | None
    """The session's LangGraph thread, when it holds one."""


def session_page(session_id: str) -> SessionPage | None:
    """None if there is no such session."""
    head = head_seq(session_id)
    if head is None:
        return None
    return SessionPage(
        session_reads.session(session_id), head,
        tasks.ordered(tasks.status_counts(session_id)), roots(session_id), plans(session_id),
        progress(session_id), transcript(session_id), submissions(session_id),
        graphs.thread(session_id),
    )


@dataclass
class SessionChanges:
    """What the commits after a position changed on the session page, at seq ``seq``:
    only the parts that changed are set. Decided from the records themselves
    (``updated_seq``, ``created_seq``), not from the hint that had the reader read, so a lost
    hint or a replay after a reconnect gives the same answer."""

    seq: int
    counts: list[tuple[str, int]]
    roots: list[Node] | None = None
    groups: list[Node] = field(default_factory=list)
    rows: list[Node] = field(default_factory=list)
    plans: list[dict[str, Any]] | None = None
    progress: list[dict[str, Any]] | None = None
    transcript: Shown | None = None
    submissions: Shown | None = None
    graph: graphs.Thread | None = None


def shown_session_page(session_id: str) -> SessionPage | None:
    """:func:`session_page` in one snapshot, from the replica if there is one (a page
    load has no cursor to be behind of; a session the replica has not seen yet is read
    from the primary)."""
    def read() -> SessionPage | None:
        with snapshot():
            return session_page(session_id)

    return prefer_replica(read, fresh_enough=lambda found: found is not None)


def live_session_changes(session_id: str, after: int) -> SessionChanges | None:
    """:func:`session_changes` in one snapshot, for a socket that has shown ``after``:
    from the replica when it has commits past ``after``, else from the primary, so that
    the socket never goes back and a lagging replica never holds it up."""
    def read() -> SessionChanges | None:
        with snapshot():
            return session_changes(session_id, after)

    return prefer_replica(read, fresh_enough=lambda found: found is not None)


def session_changes(session_id: str, after: int) -> SessionChanges | None:
    """None when nothing was committed after ``after`` (or there is no such session)."""
    head = head_seq(session_id)
    if head is None or head <= after:
        return None
    changes = SessionChanges(head, tasks.ordered(tasks.status_counts(session_id)))
    in_session = models.Task.objects.filter(session_id=session_id)
    new_parents = set(
        in_session.filter(created_seq__gt=after).values_list("parent_id", flat=True).distinct()
    )
    if None in new_parents:  # a new root: the root list again
        changes.roots = roots(session_id)
    else:
        regrouped = set()
        for parent in tasks.find_ids(list(new_parents)):
            group = nodes(session_id, [parent])[0]
            if group.children is not None:
                regrouped.add(parent.id)
                changes.groups.append(group)
        changed = tasks.find(TaskFilter(session_id=session_id, changed_after=after),
                             limit=MAX_CHANGED_ROWS + 1)
        if len(changed) <= MAX_CHANGED_ROWS:
            parents = {t.parent_id for t in changed if t.parent_id} - {t.id for t in changed}
            shown = [t for t in changed + tasks.find_ids(list(parents))
                     if t.parent_id not in regrouped]
            changes.rows = nodes(session_id, shown, depth=2)  # rows only: groups stay
    documents = models.Document.objects.filter(session_id=session_id, updated_seq__gt=after)
    if documents.filter(kind__in=plan_kinds()).exists():
        changes.plans = plans(session_id)
    streamers = models.Document.objects.filter(session_id=session_id, kind=PROGRESS)
    if documents.filter(kind=PROGRESS).exists() or in_session.filter(
            updated_seq__gt=after, id__in=streamers.values("key")).exists():
        changes.progress = progress(session_id)  # a streaming task moved (or ended)
    if models.Entry.objects.filter(session_id=session_id, seq__gt=after).exists() or \
            in_session.filter(updated_seq__gt=after, kind__in=approval_reads.KINDS).exists():
        changes.transcript = transcript(session_id)
    if models.Submission.objects.filter(session_id=session_id, updated_seq__gt=after).exists():
        changes.submissions = submissions(session_id)
    if graphs.changed(session_id, after):
        changes.graph = graphs.thread(session_id)
    return changes


# -- pages that span sessions: the overview and needs attention, by global commit id ------


@dataclass
class Overview:
    seq: int
    totals: list[tuple[str, int]]
    sessions: list[dict[str, Any]]
    query: str
    status: str


def overview(query: str = "", status: str = "") -> Overview:
    """Sessions (newest first, searched and filtered) with their live counts. An unknown
    status filters nothing (it comes from a URL)."""
    query = query.strip()[:200]
    status = status if status in SHOWN_STATUSES else ""
    found = models.Session.objects.order_by("-id")
    if query:
        found = found.filter(id__icontains=query) | found.filter(
            metadata__title__icontains=query)
    if status:
        found = found.filter(id__in=tasks.sessions_having(status))
    shown = [SESSION.record(v) for v in found.order_by("-id")[:SESSIONS_SHOWN]
             .values(*SESSION.columns)]
    counts = tasks.counts_by_session(s.id for s in shown)
    return Overview(
        last_commit_id(),
        tasks.ordered(tasks.status_counts()),
        [{"session": s, "counts": tasks.ordered(counts[s.id])} for s in shown],
        query,
        status,
    )


@dataclass
class Attention:
    seq: int
    uncertain: list[TaskView]
    blocked: list[TaskView]
    failed: list[TaskView]
    failed_count: int
    retry_all: tasks.TaskSet
    """The failed tasks "retry all N failed" retries (up to a bulk action's most, and one
    more): its form carries their digest."""
    approvals: list[approval_reads.PendingApproval]
    """Tool calls waiting for an operator's approval, in every session."""


def attention() -> Attention:
    """Tasks an operator should look at: uncertain, blocked, failed (restart-limited among
    them)."""
    retry_all = tasks.task_set(tasks.RETRY_ALL_FAILED, tasks.COUNT + 1,
                               tasks.NAMED_BY["retry"])
    failed_count = (retry_all.count if retry_all.count <= tasks.COUNT
                    else tasks.count(tasks.RETRY_ALL_FAILED))
    return Attention(
        last_commit_id(),
        tasks.find(tasks.AWAITING_RESOLUTION, limit=ATTENTION_ROWS),
        tasks.blocked(BLOCKED_SCAN),
        tasks.find(tasks.FAILED, limit=ATTENTION_ROWS),
        failed_count,
        retry_all,
        approval_reads.pending_anywhere(),
    )


# -- finding tasks across sessions ------------------------------------------------------------

TASKS_PAGE = 50
"""Tasks per page of the tasks page."""
COUNT_UP_TO = tasks.COUNT
"""The tasks page counts matches up to this many (a bulk action's most), then says "more
than": counting every match of a wide filter would cost more than the page itself."""
MAX_TEXT = 200
MIN_WORD = 3
"""The shortest word the tasks page searches task input for: what the trigram index
(``task_input_trgm``) can answer; a shorter word would read every task's input."""
MAX_TASKS_PAGES = 100
"""The tasks page's last page (the first 5,000 matches in the chosen order): past it, the
OFFSET alone would read that many rows per page; narrow the filter instead."""


@dataclass(frozen=True)
class TaskSearch:
    """The tasks page's filter as its URL says it, each value checked: one that does not
    parse is dropped (it came from a URL), so the page always shows something."""

    kind: str = ""
    status: str = ""
    session: str = ""
    q: str = ""
    since: str = ""
    until: str = ""
    sort: str = "-created"
    page: int = 1

    @property
    def short_word(self) -> bool:
        """A word too short to search by (:data:`MIN_WORD`): nothing is searched."""
        return 0 < len(self.q) < MIN_WORD

    def filter(self) -> TaskFilter:
        """As a :class:`TaskFilter`: the shown status names an outcome or a status.
        Invalid for a :attr:`short_word` (a bulk action must never act on a wider set
        than the word would have found)."""
        if self.short_word:
            raise Invalid(f"q: a word of at least {MIN_WORD} characters")
        outcome = self.status if self.status in tuple(Outcome) else None
        return TaskFilter(
            session_id=self.session or None,
            kind=self.kind or None,
            status=Status.TERMINAL if outcome else (self.status or None),
            outcome=outcome,
            text=self.q or None,
            since=_moment(self.since),
            until=_moment(self.until),
        )

    def query(self, **changed: Any) -> str:
        """This search as a query string, with some values changed (a sort, a page)."""
        values = {**vars(self), **changed}
        defaults = vars(TaskSearch())
        return urlencode({k: v for k, v in values.items() if v != defaults[k]})

    @property
    def filtered(self) -> bool:
        return self.short_word or self.filter().any_set()


def _moment(text: str) -> datetime | None:
    """A time from a form's ``datetime-local`` (read as UTC) or ISO 8601 with an offset."""
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def task_search(kind: str = "", status: str = "", session: str = "", q: str = "",
                since: str = "", until: str = "", sort: str = "", page: str = "",
                **_: str) -> TaskSearch:
    """The filter of a URL's query: unknown or malformed values are left out."""
    return TaskSearch(
        kind=kind.strip()[:MAX_TEXT],
        status=status if status in SHOWN_STATUSES else "",
        session=session.strip()[:MAX_TEXT],
        q=q.strip()[:MAX_TEXT].replace("\x00", ""),
        since=since if _moment(since) else "",
        until=until if _moment(until) else "",
        sort=sort if sort in tasks.ORDERS and sort != "tree" else "-created",
        page=page_number(page),
    )


SEARCHED = tuple(TaskSearch.__dataclass_fields__)
"""The query parameters of the tasks page (and of its bulk forms)."""


@dataclass
class TasksPage:
    seq: int
    search: TaskSearch
    rows: list[tasks.Row]
    total: int
    """Matches, counted up to :data:`COUNT_UP_TO` (``more`` says there are more)."""
    more: bool
    pages: int
    kinds: list[str]
    last_page: bool = False
    """The page is :data:`MAX_TASKS_PAGES` and more tasks match beyond it."""
    short_word: bool = False
    """The word was too short to search by: nothing was searched."""


def tasks_page(search: TaskSearch) -> TasksPage:
    """One page of the tasks matching ``search`` across sessions, with how many match.

    The count and the page come from one read of the matches' ids in the page's order, up
    to one past :data:`COUNT_UP_TO` or past the asked page, whichever is further (at most
    :data:`MAX_TASKS_PAGES` of them): a filter that no index serves, or a common word,
    then costs one scan and one sort of the matches, whatever page is asked, not one to
    count and another for a deep page. A page past the last match is the last page."""
    kinds = sorted(process_kernel().registry.kinds())
    if search.short_word:
        return TasksPage(last_commit_id(), replace(search, page=1), [], 0, False, 1,
                         kinds, short_word=True)
    found = search.filter()
    asked = min(search.page, MAX_TASKS_PAGES)
    head = tasks.ids(found, max(COUNT_UP_TO, asked * TASKS_PAGE) + 1, order=search.sort)
    more = len(head) > COUNT_UP_TO
    total = min(len(head), COUNT_UP_TO)
    page = min(asked, max(1, -(-len(head) // TASKS_PAGE)))
    start = (page - 1) * TASKS_PAGE
    rows = tasks.rows(head[start : start + TASKS_PAGE + 1])
    pages = max(1, -(-total // TASKS_PAGE))
    if more:  # past the counted ones, a page more while there are rows
        pages = max(pages, page + 1 if len(rows) > TASKS_PAGE else page)
    last_page = page == MAX_TASKS_PAGES and len(rows) > TASKS_PAGE
    pages = min(pages, MAX_TASKS_PAGES)
    rows = rows[:TASKS_PAGE]
    return TasksPage(last_commit_id(), replace(search, page=page), rows, total, more, pages,
                     kinds, last_page)
