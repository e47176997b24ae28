"""The SQL of the Postgres storage's commits, claims, reads and outbox, named.

Not every statement of the storage is here: the rest stays beside the code that runs it,
retention's (:mod:`.retention`), the commit log's partitions (:mod:`.partitions`), the
due channel's NOTIFY and LISTEN (:mod:`.due`), the clock's ``clock_timestamp()``
(:mod:`.clock`), the pipelined BEGIN and COMMIT (:mod:`.connection`), the burst
analysis's lock timeout (:mod:`.postgres`), the artifacts' (:mod:`.artifacts`) and the
tasks page's search index (:mod:`.search`).

Column lists, inserts and updates are built from :mod:`.schema` (so a new record
field reaches every statement without an edit here); what is written out by hand is
the part that is a decision: predicates, locking, ordering, the claim's lease rules.
Statements use ``%s`` placeholders in the order of the schema's column tuples, or
``%(name)s`` ones where the same value appears more than once.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

from controlplane.storage.schema import (
    COMMIT,
    CONVERSATION,
    DISPATCH,
    DOCUMENT_HEAD,
    DOCUMENT_VERSION,
    ENTRY,
    SESSION,
    SUBMISSION,
    TASK,
    Table,
)
from kernel.documents import MIN_BASELINE_BYTES
from kernel.records import SUMMARY, UNDISPATCHED, Status
from kernel.storage import CLAIM_WINDOW


def select(table: Table, where: str, tail: str = "") -> str:
    """``SELECT <the record's columns> FROM <table> WHERE ...``."""
    return f"SELECT {table.select_list} FROM {table.name} WHERE {where}{tail}"


def insert(table: Table, tail: str = "", expressions: Mapping[str, str] | None = None) -> str:
    """One row of every column an insert writes, in :attr:`Table.inserted` order.

    ``expressions`` wraps a column's parameter in SQL (``{}`` marks the parameter)."""
    wrap = expressions or {}
    columns = ", ".join(table.inserted)
    values = ", ".join(wrap.get(c, "{}").format("%s") for c in table.inserted)
    return f"INSERT INTO {table.name} ({columns}) VALUES ({values}){tail}"


def insert_rows(
    table: Table, count: int, tail: str = "", expressions: Mapping[str, str] | None = None
) -> str:
    """``count`` rows in one statement (a single round trip, ids returned in order);
    ``expressions`` as for :func:`insert`."""
    wrap = expressions or {}
    columns = ", ".join(table.inserted)
    row = "(" + ", ".join(wrap.get(c, "{}").format("%s") for c in table.inserted) + ")"
    return f"INSERT INTO {table.name} ({columns}) VALUES {', '.join([row] * count)}{tail}"


def update(
    table: Table, expressions: Mapping[str, str] | None = None,
    columns: tuple[str, ...] | None = None,
) -> str:
    """``UPDATE ... SET <every column but the fixed ones> WHERE <key> = %s``, or only
    ``columns`` (``Table.changed``: an update of a row whose other columns are known).

    ``expressions`` wraps a column's parameter in SQL (``{}`` marks the parameter).
    """
    wrap = expressions or {}
    assignments = ", ".join(f"{c} = {wrap.get(c, '{}').format('%s')}"
                            for c in (table.updated if columns is None else columns))
    return f"UPDATE {table.name} SET {assignments} WHERE {table.key} = %s"


def upsert(table: Table) -> str:
    """Insert, or on a key conflict update every column that is not fixed."""
    assignments = ", ".join(f"{c} = EXCLUDED.{c}" for c in table.updated)
    return insert(table, f" ON CONFLICT ({table.key}) DO UPDATE SET {assignments}")


# -- sessions and the change feed ------------------------------------------------------

SESSION_INSERT = insert(SESSION)
SESSION_BY_ID = select(SESSION, "id = %s")
# Taking the session's commit order and advancing its head are one statement: the row
# lock that orders commits is the head update itself (a commit that fails rolls it back).
SESSION_ADVANCE = (
    f"UPDATE {SESSION.name} SET head_seq = head_seq + 1 WHERE id = %s RETURNING "
    + ", ".join("head_seq - 1" if c == "head_seq" else c for c in SESSION.columns)
)
# The general commit advanced the head before it was built (``SESSION_ADVANCE``); its
# row dates the session once written (``SessionRecord.last_commit_at``).
COMMIT_INSERT = (
    "WITH written AS (" + insert(COMMIT, " RETURNING id, session_id, at") + "), "
    f"dated AS (UPDATE {SESSION.name} s SET last_commit_at = w.at FROM written w "
    "WHERE s.id = w.session_id) SELECT id FROM written"
)

# Rows a trim kept at or below pruned_seq (keyed ones) are not the feed's.
COMMITS_AFTER = select(
    COMMIT,
    f"session_id = %(session)s AND seq > greatest(%(after)s, (SELECT pruned_seq FROM "
    f"{SESSION.name} WHERE id = %(session)s))",
    " ORDER BY seq LIMIT %(limit)s",
)
COMMIT_BY_KEY = select(COMMIT, "session_id = %s AND key = %s")

# -- tasks -----------------------------------------------------------------------------

