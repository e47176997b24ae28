"""A read-only admin over every record of the Session Store.

State changes only through commits (DESIGN §5); the admin is for looking, so it
refuses add, change and delete for everyone, superusers included.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from . import models
from .ui.login import AdminLogin

admin.site.login_form = AdminLogin  # throttled like the dashboard's login


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(models.Session)
class SessionAdmin(ReadOnlyAdmin):
    list_display = ("id", "head_seq", "created_at")


@admin.register(models.Task)
class TaskAdmin(ReadOnlyAdmin):
    list_display = ("id", "kind", "status", "phase", "restarts", "lease_owner", "updated_seq")
    list_filter = ("status", "kind")
    search_fields = ("id", "session__id", "parent_id")


@admin.register(models.Commit)
class CommitAdmin(ReadOnlyAdmin):
    list_display = ("session", "seq", "at", "actor")
    search_fields = ("session__id", "actor")


@admin.register(models.Entry)
class EntryAdmin(ReadOnlyAdmin):
    list_display = ("id", "conversation", "seq", "ordinal", "kind", "actor")


@admin.register(models.Document)
class DocumentAdmin(ReadOnlyAdmin):
    list_display = ("session", "kind", "key", "version", "baseline_version")


for model in (models.Conversation, models.DocumentVersion, models.Submission, models.Dispatch):
    admin.site.register(model, ReadOnlyAdmin)
