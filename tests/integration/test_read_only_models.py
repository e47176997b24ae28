"""The Django models are a read-only mirror: kernel_* rows change only through commits."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.contrib.auth.models import User
from django.test import Client

from controlplane import models
from controlplane.models import ReadOnlyRecord
from controlplane.storage import PostgresStorage
from kernel import Draft, Kernel, Registry, Run, TaskDefinition, Transition

pytestmark = pytest.mark.django_db(transaction=True)


def _never_run(run: Run) -> Transition:
    raise AssertionError("only stored, never run")


@pytest.fixture
def task_id() -> str:
    registry = Registry()
    registry.add(TaskDefinition(kind="t.step", version=1, phases={"a": _never_run}, initial="a"))
    handle = Kernel(PostgresStorage(), registry).create_session()
    draft = Draft(actor="test")
    created = draft.create_task("t.step", {"n": 1})
    handle.commit(draft)
    return created


def test_orm_writes_to_kernel_tables_raise(task_id: str) -> None:
    row = models.Task.objects.get(id=task_id)
    with pytest.raises(ReadOnlyRecord, match="kernel_task is written only by kernel commits"):
        row.save()
    with pytest.raises(ReadOnlyRecord):
        row.delete()
    with pytest.raises(ReadOnlyRecord):
        models.Task.objects.filter(id=task_id).update(phase="x")
    with pytest.raises(ReadOnlyRecord):
        models.Task.objects.filter(id=task_id).delete()
    with pytest.raises(ReadOnlyRecord):
        models.Session.objects.create(id="s_x", created_at=datetime.now(UTC))
    with pytest.raises(ReadOnlyRecord):
        models.Dispatch.objects.bulk_create([])
    assert models.Task.objects.get(id=task_id).phase == row.phase  # nothing changed


def test_control_plane_models_stay_writable() -> None:
    user = User.objects.create_user("owner")
    token = models.ApiToken.objects.create(user=user, name="ci", digest="0" * 64)
    models.ApiToken.objects.filter(pk=token.pk).update(name="ci2")
    token.delete()


def test_admin_shows_kernel_records_and_refuses_changes(task_id: str) -> None:
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="x"))
    assert client.get("/admin/controlplane/task/").status_code == 200
    assert task_id in client.get(f"/admin/controlplane/task/{task_id}/change/").content.decode()
    assert client.get("/admin/controlplane/task/add/").status_code == 403
    assert client.post(f"/admin/controlplane/task/{task_id}/delete/").status_code == 403