TASK_BY_ID = select(TASK, "id = %s")
# Lists of ids go as one array literal in a text parameter (:func:`.connection.id_list`):
# psycopg dumps a list parameter element by element in Python, which for a join over
# 1,000 tasks cost more than the query. The parameter is the
# array itself, evaluated once whatever the plan.
IDS = "ANY(%s::text[])"
TASKS_BY_ID = select(TASK, f"id = {IDS}")
TASKS_BY_ID_LOCKED = select(TASK, f"id = {IDS}", " FOR UPDATE")
SESSION_TASKS = select(TASK, "session_id = %s", " ORDER BY created_seq, id")
CHILDREN_LOCKED = select(TASK, "parent_id = %s AND owned", " ORDER BY created_seq, id FOR UPDATE")
# A task's waiters, each as its row version only (id, xmin, updated_seq, epoch), locked.
# The row of a join over n tasks holds their n ids several times (its input, checkpoint,
# ``wait`` and ``wait_deps``): reading and decoding it each time one of them ends made
# every ending O(n) and a batch O(n*n). A waiter whose dependency array is
# large (``pg_column_size`` reads its stored size without fetching it) is returned
# without being looked into: the caller checks it against its copy of that row version
# (:meth:`.connection.TransactionReads.waiters`). Small arrays are checked here.
WAITER_BIG_DEPS = 2048
WAITERS_LOCKED = (
    f"SELECT id, xmin::text, updated_seq, epoch FROM {TASK.name} WHERE session_id = %s "
    f"AND status = 'waiting' AND (pg_column_size(wait_deps) > {WAITER_BIG_DEPS} "
    "OR wait_deps @> ARRAY[%s]::text[]) FOR UPDATE"
)
# Whole rows with their version (``xmin``), for the waiters not known at that version.
TASKS_WITH_VERSION = f"SELECT {TASK.select_list}, xmin::text FROM {TASK.name} WHERE id = {IDS}"
JOIN_STATE = (
    "SELECT count(*) FILTER (WHERE status <> 'terminal'), min(id) FILTER "
    "(WHERE status = 'terminal' AND outcome->>'kind' <> 'succeeded') "
    f"FROM {TASK.name} WHERE id = {IDS}"
)
# One index lookup per id, in the order given, up to the first task still open: a join
# over n tasks that asks this as each of them ends, newest first, reads about one row
# while the batch runs, not n (a count over them would make each email O(n)).
ANY_OPEN = (
    "SELECT 1 FROM unnest(%s::text[]) AS wanted(id) WHERE EXISTS "
    f"(SELECT 1 FROM {TASK.name} t WHERE t.id = wanted.id AND t.status <> 'terminal') LIMIT 1"
)
TASK_INSERT = insert(TASK)
# A lease kept by a commit is extended from when the commit was built; the time the
# transaction then spent waiting for locks is added here, measured by the database,
# so that a commit stuck behind a lock never commits with a lease that ran out
# meanwhile (a live worker would lose its task to the sweep). Only to a lease the commit
# moves: one that writes the task without moving its lease (a signal queued for it, a
# cancel asked of it) leaves the lease's end where its holder put it.
TASK_UPDATE = update(
    TASK,
    {"lease_until": "(SELECT CASE WHEN v.at IS NOT DISTINCT FROM lease_until THEN lease_until "
                    "ELSE v.at + (clock_timestamp() - transaction_timestamp()) END "
                    "FROM (SELECT {}::timestamptz AS at) v)"},
)
# The session's head advanced and dated by the commit's time (``last_commit_at``), as a
# CTE named ``head`` (its one column ``head_seq``, the new seq): the row lock that orders
# a session's commits. Parameters: the session id, the commit's time.
_ADVANCE = (
    f"UPDATE {SESSION.name} s SET head_seq = s.head_seq + 1, last_commit_at = v.at "
    "FROM (SELECT %s::text AS id, %s::timestamptz AS at) v WHERE s.id = v.id"
)
HEAD = f"WITH head AS ({_ADVANCE} RETURNING s.head_seq)"
# The seq kept for the rest of the transaction, read back by ``AT_HEAD``.
KEEP_SEQ = "set_config('kernel.seq', head_seq::text, true)::bigint"
AT_HEAD = "current_setting('kernel.seq')::bigint"

# A commit that only continues the lease holder's task inline, built from the holder's
# copy of it (``Prefetch.known``), as one statement (its own transaction, synchronously
# committed: one round trip): the head update takes the session's commit order and gives
# the seq; the commit row is written with it; the task is written only if no commit,
# claim or release changed it since that copy, and ``kernel_unmoved`` otherwise aborts the
# statement (nothing is written; the commit is built again from what the database holds). A
# renewal may have moved the lease meanwhile: the later end is kept, as the builder's
# rule for a kept lease says. The head is read first, so the session row is locked
# before the task row, as in every commit. Parameters: ``HEAD``'s, the commit row's
# values but its seq, the values of the task's changed columns but its updated_seq (only
# those: the guard below ensures the row holds the copy's others), its id, then the
# epoch, lease owner and updated_seq of the copy (the owner as well as the epoch: a
# claim lost with a crashed server's unflushed log leaves its epoch to the next claim).
HEAD_SEQ = "(SELECT head_seq FROM head)"
_WRITTEN = HEAD + ", written AS (" + insert(COMMIT, " RETURNING id", {"seq": HEAD_SEQ}) + ")"


def _moved(columns: tuple[str, ...], after: str = "") -> str:
    """The ``moved`` and ``forgotten`` CTEs: the task written if still as copied, with
    its lease extended by the time the statement waited until then, and its dispatch
    rows removed. ``columns``: what the commit changes in the task (``Table.changed``
    from the copy, whose other columns the guard ensures the row still holds; always
    ``updated_seq`` and ``lease_until``, which a renewal moves without a commit).
    ``after``: a condition on CTEs written before it, read (and so waited for) before
    the task's row is locked and its lease's end computed."""
    return (
        ", moved AS ("
        + update(
            TASK,
            {
                "lease_until": "GREATEST(lease_until, {}::timestamptz "
                "+ (clock_timestamp() - transaction_timestamp()))",
                "updated_seq": HEAD_SEQ,
            },
            columns,
        )
        + " AND epoch = %s AND lease_owner = %s AND status = 'running' AND updated_seq = %s"
        + after
        + f" RETURNING 1), forgotten AS (DELETE FROM {DISPATCH.name} WHERE task_id = %s)"
    )


TASK_ALWAYS_WRITTEN = ("updated_seq", "lease_until")
"""The task's columns a copy-guarded statement writes whether or not they changed."""


