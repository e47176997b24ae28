"""A read-only admin over every record of the Session Store, and over the accounts.

State changes only through commits (DESIGN §5); the admin is for looking, so it
refuses add, change and delete for everyone, superusers included. Accounts and their
roles too: Django's own user and group admins would let staff holding ``change_user``
make themselves superusers. Accounts are made and changed from the shell
(``manage.py createsuperuser``, ``changepassword``, ``manage.py role``), where the
person is known to the machine.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.auth.models import Group, User
from django.http import HttpRequest

from controlplane import models
from controlplane.ui.login import AdminLogin

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


admin.site.unregister(User)
admin.site.unregister(Group)


@admin.register(User)
class UserAdmin(ReadOnlyAdmin):
    list_display = ("username", "is_active", "is_staff", "is_superuser", "last_login")
    list_filter = ("is_active", "is_staff", "is_superuser", "groups")
    search_fields = ("username", "email")
    # Never the password hash, not even read-only.
    fields = ("username", "email", "is_active", "is_staff", "is_superuser", "groups",
              "last_login", "date_joined")


@admin.register(Group)
class GroupAdmin(ReadOnlyAdmin):
    list_display = ("name",)
