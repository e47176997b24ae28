"""The Session Store in Postgres (DESIGN §3).

These models are the schema's one definition (the migration source; the storage
derives its columns and row mapping from them, see :mod:`controlplane.storage.schema`)
and a read-only mirror for the admin and the control plane's reads. The hot paths -
commit, claim, feed reads - are explicit SQL in :mod:`controlplane.storage`, which is
why every table has a short ``db_table``.

Rows of the ``kernel_*`` tables are written only through kernel commits: every model
here but :class:`ApiToken` is a :class:`KernelRecord`, whose ``save``, ``delete`` and
queryset writes (``update``, ``delete``, ``create``, ``bulk_create``, ...) raise
:class:`ReadOnlyRecord`.
"""

from __future__ import annotations

from typing import Any, NoReturn

from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import BrinIndex, GinIndex
from django.db import models


class ReadOnlyRecord(Exception):
    """An ORM write to a kernel table: those rows change only through kernel commits."""


def _refuse(model: type[models.Model], action: str) -> NoReturn:
    raise ReadOnlyRecord(
        f"{model.__name__}.{action}: {model._meta.db_table} is written only by kernel "
        "commits (controlplane.models is a read-only mirror); go through the kernel "
        "(SessionHandle.commit, the control-plane commands) instead"
    )


class ReadOnlyQuerySet(models.QuerySet):
    """Reads as usual; every write refuses (the per-row ones through ``save``/``delete``)."""

    def update(self, **kwargs: Any) -> NoReturn:
        _refuse(self.model, "objects.update")

    def delete(self) -> NoReturn:
        _refuse(self.model, "objects.delete")

    def _raw_delete(self, using: Any) -> NoReturn:  # a cascade's fast path
        _refuse(self.model, "objects.delete")

    def bulk_create(self, objs: Any, *args: Any, **kwargs: Any) -> NoReturn:
        _refuse(self.model, "objects.bulk_create")

    def bulk_update(self, objs: Any, *args: Any, **kwargs: Any) -> NoReturn:
        _refuse(self.model, "objects.bulk_update")

    def update_or_create(self, *args: Any, **kwargs: Any) -> NoReturn:
        _refuse(self.model, "objects.update_or_create")


class KernelRecord(models.Model):
    """A read-only mirror of a ``kernel_*`` table (see the module docstring)."""

    objects = ReadOnlyQuerySet.as_manager()

    class Meta:
        abstract = True

    def save(self, *args: Any, **kwargs: Any) -> NoReturn:  # create() and get_or_create() too
        _refuse(type(self), "save")

    def delete(self, *args: Any, **kwargs: Any) -> NoReturn:
        _refuse(type(self), "delete")


class Session(KernelRecord):
    id = models.TextField(primary_key=True)
    head_seq = models.BigIntegerField(default=0)
    created_at = models.DateTimeField()
    metadata = models.JSONField(default=dict)
    pruned_seq = models.BigIntegerField(default=0, db_default=0)
    last_commit_at = models.DateTimeField(null=True)

    class Meta:
        db_table = "kernel_session"


class Conversation(KernelRecord):
    id = models.TextField(primary_key=True)
    session = models.ForeignKey(Session, on_delete=models.CASCADE)
    created_seq = models.BigIntegerField()
    fork_of = models.TextField(null=True)
    fork_entry_id = models.TextField(null=True)

    class Meta:
        db_table = "kernel_conversation"


class Entry(KernelRecord):
    id = models.TextField(primary_key=True)
    session = models.ForeignKey(Session, on_delete=models.CASCADE)
    # No index of its own: the (conversation, seq, ordinal) index leads with it, and one
    # on the conversation alone tempts the planner to filter a whole conversation where
    # a context read wants the range after its latest summary.
    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, db_index=False)
    seq = models.BigIntegerField()
    ordinal = models.IntegerField()
    kind = models.TextField()
    payload = models.JSONField()
    actor = models.TextField()
    created_at = models.DateTimeField()

    class Meta:
        db_table = "kernel_entry"
        indexes = [
            models.Index(fields=["conversation", "seq", "ordinal"]),
            # A context starts at its conversation's latest summary: one probe of this.
            models.Index(
                fields=["conversation", "seq", "ordinal"],
                condition=models.Q(kind="summary"),
                name="kernel_entry_summaries",
            ),
        ]


class Artifact(KernelRecord):
    """A large value stored once, named by its content's hash (:mod:`kernel.artifacts`);
    records hold references to it. Written in one statement, complete or not at all."""

    digest = models.TextField(primary_key=True)
    data = models.BinaryField()
    media_type = models.TextField()
    size = models.BigIntegerField()
    created_at = models.DateTimeField()

    class Meta:
        db_table = "kernel_artifact"