@functools.cache
def inline_commit(columns: tuple[str, ...]) -> str:
    """A phase's ``Next`` alone, as one statement (``CommitKind.NEXT_ALONE``); the
    task's ``columns`` written (:func:`_moved`)."""
    return (
        _WRITTEN + _moved(columns) + " SELECT (SELECT head_seq FROM head), "
        "(SELECT id FROM written), kernel_unmoved((SELECT count(*) FROM moved))"
    )


@functools.cache
def inline_writing(entries: int, documents: tuple[bool, ...], columns: tuple[str, ...]) -> str:
    """:func:`inline_commit` with ``entries`` entries and the new versions of the documents
    written in the same statement, every seq the head's: a phase's step
    (``kernel.commit.CommitKind.NEXT_WRITING``). ``documents`` says for each document
    whether it is new. An existing document's head is written only if it is still at
    the version of the copy the commit was built from, and ``kernel_unmoved`` otherwise
    aborts the statement, as for the task; a new one's is inserted, and one that another
    commit created meanwhile breaks its unique key, which aborts it too. The task is
    written after the documents. Parameters: ``HEAD``'s and the commit row's values
    but its seq; then each entry's values but its seq; then, for each document, its
    head's updated values but its updated_seq, its id and the copy's version (an existing
    one) or its head's values but its updated_seq (a new one); then each version's values
    but its seq; then :func:`inline_commit`'s task parameters (the values of ``columns``
    but updated_seq, its id, the copy's epoch, lease owner and updated_seq, its id again)."""
    parts = [_WRITTEN]
    if entries:
        parts.append(", entered AS (" + insert_rows(ENTRY, entries, "", {"seq": HEAD_SEQ}) + ")")
    parts += [
        f", document{i} AS ("
        + (insert(DOCUMENT_HEAD, " RETURNING 1", {"updated_seq": HEAD_SEQ}) if new
           else update(DOCUMENT_HEAD, {"updated_seq": HEAD_SEQ}) + " AND version = %s RETURNING 1")
        + ")"
        for i, new in enumerate(documents)
    ]
    if documents:
        parts.append(", versions AS ("
                     + insert_rows(DOCUMENT_VERSION, len(documents), "",
                                   {"seq": HEAD_SEQ}) + ")")
    # The task after its documents: a document's row held by another transaction is
    # waited for before the task's row is locked (the holder's heartbeat renews the lease
    # meanwhile) and before the lease's end is computed (the wait is added to it).
    parts.append(_moved(columns, "".join(f" AND (SELECT count(*) FROM document{i}) = 1"
                                         for i in range(len(documents)))))
    moved = " * ".join(
        ["(SELECT count(*) FROM moved)"]
        + [f"(SELECT count(*) FROM document{i})" for i in range(len(documents))])
    parts.append(f" SELECT {HEAD_SEQ}, (SELECT id FROM written), kernel_unmoved({moved})")
    return "".join(parts)


# A commit that only creates tasks reads nothing: it is built before anything is sent,
# on a guessed head, and written in one pipelined round trip with its BEGIN and COMMIT
# (:func:`.connection.write` with ``at_head``). Its first statement advances the head,
# which takes the session's commit order as every commit's does, writes the commit row
# with that seq and keeps it for the transaction (``set_config``); every other seq it
# writes is read back from there, a function call per row (not a subquery on the session
# row per row, whose cost grows with a burst's size). A session that does
# not exist leaves the seq null and the insert fails: nothing is written, and the usual path
# says why.
COMMIT_INSERT_AT_HEAD = (
    HEAD + " " + insert(COMMIT, " RETURNING id, seq", {"seq": f"(SELECT {KEEP_SEQ} FROM head)"})
)
TASK_INSERT_AT_HEAD = insert(TASK, "", {"created_seq": AT_HEAD, "updated_seq": AT_HEAD})


def dispatch_insert_at_head(count: int) -> str:
    """:func:`dispatch_insert` for a commit written with ``COMMIT_INSERT_AT_HEAD``."""
    return insert_rows(DISPATCH, count, " RETURNING id", {"seq": AT_HEAD})


# A commit that creates one task and its dispatch row (a client's call: an API request,
# a submission), as one statement: its own transaction, one round trip, one Bind and
# Execute where the pipelined form has six. The head update takes the session's commit
# order and gives the seq, which the commit row returns to the task and the row. The
# announcement, when the commit carries it, is sent in the same statement (Postgres
# delivers it at commit). Parameters: ``HEAD``'s, the commit row's values but its
# seq, the task's but its seqs, the row's but its seq; then the channel and the payload.
_WRITTEN_SEQ = "(SELECT seq FROM written)"
_CREATE_ONE = (
    HEAD + ", written AS ("
    + insert(COMMIT, " RETURNING id, seq", {"seq": "(SELECT head_seq FROM head)"})
    + "), created AS ("
    + insert(TASK, "", {"created_seq": _WRITTEN_SEQ, "updated_seq": _WRITTEN_SEQ})
    + "), queued AS ("
    + insert(DISPATCH, " RETURNING id", {"seq": _WRITTEN_SEQ})
    + ") SELECT written.id, written.seq, (SELECT id FROM queued)"
)
CREATE_ONE = _CREATE_ONE + " FROM written"
CREATE_ONE_ANNOUNCED = _CREATE_ONE + ", pg_notify(%s, %s) FROM written"


# A phase that ends its task, built from the holder's copy of it as an inline commit is
# (``Prefetch.known``), on the assumption that the task has no owned child and no waiter,
# and written in one pipelined round trip: BEGIN; ``HEAD_ADVANCE`` (the session's commit
# order, the seq kept for the transaction); ``inline_end``; COMMIT. The assumption is
# checked in the second statement, whose snapshot is taken once the head's lock is held:
# every commit that could have added a child or a waiter in this session is then
# visible. The task is written only if it is still as copied and alone, and ``kernel_unmoved``
# otherwise aborts (nothing is written; the commit is built again from what the database
# holds). ``HEAD_ADVANCE`` takes ``HEAD``'s; ``inline_end`` the commit row's values
# but its seq, the values of the task's changed columns but its updated_seq, its id,
# then the copy's epoch, lease owner and updated_seq.
HEAD_ADVANCE = f"{HEAD} SELECT {KEEP_SEQ} FROM head"


