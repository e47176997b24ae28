"""An operator compacts a conversation through the API or the session page's button: one
commit naming them, a compaction task that the worker runs, the summary marked in the
transcript while every entry stays; a stale view is refused (409), a viewer is refused
(403), bad input is refused (422) naming the field, and nothing changes then."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client, override_settings

from controlplane.worker.runtime import runtime
from kernel import Draft, Scheduler, agent
from kernel.records import SUMMARY

from .clients import client_as, post
from .sessions import conversation_with_a_tool_call

JSON = Any
pytestmark = pytest.mark.django_db(transaction=True)


def newest(conversation: str) -> str:
    return runtime().kernel.entries(conversation)[-1].id


def compaction_tasks(session_id: str) -> list[str]:
    return [t.id for t in runtime().kernel.storage.session_tasks(session_id)
            if t.kind == agent.COMPACTION]


def test_an_operator_compacts_a_conversation_through_the_api() -> None:
    session_id, conversation = conversation_with_a_tool_call()
    kernel = runtime().kernel
    before = kernel.entries(conversation)
    url = f"/api/conversations/{conversation}/compact"
    answer = post(client_as("olga", "operator"), url,
                  {"action_id": "compact-1", "reason": "long",
                   "last_entry_id": newest(conversation)})
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert (body["action"], body["target"], body["replayed"]) == ("compact", conversation, False)
    [task_id] = compaction_tasks(session_id)
    assert kernel.task(task_id).input["by"] == "user:olga"
    Scheduler(kernel).run_until_idle()
    entries = kernel.entries(conversation)
    assert entries[:len(before)] == before  # every entry stays
    [summary] = [e for e in entries if e.kind == SUMMARY]
    assert summary.payload["reason"] == "operator"
    assert summary.payload["covers"]["first"]["id"] == before[0].id
    assert kernel.context(conversation)[0].id == summary.id
    # A repeat of the same action does nothing new.
    again = post(client_as("olga", "operator"), url,
                 {"action_id": "compact-1", "reason": "long", "last_entry_id": before[-1].id})
    assert again.status_code == 200 and again.json()["replayed"] is True
    assert len(compaction_tasks(session_id)) == 1
    # The page marks the summary and still shows what it covers.
    page = client_as("vic", "viewer").get(f"/sessions/{session_id}/").content.decode()
    transcript = page[page.index('id="transcript"'):page.index('id="submissions"')]
    assert "summary-mark" in transcript and f'id="entry-{summary.id}"' in transcript
    assert f'href="#entry-{before[0].id}"' in transcript
    assert "Send the notice to ana" in transcript


def test_a_stale_view_a_viewer_and_bad_input_are_refused_and_change_nothing() -> None:
    session_id, conversation = conversation_with_a_tool_call()
    url = f"/api/conversations/{conversation}/compact"
    stale = post(client_as("olga", "operator"), url,
                 {"action_id": "c-1", "reason": "r", "last_entry_id": "entry_older"})
    assert stale.status_code == 409
    assert newest(conversation) in stale.json()["detail"]
    viewer = post(client_as("vic", "viewer"), url,
                  {"action_id": "c-2", "reason": "r", "last_entry_id": newest(conversation)})
    assert viewer.status_code == 403
    missing = post(client_as("olga", "operator"), url, {"action_id": "c-3", "reason": "r"})
    assert missing.status_code == 422 and "last_entry_id" in missing.content.decode()
    unknown = post(client_as("olga", "operator"), url,
                   {"action_id": "c-4", "reason": "r", "last_entry_id": newest(conversation),
                    "force": True})
    assert unknown.status_code == 422 and "force" in unknown.content.decode()
    nowhere = post(client_as("olga", "operator"), "/api/conversations/conv_nope/compact",
                   {"action_id": "c-5", "reason": "r", "last_entry_id": "e"})
    assert nowhere.status_code == 404
    assert compaction_tasks(session_id) == []


def test_the_session_pages_button_compacts_for_an_operator_only() -> None:
    session_id, conversation = conversation_with_a_tool_call()
    operator = client_as("olga", "operator")
    page = operator.get(f"/sessions/{session_id}/").content.decode()
    assert f'id="compact-{conversation}"' in page
    assert f'name="last_entry_id" value="{newest(conversation)}"' in page
    viewer_page = client_as("vic", "viewer").get(f"/sessions/{session_id}/").content.decode()
    assert f'id="compact-{conversation}"' not in viewer_page
    form = {"action_id": "ui-compact-1", "reason": "too long",
            "last_entry_id": newest(conversation)}
    refused = client_as("vic", "viewer").post(f"/conversations/{conversation}/compact", form)
    assert refused.status_code == 403
    assert compaction_tasks(session_id) == []
    done = operator.post(f"/conversations/{conversation}/compact", form)
    assert done.status_code == 200, done.content
    assert len(compaction_tasks(session_id)) == 1


def test_a_form_without_csrf_is_refused() -> None:
    session_id, conversation = conversation_with_a_tool_call()
    client_as("olga", "operator")  # makes the operator
    client = Client(enforce_csrf_checks=True)
    client.force_login(User.objects.get(username="olga"))
    answer = client.post(f"/conversations/{conversation}/compact",
                         {"action_id": "x", "reason": "r", "last_entry_id": newest(conversation)})
    assert answer.status_code == 403
    assert compaction_tasks(session_id) == []


def test_a_compaction_asked_while_one_of_the_conversation_is_under_way_is_refused() -> None:
    """Two operators (or two tabs) saw the same newest entry and both press compact: the
    first compaction adds no entry until its summary comes, so the newest entry alone
    does not tell them apart; the second is refused (409) and no second summary of the
    same entries is asked for."""
    session_id, conversation = conversation_with_a_tool_call()
    url = f"/api/conversations/{conversation}/compact"
    seen = newest(conversation)
    first = post(client_as("olga", "operator"), url,
                 {"action_id": "c-olga", "reason": "long", "last_entry_id": seen})
    assert first.status_code == 200, first.content
    second = post(client_as("omar", "operator"), url,
                  {"action_id": "c-omar", "reason": "long too", "last_entry_id": seen})
    assert second.status_code == 409, second.content
    [running] = compaction_tasks(session_id)
    assert running in second.json()["detail"]
    again = post(client_as("olga", "operator"), url,  # a repeat is still answered
                 {"action_id": "c-olga", "reason": "long", "last_entry_id": seen})
    assert again.status_code == 200 and again.json()["replayed"] is True
    Scheduler(runtime().kernel).run_until_idle()  # it ends: the next one may go
    later = post(client_as("omar", "operator"), url,
                 {"action_id": "c-omar-2", "reason": "long", "last_entry_id": newest(conversation)})
    assert later.status_code == 200, later.content
    assert len(compaction_tasks(session_id)) == 2


def compacted_after_a_turn_asking(model: str, catalogue: dict[str, Any]) -> JSON:
    """The input of an operator's compaction of a conversation whose turn asked ``model``,
    made with ``catalogue`` as the configured models."""
    kernel = runtime().kernel
    handle = kernel.create_session(metadata={"title": model})
    draft = Draft(actor="user:test")
    conversation = draft.create_conversation()
    handle.commit(draft)
    submitted = agent.submit(handle, conversation, {"text": "hello", "model": model},
                             "req-1", actor="user:ann")
    assert submitted.outcome == "placed", submitted.reason
    with override_settings(MODELS=catalogue):
        answer = post(client_as("olga", "operator"),
                      f"/api/conversations/{conversation}/compact",
                      {"action_id": f"compact-{model}", "reason": "long",
                       "last_entry_id": newest(conversation)})
    assert answer.status_code == 200, answer.content
    [task_id] = compaction_tasks(handle.id)
    return kernel.task(task_id).input


def test_an_operators_compaction_uses_the_model_the_conversations_latest_turn_asks() -> None:
    """Its window is the one the conversation's requests are measured against and its
    summary is asked of that model, not of the default one."""
    models = {**settings.MODELS, "mini": settings.MODELS["scripted"]}
    assert compacted_after_a_turn_asking("mini", models)["model"] == "mini"


def test_an_operators_compaction_of_a_conversation_whose_model_is_gone_uses_the_default(
) -> None:
    """A model the catalogue no longer holds cannot summarize: the compaction asks the
    default one, as one of a conversation whose turns named none."""
    assert "model" not in compacted_after_a_turn_asking("mini", dict(settings.MODELS))