class Document(KernelRecord):
    id = models.TextField(primary_key=True)
    # No index of its own: the (session, kind, key) constraint's index leads with it.
    session = models.ForeignKey(Session, on_delete=models.CASCADE, db_index=False)
    kind = models.TextField()
    key = models.TextField()
    kind_version = models.IntegerField()
    version = models.BigIntegerField()
    baseline_version = models.BigIntegerField()
    ops_bytes_since_baseline = models.BigIntegerField()
    baseline_bytes = models.BigIntegerField()
    updated_seq = models.BigIntegerField()

    class Meta:
        db_table = "kernel_document"
        constraints = [
            models.UniqueConstraint(fields=["session", "kind", "key"], name="document_identity")
        ]


class DocumentVersion(KernelRecord):
    id = models.BigAutoField(primary_key=True)
    # No index of its own: the (document, version) constraint's index leads with it.
    document = models.ForeignKey(Document, on_delete=models.CASCADE, db_index=False)
    version = models.BigIntegerField()
    seq = models.BigIntegerField()
    ops = models.JSONField()
    baseline = models.JSONField(null=True)
    has_baseline = models.BooleanField()

    class Meta:
        db_table = "kernel_document_version"
        constraints = [
            models.UniqueConstraint(fields=["document", "version"], name="document_version_once")
        ]


class Task(KernelRecord):
    id = models.TextField(primary_key=True)
    # No index of its own: the (session, created_seq) index leads with it.
    session = models.ForeignKey(Session, on_delete=models.CASCADE, db_index=False)
    kind = models.TextField()
    version = models.IntegerField()
    input = models.JSONField()
    status = models.TextField()
    phase = models.TextField()
    checkpoint = models.JSONField()
    created_seq = models.BigIntegerField()
    updated_seq = models.BigIntegerField()
    parent_id = models.TextField(null=True)
    owned = models.BooleanField(default=False)
    wait = models.JSONField(null=True)
    wait_deps = ArrayField(models.TextField(), default=list)
    wake_at = models.DateTimeField(null=True)
    signals = models.JSONField(default=dict)
    cancel = models.JSONField(null=True)
    outcome = models.JSONField(null=True)
    restarts = models.IntegerField(default=0)
    epoch = models.BigIntegerField(default=0)
    lease_owner = models.TextField(null=True)
    lease_until = models.DateTimeField(null=True)
    queue = models.TextField(default="default")
    trace = models.JSONField(null=True)
    run = models.IntegerField(default=0)

    class Meta:
        db_table = "kernel_task"
        indexes = [
            models.Index(fields=["session", "created_seq"]),
            models.Index(fields=["parent_id"]),
            models.Index(
                fields=["status"],
                name="task_runnable",
                condition=models.Q(status__in=["pending", "sleeping", "running"]),
            ),
            GinIndex(fields=["wait_deps"], name="task_wait_deps"),
            # The tasks page's search by a word of the input, ``(input)::text ILIKE``,
            # uses the trigram index ``task_input_trgm`` where the server has pg_trgm
            # (storage/search.py), and ended tasks by outcome the partial index
            # ``task_outcome_kind``: both made in migration 0006 (Django cannot say an
            # expression with an operator class here).
            # A task that ends looks for its waiters in its session: only the waiting
            # ones, so that a batch of n tasks does not scan n rows per task.
            models.Index(
                fields=["session_id"], name="task_waiting", condition=models.Q(status="waiting")
            ),
        ]


class Submission(KernelRecord):
    id = models.TextField(primary_key=True)
    # No index of its own: the (session, request_id) constraint's index leads with it.
    session = models.ForeignKey(Session, on_delete=models.CASCADE, db_index=False)
    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE)
    request_id = models.TextField()
    input = models.JSONField()
    status = models.TextField()
    created_seq = models.BigIntegerField()
    updated_seq = models.BigIntegerField()
    answer_entry_id = models.TextField(null=True)
    reason = models.TextField(null=True)
    resubmit_of = models.TextField(null=True)
    resubmits = models.IntegerField(default=0)

    class Meta:
        db_table = "kernel_submission"
        constraints = [
            models.UniqueConstraint(
                fields=["session", "request_id"], name="submission_request_once"
            )
        ]


class Commit(KernelRecord):
    """The change feed: one row per commit, gapless ``seq`` per session.

    The table is partitioned by ``at`` (range, by day or month: KERNEL_COMMIT_PARTITION;
    :mod:`controlplane.storage.partitions`), so that retention drops old partitions
    whole. Postgres requires every unique constraint of a partitioned table to contain
    the partition key: the database's primary key is ``(id, at)`` and the constraints
    below end with ``at``. ``id`` stays this model's primary key for the ORM: it is
    unique all the same, drawn from one sequence. What keeps ``seq`` and ``key`` unique
    per session is the session row lock every commit takes before it reads the head or
    looks a key up (storage.statements.SESSION_ADVANCE); the constraints are the
    backstop within a partition.
    """

    id = models.BigAutoField(primary_key=True)
    # No index of its own: the (session, seq, at) constraint's index leads with it.
    session = models.ForeignKey(Session, on_delete=models.CASCADE, db_index=False)
    seq = models.BigIntegerField()
    at = models.DateTimeField()
    actor = models.TextField()
    summary = models.JSONField()
    key = models.TextField(null=True)

    class Meta:
        db_table = "kernel_commit"
        constraints = [
            models.UniqueConstraint(fields=["session", "seq", "at"], name="commit_seq_once"),
            models.UniqueConstraint(
                fields=["session", "key", "at"],
                name="commit_key_once",
                condition=models.Q(key__isnull=False),
            ),
        ]
        # The charts read the last hour by time; commits are appended in time order, so
        # a BRIN index (a few pages, next to nothing per insert) finds it.
        indexes = [BrinIndex(fields=["at"], name="commit_at_brin")]