@functools.cache
def inline_end(columns: tuple[str, ...]) -> str:
    """The ending's statement, the task's ``columns`` written (:func:`_moved`)."""
    return (
        "WITH written AS ("
        + insert(COMMIT, " RETURNING id", {"seq": AT_HEAD})
        + "), moved AS ("
        + update(TASK, {"updated_seq": AT_HEAD}, columns)
        + " AND epoch = %s AND lease_owner = %s AND status = 'running' AND updated_seq = %s "
        f"AND NOT EXISTS (SELECT 1 FROM {TASK.name} c WHERE c.parent_id = {TASK.name}.id "
        "AND c.owned) "
        f"AND NOT EXISTS (SELECT 1 FROM {TASK.name} w "
        f"WHERE w.session_id = {TASK.name}.session_id "
        f"AND w.status = 'waiting' AND (pg_column_size(w.wait_deps) > {WAITER_BIG_DEPS} "
        f"OR w.wait_deps @> ARRAY[{TASK.name}.id]::text[])) "
        f"RETURNING 1), forgotten AS (DELETE FROM {DISPATCH.name} WHERE task_id = %s) "
        "SELECT (SELECT id FROM written), kernel_unmoved((SELECT count(*) FROM moved))"
    )

# A commit that only writes documents (no version expected) reads nothing before it is
# sent: it is built as if every document were new, and written as one statement (its own
# transaction: one round trip) in which the database numbers each document's next
# version. The head update takes the session's commit order and gives the seq. Each
# document (``wanted``: one JSON record each, in the draft's order, with ``n`` its place)
# is inserted as the build made it (version 1, its baseline), or, if it exists, continued
# under the head's row lock, as ``kernel.commit.Builder`` continues one: version + 1, the
# baseline written when its ops replace the whole value (``replacing``), ops only while
# the ops since the baseline do not outweigh it (``kernel.documents.needs_baseline``) and
# its kind's version is the stored one. A document that needs more (its value read to be
# upgraded or written whole) is not written, and ``kernel_unmoved`` then aborts the
# statement: nothing lands, and the general commit builds it from what it reads. The
# conflict's row is the newest one whatever the statement's snapshot, so a commit that
# landed while this one waited for the session's lock is continued, not lost. The commit
# row's summary is the build's, each document's item given the version the database gave.
# Parameters: the session id and the commit's time (``HEAD``), the documents as JSON,
# the commit row's values but its seq, then the number of documents. Returns, per
# document in the draft's order, its head's columns, then the commit row's id and the
# check's 1.
_WANTED = (
    "wanted AS (SELECT * FROM jsonb_to_recordset(%s::jsonb) AS w(n bigint, id text, "
    "kind text, key text, kind_version int, ops jsonb, baseline jsonb, baseline_bytes bigint, "
    "ops_bytes bigint, replacing boolean))"
)
_ASKED = "(SELECT w.{} FROM wanted w WHERE w.kind = EXCLUDED.kind AND w.key = EXCLUDED.key)"
_REPLACING, _OPS_BYTES = _ASKED.format("replacing"), _ASKED.format("ops_bytes")
_NEW_DOCUMENT = {
    "id": "w.id", "session_id": "head.id", "kind": "w.kind", "key": "w.key",
    "kind_version": "w.kind_version", "version": "1", "baseline_version": "1",
    "ops_bytes_since_baseline": "0", "baseline_bytes": "w.baseline_bytes",
    "updated_seq": "head.head_seq",
}
_CONTINUED = {
    "kind_version": "EXCLUDED.kind_version",
    "version": "d.version + 1",
    "baseline_version": f"CASE WHEN {_REPLACING} THEN d.version + 1 ELSE d.baseline_version END",
    "ops_bytes_since_baseline": (
        f"CASE WHEN {_REPLACING} THEN 0 ELSE d.ops_bytes_since_baseline + {_OPS_BYTES} END"),
    "baseline_bytes": f"CASE WHEN {_REPLACING} THEN EXCLUDED.baseline_bytes "
                      "ELSE d.baseline_bytes END",
    "updated_seq": "EXCLUDED.updated_seq",
}
assert set(_CONTINUED) == set(DOCUMENT_HEAD.updated), "a document column this does not write"
DOCUMENTS_COMMIT = (
    f"WITH head AS ({_ADVANCE} RETURNING s.id, s.head_seq), {_WANTED}, "
    f"numbered AS (INSERT INTO {DOCUMENT_HEAD.name} AS d "
    f"({', '.join(DOCUMENT_HEAD.inserted)}) SELECT "
    + ", ".join(_NEW_DOCUMENT[c] for c in DOCUMENT_HEAD.inserted)
    + " FROM head, wanted w ORDER BY w.n ON CONFLICT (session_id, kind, key) DO UPDATE SET "
    + ", ".join(f"{c} = {e}" for c, e in _CONTINUED.items())
    + f" WHERE {_REPLACING} OR (d.kind_version = EXCLUDED.kind_version AND "
    f"d.ops_bytes_since_baseline + {_OPS_BYTES} <= GREATEST(d.baseline_bytes, "
    f"{MIN_BASELINE_BYTES})) RETURNING {DOCUMENT_HEAD.qualified('d')}), "
    f"versioned AS (INSERT INTO {DOCUMENT_VERSION.name} ({', '.join(DOCUMENT_VERSION.inserted)}) "
    "SELECT "
    + ", ".join({
        "document_id": "n.id", "version": "n.version", "seq": "n.updated_seq",
        # kernel.storage.as_stored: a document's first version is its baseline alone
        "ops": "CASE WHEN n.version = 1 THEN '[]'::jsonb ELSE w.ops END",
        "baseline": "CASE WHEN n.baseline_version = n.version THEN w.baseline END",
        "has_baseline": "n.baseline_version = n.version",
    }[c] for c in DOCUMENT_VERSION.inserted)
    + " FROM numbered n JOIN wanted w ON w.kind = n.kind AND w.key = n.key), written AS ("
    + insert(COMMIT, " RETURNING id", {
        "seq": "(SELECT head_seq FROM head)",
        "summary": "(SELECT jsonb_agg(jsonb_set(s.item, ARRAY['version'], to_jsonb(n.version)) "
                   "ORDER BY s.ord) FROM jsonb_array_elements({}::jsonb) WITH ORDINALITY "
                   "AS s(item, ord) JOIN wanted w ON w.n = s.ord JOIN numbered n "
                   "ON n.kind = w.kind AND n.key = w.key)",
    })
    + "), checked AS (SELECT (SELECT id FROM written) AS commit_id, kernel_unmoved(CASE WHEN "
    "(SELECT count(*) FROM numbered) = %s THEN 1 ELSE 0 END) AS documents) "
    # The check is selected: an output nobody reads would be planned away, and with it
    # the abort.
    f"SELECT {DOCUMENT_HEAD.qualified('n')}, c.commit_id, c.documents FROM checked c "
    "LEFT JOIN numbered n ON true LEFT JOIN wanted w ON w.kind = n.kind AND w.key = n.key "
    "ORDER BY w.n"
)

