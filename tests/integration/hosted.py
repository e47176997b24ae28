"""A hosted agent's session and operator for the tests that drive one through the
product (shared by the hosted-agent tests)."""

from __future__ import annotations

from django.contrib.auth.models import Group, User

from controlplane.worker.runtime import runtime
from kernel import Draft


def operator() -> User:
    user = User.objects.create_user("olga", password="pw")
    user.groups.add(Group.objects.get_or_create(name="operator")[0])
    return user


def conversation() -> tuple[str, str]:
    handle = runtime().kernel.create_session(metadata={"title": "support"})
    draft = Draft(actor="user:test")
    conversation_id = draft.create_conversation()
    handle.commit(draft)
    return handle.id, conversation_id