class Dispatch(KernelRecord):
    """Outbox: delivered to Celery after its commit, re-sent by the sweep until then."""

    id = models.BigAutoField(primary_key=True)
    task_id = models.TextField()
    session_id = models.TextField()
    not_before = models.DateTimeField()
    queue = models.TextField()
    seq = models.BigIntegerField()
    delivered_at = models.DateTimeField(null=True)
    attempts = models.IntegerField(default=0, db_default=0)
    blocked = models.BooleanField(default=False, db_default=False)
    woken = models.BooleanField(default=False, db_default=False)

    class Meta:
        db_table = "kernel_dispatch"
        indexes = [
            models.Index(fields=["not_before"]),
            models.Index(fields=["task_id"]),
            # A queue message's worker claims its queue's oldest due burst row
            # (storage.claim_burst): an index range scan that stops at the first, however
            # long the backlog.
            models.Index(
                fields=["queue", "not_before", "id"],
                name="dispatch_woken_due",
                condition=models.Q(woken=True, blocked=False),
            ),
        ]


class Worker(models.Model):
    """A Celery worker process as it last said: written by the worker itself every few
    seconds (:mod:`controlplane.worker.heartbeats`), read by the Workers page and the API.
    A control-plane table, not a kernel record: no commit writes it."""

    id = models.TextField(primary_key=True)
    """``host:pid``, the kernel's lease owner for this process."""
    name = models.TextField()
    """Celery's node name (``name@host``)."""
    host = models.TextField()
    pid = models.IntegerField()
    queues = ArrayField(models.TextField(), default=list)
    concurrency = models.IntegerField(default=1)
    in_flight = models.IntegerField(default=0)
    processed_last_minute = models.IntegerField(default=0)
    failed_last_minute = models.IntegerField(default=0)
    processed_total = models.BigIntegerField(default=0)
    failed_total = models.BigIntegerField(default=0)
    started_at = models.DateTimeField()
    last_heartbeat = models.DateTimeField()
    stopped_at = models.DateTimeField(null=True)
    """Set when it shut down cleanly; a killed worker just stops beating."""

    class Meta:
        db_table = "controlplane_worker"
        indexes = [models.Index(fields=["last_heartbeat"])]


class ApiToken(models.Model):
    """A bearer token for programs. Only its SHA-256 is stored; the key is shown once."""

    user = models.ForeignKey("auth.User", on_delete=models.CASCADE, related_name="api_tokens")
    name = models.TextField()
    digest = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True)
    # None: never expires. A revoked token is kept (listed, refused) rather than deleted.
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    # Who issued and who revoked it, as the audit names people (``user:olga``,
    # ``shell:root``); empty: not recorded (issued before this was kept).
    issued_by = models.TextField(default="", blank=True)
    revoked_by = models.TextField(default="", blank=True)

    class Meta:
        db_table = "controlplane_api_token"


class LoginFailure(models.Model):
    """A failed login, by account (``user:<name>``) or by address (``addr:<ip>``), kept
    for ``LOGIN_THROTTLE_SECONDS`` to throttle password guessing (controlplane.access)."""

    key = models.CharField(max_length=200)
    at = models.DateTimeField()

    class Meta:
        db_table = "controlplane_login_failure"
        indexes = [models.Index(fields=["key", "at"])]


class BulkAction(models.Model):
    """An operator's bulk action under its action id: the exact set of tasks it acts on
    (the ids its preview found, named by their digest) and, once done, what it did to
    each. A control-plane table, not a kernel record: each task's action is its own
    commit in its session; this row is what answers a repeat of the request
    (:func:`controlplane.commands.bulk_act`)."""

    action_id = models.TextField(primary_key=True)
    action = models.TextField()
    digest = models.CharField(max_length=64)
    task_ids = ArrayField(models.TextField())
    by = models.TextField()
    reason = models.TextField()
    at = models.DateTimeField()
    seen = ArrayField(models.BigIntegerField(), null=True)
    """What the preview found of each task, in ``task_ids``' order (its ``updated_seq``
    for a retry, its ``run`` for a cancel: :data:`controlplane.reads.tasks.NAMED_BY`):
    each task is acted on only as it was then. Null: no task is named so."""
    results = models.JSONField(null=True)
    """One object per task (``task_id``, ``ok``, ``detail``, ``seq``); null while it runs,
    or if the process acting on it died: a repeat then finishes the set."""

    class Meta:
        db_table = "controlplane_bulk_action"