# -- dispatch rows that outlived their task's runs --------------------------------------

# A task in one of these statuses has no use for a dispatch row (kernel.records.UNDISPATCHED
# but running: a running task's row is for its lease's expiry). Rows of such tasks go with
# the commit that leaves a task there (``FORGET_ROWS``, and the inline statements below);
# a claim that meets one anyway (a row that raced that commit) removes it.
DEAD_STATUSES = ", ".join(f"'{s}'" for s in sorted(UNDISPATCHED - {Status.RUNNING}))
DEAD = f"status IN ({DEAD_STATUSES})"
FORGET_ROWS = f"DELETE FROM {DISPATCH.name} WHERE task_id = {IDS}"

# A commit built from a holder's copy checks that the copy is still what the database
# holds (``kernel_unmoved``, created by migration 0012): otherwise it aborts with this
# SQLSTATE, nothing is written, and the commit is built again from what the database holds.
TASK_CHANGED = "KR001"

# -- leases ----------------------------------------------------------------------------

def task_runnable(task: str = "") -> str:
    """Whether task ``task`` (an alias of the task table; none: the table itself) is
    runnable at ``%(now)s``: :meth:`kernel.records.Task.runnable_at` in SQL, which the
    partial index ``task_runnable`` covers."""
    t = f"{task}." if task else ""
    return (f"({t}status = 'pending' OR ({t}status = 'sleeping' AND {t}wake_at <= %(now)s)"
            f" OR ({t}status = 'running' AND {t}lease_until < %(now)s))")


