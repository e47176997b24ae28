"""What the API refuses at its edge, with 422 naming the field and nothing changed: bulk
actions without a filter or the previewed count, unknown fields, values of the wrong
type, numbers and nesting beyond what the published schema allows."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from controlplane.api.types import NOT_BLANK
from controlplane.reads.tasks import digest
from kernel import Kernel, Status
from kernel.commit import operations_log_id

from .api_kinds import start
from .clients import post

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("kernel")]


def refused_naming(response: Any, field: str) -> None:
    assert response.status_code == 422, response.content
    assert field in response.content.decode(), response.content


NO_TASKS = digest([])


def head(kernel: Kernel, session_id: str) -> int:
    return kernel.storage.session(session_id).head_seq


# -- point 5: bulk actions cannot hit everything by accident ----------------------------


def test_a_bulk_action_needs_a_filter_and_the_previewed_count_and_digest(
    kernel: Kernel, operator: Client
) -> None:
    session_id, parent = start(kernel, "api-parent", {"n": 2})
    before = head(kernel, session_id)
    some = "0" * 64
    action = {"action": "cancel", "action_id": "b1", "reason": "r", "expected_digest": some}

    refused_naming(post(operator, "/api/actions/bulk/preview", {"action": "cancel"}), "filter")
    refused_naming(post(operator, "/api/actions/bulk", {**action, "expected_count": 3}),
                   "filter")
    everything = post(operator, "/api/actions/bulk", action)  # what the preview showed?
    refused_naming(everything, "expected_count")
    refused_naming(post(operator, "/api/actions/bulk",
                        {**action, "session_id": session_id}), "expected_count")
    for wrong in (True, "3", 2.5, None, -1, 10**20):
        refused_naming(post(operator, "/api/actions/bulk",
                            {**action, "session_id": session_id, "expected_count": wrong}),
                       "expected_count")
    for wrong in ("", "0" * 63, "A" * 64, "g" * 64, 7, None):
        refused_naming(post(operator, "/api/actions/bulk",
                            {**action, "session_id": session_id, "expected_count": 3,
                             "expected_digest": wrong}), "expected_digest")
    bare = {k: v for k, v in action.items() if k != "expected_digest"}
    refused_naming(post(operator, "/api/actions/bulk",
                        {**bare, "session_id": session_id, "expected_count": 3}),
                   "expected_digest")
    unlike = post(operator, "/api/actions/bulk",  # well formed, not the preview's: 409
                  {**action, "session_id": session_id, "expected_count": 3})
    assert unlike.status_code == 409, unlike.content
    for empty in ("", None):
        refused_naming(post(operator, "/api/actions/bulk/preview",
                            {"action": "cancel", "session_id": empty}), "session_id")
    assert head(kernel, session_id) == before
    assert kernel.task(parent).status is Status.WAITING

    preview = post(operator, "/api/actions/bulk/preview",
                   {"action": "cancel", "session_id": session_id}).json()
    done = post(operator, "/api/actions/bulk",
                {**action, "session_id": session_id, "expected_count": preview["count"],
                 "expected_digest": preview["digest"]})
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
          "expected_count": 0, "expected_digest": digest([]), "dry_run": True}, "dry_run"),
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


# -- the schemathesis acceptance's targeted cases: numbers, nesting, date-times ----------


@pytest.mark.parametrize(
    ("url", "parameter"),
    [
        ("/api/tasks?offset={n}", "offset"),
        ("/api/tasks?limit={n}", "limit"),
        ("/api/sessions?limit={n}", "limit"),
        ("/api/sessions/{session}/documents/email-plan/p?version={n}", "version"),
        ("/api/sessions/{session}/changes?after={n}", "after"),
        ("/api/sessions/{session}/changes?limit={n}", "limit"),
        ("/api/changes?after_id={n}", "after_id"),
        ("/api/conversations/c/entries?after={n}.0", "after"),
        ("/api/conversations/c/entries?after=1.{n}", "after"),
    ],
)
@pytest.mark.parametrize("n", [10**20, -(10**20)])
def test_huge_numbers_in_the_query_are_refused_naming_the_parameter(
    kernel: Kernel, operator: Client, url: str, parameter: str, n: int
) -> None:
    session_id, _ = start(kernel, "api-step", {"sleep": True})
    refused_naming(operator.get(url.format(session=session_id, n=n)), parameter)


@pytest.mark.parametrize("value", ["0.5", "1700000000", "2026-01-31", "2026-01-31T12:00:00",
                                   "tomorrow", "2026-13-01T00:00:00Z"])
def test_date_times_in_the_query_are_rfc_3339_or_refused(operator: Client, value: str) -> None:
    refused_naming(operator.get("/api/tasks", {"until": value}), "until")
    refused_naming(operator.get("/api/tasks", {"since": value}), "since")


def test_date_times_at_the_ends_of_the_calendar_are_read(operator: Client) -> None:
    for value in ("0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-23:59",
                  "2026-01-31T12:00:00.123456789Z", "2026-01-31t12:00:00z"):
        assert operator.get("/api/tasks", {"since": value}).status_code == 200, value


@pytest.mark.parametrize("value", ["yes", "1", "0", "True", "on"])
def test_query_booleans_are_true_or_false(operator: Client, value: str) -> None:
    refused_naming(operator.get("/api/tasks", {"blocked": value}), "blocked")
    assert operator.get("/api/tasks", {"blocked": "false"}).status_code == 200


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


@pytest.mark.parametrize("depth", [8, 50, 900, 100_000])
def test_json_nested_deeper_than_the_schema_allows_is_refused(
    operator: Client, depth: int
) -> None:
    deep = '{"k": ' + "[" * depth + "1" + "]" * depth + "}"  # depth + 1 levels
    for body in ('{"metadata": ' + deep + "}", '{"metadata": {}, "other": ' + deep + "}"):
        response = operator.post("/api/sessions", body, content_type="application/json")
        assert response.status_code in (400, 422), (depth, response.content[:200])
        if depth < 900:  # parsed: the schema's checks name the field
            assert b"metadata" in response.content or b"other" in response.content
    assert operator.get("/api/sessions").json() == []


def test_json_as_deep_as_the_schema_allows_is_stored(operator: Client) -> None:
    metadata = {"deep": nested(7)}  # the metadata object itself is the 8th level
    created = post(operator, "/api/sessions", {"metadata": metadata})
    assert created.status_code == 201 and created.json()["metadata"] == metadata


@pytest.mark.parametrize("number", ["1e400", "-1e400", str(10**400)])
def test_numbers_beyond_a_double_are_refused(operator: Client, number: str) -> None:
    response = operator.post("/api/sessions", '{"metadata": {"n": ' + number + "}}",
                             content_type="application/json")
    assert response.status_code in (400, 422), response.content
    assert operator.get("/api/sessions").json() == []


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"action": "retry", "kind": "k", "action_id": "a", "reason": "r",
          "expected_digest": NO_TASKS, "expected_count": True}, "expected_count"),
        ({"action": "retry", "kind": "k", "action_id": "a", "reason": "r",
          "expected_digest": NO_TASKS, "expected_count": "0"}, "expected_count"),
        ({"action": "retry", "kind": "k", "action_id": "a", "reason": "r",
          "expected_digest": NO_TASKS, "expected_count": 0.5}, "expected_count"),
        ({"action": "retry", "kind": 7, "action_id": "a", "reason": "r",
          "expected_digest": NO_TASKS, "expected_count": 0}, "kind"),
        ({"action": "retry", "kind": "k", "action_id": ["a"], "reason": "r",
          "expected_digest": NO_TASKS, "expected_count": 0}, "action_id"),
    ],
)
def test_a_bulk_body_with_a_wrong_field_type_is_refused(
    operator: Client, body: dict[str, Any], field: str
) -> None:
    refused_naming(post(operator, "/api/actions/bulk", body), field)


def test_a_json_integer_may_be_written_with_a_fraction_of_zero(
    kernel: Kernel, operator: Client
) -> None:
    session_id, task_id = start(kernel, "api-step", {"sleep": True})
    answer = post(operator, "/api/actions/bulk",
                  {"action": "cancel", "session_id": session_id, "action_id": "a",
                   "reason": "r", "expected_count": 1.0,
                   "expected_digest": digest([(task_id, 0)])})
    assert answer.status_code == 200 and answer.json()["count"] == 1


# -- point 7: the operations log is written by operators' actions only --------------------


def test_the_operations_log_refuses_submissions_and_forks(
    kernel: Kernel, operator: Client
) -> None:
    session_id, task_id = start(kernel, "api-step", {"sleep": True})
    woken = post(operator, f"/api/tasks/{task_id}/wake",
                 {"action_id": "w", "reason": "now",
                  "expected_seq": kernel.task(task_id).updated_seq})
    assert woken.status_code == 200, woken.content
    log = operations_log_id(session_id)
    [logged] = kernel.entries(log)
    before = head(kernel, session_id)
    submitted = post(operator, f"/api/sessions/{session_id}/submissions",
                     {"conversation_id": log, "request_id": "r1", "input": {"text": "forged"}})
    refused_naming(submitted, "conversation_id")
    assert b"operations log" in submitted.content
    forked = post(operator, f"/api/sessions/{session_id}/conversations",
                  {"fork_of": log, "fork_entry_id": logged.id})
    refused_naming(forked, "fork_of")
    assert head(kernel, session_id) == before
    assert kernel.entries(log) == [logged]
    assert operator.get(f"/api/sessions/{session_id}/submissions").json() == []


# -- point 7: model options are allow-listed ----------------------------------------------


@pytest.mark.parametrize(
    ("input", "field"),
    [
        ({"text": "t", "options": {"model": "expensive"}}, "options.model"),
        ({"text": "t", "options": {"n": 20}}, "options.n"),
        ({"text": "t", "options": {"temperature": 9}}, "options.temperature"),
        ({"text": "t", "options": {"max_tokens": "many"}}, "options.max_tokens"),
        ({"text": "t", "options": ["temperature"]}, "options"),
        ({"text": "t", "model": 7}, "model"),
    ],
)
def test_model_options_outside_the_allow_list_are_refused_naming_them(
    kernel: Kernel, operator: Client, input: dict[str, Any], field: str
) -> None:
    session_id = post(operator, "/api/sessions", {}).json()["id"]
    conversation = post(operator, f"/api/sessions/{session_id}/conversations", {}).json()["id"]
    before = head(kernel, session_id)
    refused_naming(post(operator, f"/api/sessions/{session_id}/submissions",
                        {"conversation_id": conversation, "request_id": "r", "input": input}),
                   field)
    assert head(kernel, session_id) == before
    allowed = {"text": "t", "options": {"temperature": 0.7, "max_tokens": 100}}
    accepted = post(operator, f"/api/sessions/{session_id}/submissions",
                    {"conversation_id": conversation, "request_id": "r", "input": allowed})
    assert accepted.status_code == 201, accepted.content
    assert accepted.json()["input"] == allowed


def test_the_schema_publishes_the_allow_list(operator: Client) -> None:
    components = operator.get("/api/openapi.json").json()["components"]["schemas"]
    options = components["SubmissionInput"]["properties"]["options"]
    assert options["additionalProperties"] is False
    assert options["properties"]["temperature"] == {
        "type": "number", "minimum": 0, "maximum": 2, "description": "sampling temperature"}


# -- issue 26: text lengths and the numbers code uses are bounded where they enter --------


def conversation_in(operator: Client) -> tuple[str, str]:
    session_id = post(operator, "/api/sessions", {}).json()["id"]
    return session_id, post(operator, f"/api/sessions/{session_id}/conversations",
                            {}).json()["id"]


def test_a_submission_text_beyond_its_length_is_refused_naming_it(
    kernel: Kernel, operator: Client
) -> None:
    from kernel.agent import MAX_TEXT

    session_id, conversation = conversation_in(operator)
    before = head(kernel, session_id)
    for size in (MAX_TEXT + 1, 2_000_000):
        refused = post(operator, f"/api/sessions/{session_id}/submissions",
                       {"conversation_id": conversation, "request_id": f"r{size}",
                        "input": {"text": "a" * size}})
        refused_naming(refused, "input.text")
        assert f"at most {MAX_TEXT} characters" in refused.content.decode()
    assert head(kernel, session_id) == before
    accepted = post(operator, f"/api/sessions/{session_id}/submissions",
                    {"conversation_id": conversation, "request_id": "fits",
                     "input": {"text": "a" * MAX_TEXT}})
    assert accepted.status_code == 201, accepted.content[:300]


def test_the_kernel_refuses_a_long_submission_from_any_caller(kernel: Kernel) -> None:
    from kernel import Draft
    from kernel.agent import MAX_TEXT, submit

    handle = kernel.create_session()
    draft = Draft()
    conversation = draft.create_conversation()
    handle.commit(draft)
    with pytest.raises(ValueError, match=f"text: at most {MAX_TEXT} characters"):
        submit(handle, conversation, {"text": "a" * (MAX_TEXT + 1)}, "r")


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/api/sessions", {"metadata": {"note": "n" * 100_001}}, "metadata.note"),
        ("/api/sessions", {"metadata": {"k" * 201: 1}}, "metadata (a key)"),
        ("/api/sessions", {"metadata": {"retention_days": 1e6}}, "retention_days"),
        ("/api/sessions", {"metadata": {"retention_days": -1}}, "retention_days"),
        ("/api/sessions", {"metadata": {"retention_days": "forever"}}, "retention_days"),
        ("/api/actions/bulk", {"action": "retry", "kind": "k" * 201, "action_id": "a",
                               "reason": "r", "expected_count": 0}, "kind"),
        ("/api/actions/bulk", {"action": "retry", "kind": "k", "action_id": "a",
                               "reason": " \t\n", "expected_count": 0}, "reason"),
        # An action id becomes a commit key (kernel.values.NAME_BYTES: at most 1024
        # bytes): 200 characters, 800 bytes at most, leave room for what a key adds.
        ("/api/actions/bulk", {"action": "retry", "kind": "k", "action_id": "€" * 201,
                               "reason": "r", "expected_count": 0}, "action_id"),
    ],
)
def test_text_and_numbers_beyond_the_schema_are_refused_naming_them(
    operator: Client, path: str, body: dict[str, Any], field: str
) -> None:
    refused_naming(post(operator, path, body), field)
    assert operator.get("/api/sessions").json() == []


def test_a_retention_within_a_century_is_taken(operator: Client) -> None:
    created = post(operator, "/api/sessions", {"metadata": {"retention_days": 36_525}})
    assert created.status_code == 201, created.content


def test_the_schema_states_the_lengths_and_the_retention_bound(operator: Client) -> None:
    from kernel.agent import MAX_TEXT

    schema = operator.get("/api/openapi.json").json()
    components = schema["components"]["schemas"]
    assert components["SubmissionInput"]["properties"]["text"]["maxLength"] == MAX_TEXT
    assert components["Json1"]["anyOf"][0]["maxLength"] == MAX_TEXT
    assert components["JsonObject"]["propertyNames"]["maxLength"] == 200
    retention = components["SessionMetadata"]["properties"]["retention_days"]
    assert (retention["minimum"], retention["maximum"]) == (0, 36_525)
    assert components["SessionIn"]["properties"]["metadata"] == {
        "$ref": "#/components/schemas/SessionMetadata"}
    submission = components["SubmissionIn"]["properties"]
    assert submission["conversation_id"]["maxLength"] == 200
    assert components["ActionIn"]["properties"]["reason"]["pattern"] == NOT_BLANK


@pytest.mark.parametrize(("body", "missing"), [
    ({"fork_of": "conv_x"}, "fork_entry_id"), ({"fork_entry_id": "ent_x"}, "fork_of"),
    ({"fork_of": "conv_x", "fork_entry_id": None}, "fork_entry_id"),
])
def test_a_fork_naming_only_one_of_its_two_fields_is_refused_naming_the_other(
    operator: Client, kernel: Kernel, body: dict[str, Any], missing: str,
) -> None:
    """A conversation forks at an entry of another: a body naming only one of the two is
    bad input (422 naming the one it lacks), not a state that does not allow it (409);
    nothing is committed."""
    session_id = post(operator, "/api/sessions", {}).json()["id"]
    before = head(kernel, session_id)
    refused_naming(post(operator, f"/api/sessions/{session_id}/conversations", body), missing)
    assert head(kernel, session_id) == before


@pytest.mark.parametrize(("url", "query", "unknown"), [
    ("/api/tasks", {"stauts": "failed"}, "stauts"),
    ("/api/tasks", {"kind": "api-step", "session": "s"}, "session"),
    ("/api/sessions", {"limt": "5"}, "limt"),
    ("/api/tokens", {"user": "olga"}, "user"),
])
def test_an_unknown_query_parameter_is_a_422_naming_it(
    operator: Client, kernel: Kernel, url: str, query: dict[str, str], unknown: str,
) -> None:
    """A parameter the operation does not take (a misspelt filter) is refused naming it,
    as the change feeds refuse one: ignored, a list filtered by nothing answered every
    record as if they all matched."""
    start(kernel, "api-step", {"sleep": True})
    response = operator.get(url, query)
    assert response.status_code == 422, response.content
    assert [e["loc"] for e in response.json()["detail"]] == [["query", unknown]]


def test_a_body_operation_refuses_an_unknown_query_parameter_and_does_nothing(
    operator: Client, kernel: Kernel,
) -> None:
    response = post(operator, "/api/sessions?metadata=x", {})
    assert response.status_code == 422, response.content
    assert operator.get("/api/sessions").json() == []
