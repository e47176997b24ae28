"""What the API refuses at its edge, with 422 naming the field and nothing changed: bulk
actions without a filter or the previewed count, unknown fields, values of the wrong
type, numbers and nesting beyond what the published schema allows."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from kernel import Kernel, Status

from .test_api import client_for, post, start, with_test_kinds

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def kernel(monkeypatch: pytest.MonkeyPatch) -> Kernel:
    return with_test_kinds(monkeypatch)


@pytest.fixture
def operator() -> Client:
    return client_for("olga", "operator")


def refused_naming(response: Any, field: str) -> None:
    assert response.status_code == 422, response.content
    assert field in response.content.decode(), response.content


def head(kernel: Kernel, session_id: str) -> int:
    return kernel.storage.session(session_id).head_seq


# -- point 5: bulk actions cannot hit everything by accident ----------------------------


def test_a_bulk_action_needs_a_filter_and_the_previewed_count(
    kernel: Kernel, operator: Client
) -> None:
    session_id, parent = start(kernel, "api-parent", {"n": 2})
    before = head(kernel, session_id)
    action = {"action": "cancel", "action_id": "b1", "reason": "r"}

    refused_naming(post(operator, "/api/actions/bulk/preview", {"action": "cancel"}), "filter")
    refused_naming(post(operator, "/api/actions/bulk", {**action, "expected_count": 3}),
                   "filter")
    everything = post(operator, "/api/actions/bulk", action)  # what the preview showed?
    refused_naming(everything, "expected_count")
    refused_naming(post(operator, "/api/actions/bulk",
                        {**action, "session_id": session_id}), "expected_count")
    for wrong in (True, "3", 3.0, None, -1):
        refused_naming(post(operator, "/api/actions/bulk",
                            {**action, "session_id": session_id, "expected_count": wrong}),
                       "expected_count")
    for empty in ("", None):
        refused_naming(post(operator, "/api/actions/bulk/preview",
                            {"action": "cancel", "session_id": empty}), "session_id")
    assert head(kernel, session_id) == before
    assert kernel.task(parent).status is Status.WAITING

    preview = post(operator, "/api/actions/bulk/preview",
                   {"action": "cancel", "session_id": session_id}).json()
    done = post(operator, "/api/actions/bulk",
                {**action, "session_id": session_id, "expected_count": preview["count"]})
    assert done.status_code == 200 and done.json()["count"] == 3


@pytest.mark.parametrize(
    ("url", "body", "field"),
    [
        ("/api/sessions", {"metadata": {}, "titel": "typo"}, "titel"),
        ("/api/sessions/{session}/conversations", {"fork": "x"}, "fork"),
        ("/api/sessions/{session}/submissions",
         {"conversation_id": "c", "request_id": "r", "input": {"text": "t"}, "when": "now"},
         "when"),
        ("/api/tasks/{task}/cancel", {"action_id": "a", "reason": "r", "reson": "x"}, "reson"),
        ("/api/tasks/{task}/resolve",
         {"action_id": "a", "reason": "r", "decision": "sent", "signal": "resolution-1",
          "epoch": 1, "recipt": {}}, "recipt"),
        ("/api/actions/bulk/preview", {"action": "cancel", "session": "s"}, "session"),
        ("/api/actions/bulk",
         {"action": "cancel", "kind": "k", "action_id": "a", "reason": "r",
          "expected_count": 0, "dry_run": True}, "dry_run"),
    ],
)
def test_unknown_fields_are_refused_naming_them(
    kernel: Kernel, operator: Client, url: str, body: dict[str, Any], field: str
) -> None:
    session_id, task_id = start(kernel, "api-step", {"ask": True})
    before = head(kernel, session_id)
    response = post(operator, url.format(session=session_id, task=task_id), body)
    refused_naming(response, field)
    assert head(kernel, session_id) == before
    assert operator.get("/api/sessions").json()[0]["id"] == session_id  # none created


def test_a_body_that_is_not_an_object_is_refused(kernel: Kernel, operator: Client) -> None:
    for body in ([None, None], [], "x", 1, None):
        response = operator.post("/api/sessions", json.dumps(body),
                                 content_type="application/json")
        assert response.status_code in (400, 422), (body, response.content)
    assert operator.get("/api/sessions").json() == []