RUNNABLE = task_runnable()
CLAIM_SET = (
    "restarts = CASE WHEN status = 'running' THEN restarts + 1 ELSE restarts END, "
    "status = 'running', epoch = epoch + 1, lease_owner = %(owner)s, "
    "lease_until = %(until)s, wake_at = NULL"
)
# A claimed task's dispatch rows did their job; deleting them in the claim
# statement keeps the outbox to what is undelivered or unclaimed.
FORGET_DISPATCHES = (
    f"forgotten AS (DELETE FROM {DISPATCH.name} d USING claimed WHERE d.task_id = claimed.id)"
)
_CLAIMING = (
    f"claimed AS (UPDATE {TASK.name} t SET {CLAIM_SET} FROM picked WHERE t.id = picked.id "
    f"RETURNING {TASK.qualified('t')}), {FORGET_DISPATCHES}"
)
_CLAIMED = f"{_CLAIMING} SELECT * FROM claimed"
# A claim by id that finds the task ended (or waiting, or completing) removes its rows.
FORGET_DEAD = (
    f"dead AS (DELETE FROM {DISPATCH.name} d USING {TASK.name} dt WHERE d.task_id = %(id)s "
    f"AND dt.id = %(id)s AND dt.{DEAD})"
)
# What a claim's commit need not wait for: the disk. A claim is visible at once and is
# flushed by the next commit that could depend on it (the log is written in order): the
# phase's own commit, a renewal, an operator's cancel. If the server crashes before that,
# the claim is lost with nothing that depended on it: the task is as it was before (its
# dispatch row too), and the holder cannot commit under the lost epoch, which a later
# claim may hand out again, because its connection died with the server (a failed
# statement ends its phase as StorageUnavailable; nothing reconnects mid-task) and its
# renewals are fenced by owner as well. What the holder's phase did outside is then done
# again, as after any crash. Saves the claim's fsync.
UNFLUSHED = "unflushed AS (SELECT set_config('synchronous_commit', 'off', true))"
# SKIP LOCKED: a row locked by its holder's commit in progress is not claimable now,
# whatever its lease says - queueing behind it would take the task from a live
# worker the moment its commit is made.
CLAIM = (
    f"WITH {UNFLUSHED}, picked AS (SELECT t.id FROM unflushed, {TASK.name} t "
    f"WHERE t.id = %(id)s AND {RUNNABLE} FOR UPDATE OF t SKIP LOCKED), {FORGET_DEAD}, "
    f"{_CLAIMED}"
)
# The same, only for a task of one of the claimer's registered (kind, version) pairs: a
# worker claims in one round trip what it can run as stored, and reads the task only
# when this finds nothing (kernel.worker.Worker.advance).
CLAIM_VERSIONS = (
    f"WITH {UNFLUSHED}, picked AS (SELECT t.id FROM unflushed, {TASK.name} t "
    f"WHERE t.id = %(id)s AND {RUNNABLE} AND (t.kind, t.version) IN (SELECT * FROM "
    "unnest(%(kinds)s::text[], %(versions)s::int[])) FOR UPDATE OF t SKIP LOCKED), "
    f"{FORGET_DEAD}, {_CLAIMED}"
)
CLAIM_BATCH = (
    f"WITH picked AS (SELECT id FROM {TASK.name} WHERE kind = ANY(%(kinds)s) AND {RUNNABLE} "
    f"ORDER BY updated_seq LIMIT %(limit)s FOR UPDATE SKIP LOCKED), {_CLAIMED}"
)
# The outbox is the queue of a burst (DESIGN §7): the task behind one of the
# oldest due burst rows (``woken``) of the queue that is runnable and not locked by another claimer
# (who then takes it). The oldest rows are picked from the dispatch table alone (index
# ``dispatch_woken_due``; a large burst is analysed when it is marked, see
# ``ANALYZE_BURST``, or stale statistics may make the planner sort every due row), then
# their tasks are tried one at a time, in that order, each by its primary key in a
# LATERAL subquery that locks it (SKIP LOCKED) if it is runnable: that subquery cannot be
# flattened into a join, so no plan can read every runnable task. (Joined, with the task
# table's statistics from before the burst, the planner hashed every runnable task on
# each claim, a cost that grew with what was left of a batch.) The
# first task locked ends the scan, so one task is locked. Which of the window's tasks is
# taken first is a matter of fairness only: any runnable one may be. Unflushed, as CLAIM.
_BURST_WINDOW = (
    f"window_rows AS MATERIALIZED (SELECT d.id, d.task_id, d.not_before FROM {DISPATCH.name} d "
    "WHERE d.queue = %(queue)s AND d.woken AND NOT d.blocked AND d.not_before <= %(now)s "
    f"ORDER BY d.not_before, d.id LIMIT {CLAIM_WINDOW})"
)
CLAIM_BURST = (
    f"WITH {UNFLUSHED}, {_BURST_WINDOW}, "
    f"picked AS (SELECT c.id FROM unflushed, window_rows w, LATERAL (SELECT t.id FROM "
    f"{TASK.name} t WHERE t.id = w.task_id AND {RUNNABLE} FOR UPDATE SKIP LOCKED) c "
    f"LIMIT 1), {_CLAIMED}"
)
# A window in which CLAIM_BURST found nothing may hold rows that outlived their tasks'
# runs (a lapsed lease's sweep row whose holder then ended the task, a row that raced its
# task's ending). Those of the window are removed, and the claim looks again
# (``PostgresStorage.claim_burst``): a window of them cannot starve the queue. Only then,
# so that a claim that finds work pays for no status look-ups of its window.
FORGET_DEAD_BURST = (
    f"WITH {_BURST_WINDOW} DELETE FROM {DISPATCH.name} d WHERE d.id = ANY((SELECT "
    f"array_agg(w.id) FROM window_rows w LEFT JOIN LATERAL (SELECT t.status FROM {TASK.name} "
    f"t WHERE t.id = w.task_id LIMIT 1) s ON true WHERE s.status IS NULL OR s.{DEAD})"
    "::bigint[])"
)
# SKIP LOCKED: while the holder's own commit has the row, a renewal would queue and
# then write a deadline computed before it waited. Skip it; the commit extends the
# lease itself, and the next beat renews with a fresh deadline.
RENEW = (
    f"UPDATE {TASK.name} SET lease_until = GREATEST(lease_until, %s) WHERE id = (SELECT id "
    f"FROM {TASK.name} "
    "WHERE id = %s AND epoch = %s AND lease_owner = %s AND status = 'running' "
    "FOR UPDATE SKIP LOCKED)"
)
# The renewal again when RENEW found no row it could lock: it waits for a commit holding
# the row (under a lock timeout), and then reads the row as that commit left it.
RENEW_WAITING = (
    f"UPDATE {TASK.name} SET lease_until = GREATEST(lease_until, %s) "
    "WHERE id = %s AND epoch = %s AND lease_owner = %s AND status = 'running'"
)
# A draining worker gives a lease back (kernel.storage.Storage.release): fenced by owner
# and epoch like a renewal, the epoch bumped like a claim, and a dispatch row added in
# the same statement so that the sweep re-sends it if the releaser's message is lost.
RELEASE = (
    f"WITH released AS (UPDATE {TASK.name} SET epoch = epoch + 1, "
    "status = CASE WHEN %(interrupted)s THEN status ELSE 'pending' END, "
    "lease_owner = CASE WHEN %(interrupted)s THEN lease_owner END, "
    "lease_until = CASE WHEN %(interrupted)s THEN %(now)s::timestamptz END "
    "WHERE id = %(id)s AND epoch = %(epoch)s AND lease_owner = %(owner)s "
    f"AND status = 'running' RETURNING {TASK.select_list}), "
    f"queued AS (INSERT INTO {DISPATCH.name} (task_id, session_id, not_before, queue, seq) "
    "SELECT id, session_id, %(now)s, queue, 0 FROM released WHERE NOT EXISTS "
    f"(SELECT 1 FROM {DISPATCH.name} d WHERE d.task_id = released.id)) "
    "SELECT * FROM released"
)
# The leases of owners known dead end now (Storage.end_leases): as an interrupted release,
# without a dispatch row (the sweep that ends them adds it, as for any expired lease).
END_LEASES = (
    f"UPDATE {TASK.name} SET epoch = epoch + 1, lease_until = %(now)s "
    "WHERE status = 'running' AND lease_owner = ANY(%(owners)s) AND lease_until > %(now)s "
    f"RETURNING {TASK.select_list}"
)
RUNNABLE_TASKS = select(TASK, RUNNABLE, " ORDER BY updated_seq LIMIT %(limit)s")
EXPIRED_LEASES = select(
    TASK, "status = 'running' AND lease_until < %s", " ORDER BY lease_until, id LIMIT %s"
)
NEXT_WAKE = (
    "SELECT min(CASE WHEN status = 'sleeping' THEN wake_at ELSE lease_until END) "
    f"FROM {TASK.name} WHERE status IN ('sleeping', 'running')"
)

