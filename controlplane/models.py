"""The Session Store in Postgres (DESIGN §3).

These models define the schema and serve the admin and the API's ordinary reads.
The hot paths - commit, claim, feed reads - are explicit SQL in
:mod:`controlplane.storage`, which is why every table has a short ``db_table``.
Rows are written only through commits; nothing here has save() logic.
"""

from __future__ import annotations

from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import GinIndex
from django.db import models


class Session(models.Model):
    id = models.TextField(primary_key=True)
    head_seq = models.BigIntegerField(default=0)
    created_at = models.DateTimeField()
    metadata = models.JSONField(default=dict)

    class Meta:
        db_table = "kernel_session"


class Conversation(models.Model):
    id = models.TextField(primary_key=True)
    session = models.ForeignKey(Session, on_delete=models.CASCADE)
    created_seq = models.BigIntegerField()
    fork_of = models.TextField(null=True)
    fork_entry_id = models.TextField(null=True)

    class Meta:
        db_table = "kernel_conversation"


class Entry(models.Model):
    id = models.TextField(primary_key=True)
    session = models.ForeignKey(Session, on_delete=models.CASCADE)
    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE)
    seq = models.BigIntegerField()
    ordinal = models.IntegerField()
    kind = models.TextField()
    payload = models.JSONField()
    actor = models.TextField()
    created_at = models.DateTimeField()

    class Meta:
        db_table = "kernel_entry"
        indexes = [models.Index(fields=["conversation", "seq", "ordinal"])]


class Document(models.Model):
    id = models.TextField(primary_key=True)
    session = models.ForeignKey(Session, on_delete=models.CASCADE)
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


class DocumentVersion(models.Model):
    id = models.BigAutoField(primary_key=True)
    document = models.ForeignKey(Document, on_delete=models.CASCADE)
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


class Task(models.Model):
    id = models.TextField(primary_key=True)
    session = models.ForeignKey(Session, on_delete=models.CASCADE)
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
        ]


class Submission(models.Model):
    id = models.TextField(primary_key=True)
    session = models.ForeignKey(Session, on_delete=models.CASCADE)
    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE)
    request_id = models.TextField()
    input = models.JSONField()
    status = models.TextField()
    created_seq = models.BigIntegerField()
    updated_seq = models.BigIntegerField()
    answer_entry_id = models.TextField(null=True)
    reason = models.TextField(null=True)
    resubmit_of = models.TextField(null=True)

    class Meta:
        db_table = "kernel_submission"
        constraints = [
            models.UniqueConstraint(
                fields=["session", "request_id"], name="submission_request_once"
            )
        ]


class Commit(models.Model):
    """The change feed: one row per commit, gapless ``seq`` per session."""

    id = models.BigAutoField(primary_key=True)
    session = models.ForeignKey(Session, on_delete=models.CASCADE)
    seq = models.BigIntegerField()
    at = models.DateTimeField()
    actor = models.TextField()
    summary = models.JSONField()
    key = models.TextField(null=True)

    class Meta:
        db_table = "kernel_commit"
        constraints = [
            models.UniqueConstraint(fields=["session", "seq"], name="commit_seq_once"),
            models.UniqueConstraint(
                fields=["session", "key"],
                name="commit_key_once",
                condition=models.Q(key__isnull=False),
            ),
        ]


class Dispatch(models.Model):
    """Outbox: delivered to Celery after its commit, re-sent by the sweep until then."""

    id = models.BigAutoField(primary_key=True)
    task_id = models.TextField()
    session_id = models.TextField()
    not_before = models.DateTimeField()
    queue = models.TextField()
    seq = models.BigIntegerField()
    delivered_at = models.DateTimeField(null=True)

    class Meta:
        db_table = "kernel_dispatch"
        indexes = [models.Index(fields=["not_before"]), models.Index(fields=["task_id"])]


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