# -- conversations, entries, documents, submissions --------------------------------------

CONVERSATION_BY_ID = select(CONVERSATION, "id = %s")
CONVERSATIONS_BY_ID = select(CONVERSATION, "id = ANY(%s)")
CONVERSATION_INSERT = insert(CONVERSATION)
ENTRY_BY_ID = select(ENTRY, "id = %s")
CONVERSATION_ENTRIES = select(ENTRY, "conversation_id = %s", " ORDER BY seq, ordinal")
# The newest entry of a conversation: the top of its (conversation, seq, ordinal) index.
NEWEST_ENTRY = select(ENTRY, "conversation_id = %s", " ORDER BY seq DESC, ordinal DESC LIMIT 1")
ENTRY_INSERT = insert(ENTRY)
# A context's range (Storage.context_entries), in two statements whose bounds the planner
# sees: the latest summary covering nothing past ``upto``, found on the partial index of
# summaries (newest first); then the entries after the last one it covers, a range scan
# of the (conversation, seq, ordinal) index. Neither reads older entries.
CONTEXT_SUMMARY = select(
    ENTRY,
    f"conversation_id = %(conversation)s AND kind = '{SUMMARY}' "
    "AND ((payload->'covers'->'last'->>'seq')::bigint, "
    "(payload->'covers'->'last'->>'ordinal')::int) <= (%(upto_seq)s, %(upto_ordinal)s)",
    " ORDER BY seq DESC, ordinal DESC LIMIT 1",
)
CONTEXT_RANGE = select(
    ENTRY,
    "conversation_id = %(conversation)s AND (seq, ordinal) > (%(after_seq)s, %(after_ordinal)s) "
    f"AND (seq, ordinal) <= (%(upto_seq)s, %(upto_ordinal)s) AND kind <> '{SUMMARY}'",
    " ORDER BY seq, ordinal",
)
DOCUMENT_HEAD_BY_KEY = select(DOCUMENT_HEAD, "session_id = %s AND kind = %s AND key = %s")
DOCUMENT_HEADS_BY_KEY = select(
    DOCUMENT_HEAD,
    "session_id = %s AND (kind, key) IN (SELECT * FROM unnest(%s::text[], %s::text[]))",
)
DOCUMENT_HEAD_UPSERT = upsert(DOCUMENT_HEAD)
# From the newest baseline at or below ``upto``: all a reader needs to rebuild a value.
DOCUMENT_VERSIONS = select(
    DOCUMENT_VERSION,
    "document_id = %(doc)s AND version <= %(upto)s AND version >= (SELECT "
    f"coalesce(max(version), 0) FROM {DOCUMENT_VERSION.name} WHERE document_id = %(doc)s "
    "AND has_baseline AND version <= %(upto)s)",
    " ORDER BY version",
)
# A document's head and the versions that rebuild its current value, in one statement
# (one snapshot): no version row for a head (a document with no versions) reads as
# versions of NULLs, which the reader drops.
DOCUMENT_NOW = (
    f"SELECT {DOCUMENT_HEAD.qualified('d')}, {DOCUMENT_VERSION.qualified('v')} "
    f"FROM {DOCUMENT_HEAD.name} d LEFT JOIN {DOCUMENT_VERSION.name} v "
    "ON v.document_id = d.id AND v.version <= d.version AND v.version >= (SELECT "
    f"coalesce(max(b.version), 0) FROM {DOCUMENT_VERSION.name} b WHERE b.document_id = d.id "
    "AND b.has_baseline AND b.version <= d.version) "
    "WHERE d.session_id = %s AND d.kind = %s AND d.key = %s ORDER BY v.version"
)
# The greatest key of a kind with a prefix, passing over emptied documents (their current
# version a baseline of {}: kernel.storage.emptied), and its versions as DOCUMENT_NOW
# reads them. The range on key lets the (session, kind, key) index find the prefix.
NEWEST_DOCUMENT = (
    f"SELECT {DOCUMENT_HEAD.qualified('d')}, {DOCUMENT_VERSION.qualified('v')} FROM ("
    f"SELECT * FROM {DOCUMENT_HEAD.name} n WHERE n.session_id = %(session)s "
    "AND n.kind = %(kind)s AND n.key >= %(prefix)s AND n.key < %(prefix)s || chr(1114111) "
    "AND left(n.key, length(%(prefix)s)) = %(prefix)s AND NOT (n.baseline_version = n.version "
    f"AND EXISTS (SELECT FROM {DOCUMENT_VERSION.name} e WHERE e.document_id = n.id "
    "AND e.version = n.version AND e.has_baseline AND e.baseline = '{}'::jsonb)) "
    "ORDER BY n.key DESC LIMIT 1) d "
    f"LEFT JOIN {DOCUMENT_VERSION.name} v "
    "ON v.document_id = d.id AND v.version <= d.version AND v.version >= (SELECT "
    f"coalesce(max(b.version), 0) FROM {DOCUMENT_VERSION.name} b WHERE b.document_id = d.id "
    "AND b.has_baseline AND b.version <= d.version) ORDER BY v.version"
)
DOCUMENT_VERSION_INSERT = insert(DOCUMENT_VERSION)
SUBMISSION_BY_ID = select(SUBMISSION, "id = %s")
SUBMISSIONS_BY_ID = select(SUBMISSION, "id = ANY(%s)")
SUBMISSION_BY_REQUEST = select(SUBMISSION, "session_id = %s AND request_id = %s")
SUBMISSION_INSERT = insert(SUBMISSION)
SUBMISSION_UPDATE = update(SUBMISSION)

# -- the outbox --------------------------------------------------------------------------

# Due: never delivered, or delivered and still unclaimed after a wait that doubles with
# each delivery (``attempts``), up to 2**REDELIVERY_DOUBLINGS times ``after``.
TAKE_DUE_DISPATCHES = (
    f"WITH due AS (SELECT id FROM {DISPATCH.name} WHERE not_before <= %(now)s AND "
    "(delivered_at IS NULL OR delivered_at < %(now)s - %(after)s * "
    "power(2, LEAST(GREATEST(attempts - 1, 0), %(doublings)s))) "
    "ORDER BY id LIMIT %(limit)s FOR UPDATE SKIP LOCKED) "
    f"UPDATE {DISPATCH.name} d SET delivered_at = %(now)s, attempts = d.attempts + 1 "
    f"FROM due WHERE d.id = due.id RETURNING {DISPATCH.qualified('d')}"
)
RELEASE_DISPATCHES = (
    f"UPDATE {DISPATCH.name} SET delivered_at = NULL, attempts = GREATEST(attempts - 1, 0) "
    "WHERE id = ANY(%s)"
)
# A committer takes its rows before it sends them; unflushed: the sweep sees the take at
# once, and a take lost in a crash of the server only makes the sweep send the rows again
# (harmless: the claim decides). Keeps an fsync off the path from commit to message.
TAKE_DISPATCHES = (
    f"WITH {UNFLUSHED} UPDATE {DISPATCH.name} SET delivered_at = %s, "
    "attempts = attempts + 1 FROM unflushed WHERE id = ANY(%s) AND delivered_at IS NULL "
    "RETURNING id"
)
# An expired lease gets a fresh row, due at the expiry. A row from before the expiry (an
# earlier run's, backed off) is made fresh instead: it must not delay this recovery.
# Only while the lease is still the expired one that was read: a holder that committed or
# renewed since is alive, and a row for it could only outlive its run.
ENSURE_DISPATCH = (
    f"WITH still AS (SELECT 1 FROM {TASK.name} WHERE id = %(task)s AND status = 'running' "
    "AND lease_until <= %(at)s), "
    f"fresh AS (UPDATE {DISPATCH.name} SET not_before = %(at)s, delivered_at = NULL, "
    "attempts = 0, blocked = false WHERE task_id = %(task)s AND not_before < %(at)s "
    "AND EXISTS (SELECT 1 FROM still)) "
    f"INSERT INTO {DISPATCH.name} (task_id, session_id, not_before, queue, seq) "
    f"SELECT %(task)s, %(session)s, %(at)s, %(queue)s, 0 WHERE EXISTS (SELECT 1 FROM still) "
    f"AND NOT EXISTS (SELECT 1 FROM {DISPATCH.name} WHERE task_id = %(task)s)"
)
EXISTING_DISPATCHES = f"SELECT id FROM {DISPATCH.name} WHERE id = ANY(%s)"
MARK_BURST = f"UPDATE {DISPATCH.name} SET woken = true WHERE id = ANY(%s)"
# The burst claim's plan follows the table's statistics: while they say the burst rows
# are few (a fresh database, a burst into an empty table, before autovacuum analyses
# it), the planner sorts every due burst row on each claim instead of reading the
# first 64 from ``dispatch_woken_due`` in order, and a claim grows with the backlog
# A burst at least half as large as the table was when
# last analysed is analysed at once (once), before its queue messages are sent.
ANALYZE_BURST = 256
DISPATCH_ANALYZED_ROWS = f"SELECT reltuples FROM pg_class WHERE oid = '{DISPATCH.name}'::regclass"
ANALYZE_DISPATCH = f"ANALYZE {DISPATCH.name} (queue, not_before, woken, blocked)"
# The claim looks each burst row's task up by id: while the task table's statistics say
# it is empty too, the planner may take its runnable index, with no condition on the id,
# for that lookup (the same cost, to it), and read every runnable task per row. A burst
# at least half as large as the task table was when last analysed analyses it too.
TASK_ANALYZED_ROWS = f"SELECT reltuples FROM pg_class WHERE oid = '{TASK.name}'::regclass"
ANALYZE_TASKS = f"ANALYZE {TASK.name} (status)"
BLOCK_DISPATCHES = (
    f"UPDATE {DISPATCH.name} SET blocked = true, "
    "delivered_at = COALESCE(%s::timestamptz, delivered_at), attempts = GREATEST(attempts, %s) "
    "WHERE task_id = %s AND NOT blocked"
)


def task_blocked(task: str) -> str:
    """Whether task ``task`` (the task table or an alias of it) is blocked: it has dispatch
    rows and every one is marked blocked. A worker that finds a task blocked marks all its
    rows; a commit since that makes it runnable (an operator's migrate, say) adds a row
    of its own, for a change of the task that no worker has found blocked yet, and that
    row is delivered as any other: the task waits for a worker then, not for a deploy."""
    return (f"coalesce((SELECT bool_and(d.blocked) FROM {DISPATCH.name} d "
            f"WHERE d.task_id = {task}.id), false)")


# The tasks with a blocked row are the candidates (few): :func:`task_blocked` decides.
BLOCKED_TASKS = select(
    TASK,
    f"id IN (SELECT task_id FROM {DISPATCH.name} WHERE blocked) AND {task_blocked(TASK.name)}",
    " LIMIT %s",
)
RETRY_DISPATCHES = (
    f"UPDATE {DISPATCH.name} SET blocked = false, delivered_at = NULL, attempts = 0 "
    "WHERE task_id = ANY(%s) AND blocked"
)


DISPATCHES_PER_INSERT = 65535 // len(DISPATCH.inserted)
"""A statement takes at most 65,535 parameters: a burst's rows go in chunks of this many
(a batch of 10,000 notices is 90,000 values)."""


def dispatch_insert(count: int) -> str:
    """``count`` dispatch rows in one statement, their ids returned in order."""
    return insert_rows(DISPATCH, count, " RETURNING id")
