"""The session's transcript as a conversation, its submissions, and a task's timeline,
rendered in-process (the browser tests drive the same pages with real workers)."""

from __future__ import annotations

import html
import json
import re
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.test import override_settings

from controlplane import commands
from controlplane.reads import pages
from controlplane.reads.transcript import _card
from controlplane.templatetags.dashboard import ago_text, markdown, seconds
from controlplane.ui.live import SESSION_PAGE
from controlplane.worker.runtime import runtime
from kernel import Draft, Scheduler
from kernel.agent.turn import PROGRESS
from kernel.session import SessionHandle

from .clients import login_as
from .sessions import EVIL, call_arguments, conversation_with_a_tool_call

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_transcript_reads_as_a_conversation_with_tool_cards_and_usage() -> None:
    session_id, conversation = conversation_with_a_tool_call()
    page = login_as("viewer").get(f"/sessions/{session_id}/").content.decode()
    transcript = page[page.index('id="transcript"'):page.index('id="submissions"')]
    assert "{&#x27;" not in transcript and "{'" not in transcript  # no dict reprs
    assert "Send the notice to ana" in transcript
    card = transcript[transcript.index('id="call-call_1"'):]
    card = card[:card.index("</article>")]
    assert "<code>send_notices</code>" in card and 'data-state="succeeded"' in card
    assert "replay unsafe" in card  # the tool's declared policy (it runs a task of its own)
    arguments = html.unescape(re.search(r'<pre [^>]*class="json arguments">(.*?)</pre>', card,
                                        re.S).group(1))
    assert json.loads(arguments) == call_arguments()
    assert '\n  "recipients": [\n    "ana@example.com"\n  ]' in arguments  # indented
    assert '&quot;msg_1&quot;' in card
    assert "<strong>Sent 1 notice.</strong>" in transcript  # markdown, rendered
    assert "<li>ana@example.com: msg_1</li>" in transcript
    assert "<script>window" not in page and "&lt;script&gt;window.__pwned" in transcript
    assert "30 in / 10 out tokens" in transcript and "40 in / 20 out tokens" in transcript
    assert 'data-input="70" data-output="30"' in transcript  # the conversation's totals
    assert "cost" not in transcript  # no prices configured


@override_settings(MODEL_PRICES={"": {"input": 1.0, "output": 2.0}})
def test_cost_shows_when_the_model_has_prices() -> None:
    session_id, _ = conversation_with_a_tool_call()  # its turn names no model: priced as ""
    (conv,) = [c for c in pages.transcript(session_id).items if not c.operations]
    assert conv.usage is not None
    assert (conv.usage.input_tokens, conv.usage.output_tokens) == (70, 30)
    assert conv.usage.cost == pytest.approx((70 * 1.0 + 30 * 2.0) / 1_000_000)
    page = login_as("viewer").get(f"/sessions/{session_id}/").content.decode()
    assert "cost <b>0.0001</b>" in page


def test_submissions_show_their_text_status_and_turn() -> None:
    session_id, _ = conversation_with_a_tool_call()
    page = login_as("viewer").get(f"/sessions/{session_id}/").content.decode()
    subs = page[page.index('id="submissions"'):]
    assert "Send the notice to ana" in subs and "{&#x27;text" not in subs
    assert 'data-status="placed"' in subs
    (view,) = pages.submissions(session_id).items
    assert view.turn_id is not None and f"/tasks/{view.turn_id}/" in subs


def a_batch() -> tuple[SessionHandle, str]:
    """A session with a send-batch task nothing runs; (session handle, task id)."""
    handle = runtime().kernel.create_session()
    draft = Draft(actor="user:test")
    task_id = draft.create_task("send-batch", {"recipients": ["a@example.com"],
                                               "subject": "s", "body": "b"})
    handle.commit(draft)
    return handle, task_id


def an_operator() -> User:
    operator = User.objects.create_user("olga", password="pw")
    operator.groups.add(Group.objects.get_or_create(name="operator")[0])
    return operator


def test_an_ended_task_keeps_no_live_output_box() -> None:
    """A streaming task that ends (a cancelled turn, say) leaves the live output: its
    text is in the transcript, or was never finished."""
    kernel = runtime().kernel
    handle, task_id = a_batch()
    draft = Draft(actor="user:test")
    draft.set(PROGRESS, task_id, ["text"], "half a sent")
    handle.commit(draft)
    assert [p["task_id"] for p in pages.progress(handle.id)] == [task_id]
    head = kernel.storage.session(handle.id).head_seq
    draft = Draft(actor="user:test")
    draft.set(PROGRESS, task_id, ["text"], "")
    handle.commit(draft)
    assert pages.progress(handle.id) == []  # empty: nothing to show
    draft = Draft(actor="user:test")
    draft.set(PROGRESS, task_id, ["text"], "more")
    handle.commit(draft)
    operator = an_operator()
    head = kernel.storage.session(handle.id).head_seq
    commands.cancel_task(operator, task_id, "c-1", "wrong list", kernel.task(task_id).run)
    Scheduler(kernel).run_until_idle()
    assert kernel.task(task_id).terminal
    assert pages.progress(handle.id) == []
    _, update = SESSION_PAGE.update(handle.id, head, False)
    assert 'id="progress"' in update and "more" not in update  # the live update empties it
    page = login_as("viewer").get(f"/sessions/{handle.id}/").content.decode()
    assert "Live output of" not in page and "Nothing is streaming now" in page


def test_a_task_page_shows_a_row_per_phase_adding_up_to_its_span() -> None:
    registry = runtime().kernel.registry
    if "ui-steps" not in registry.kinds():

        @registry.task("ui-steps")
        class Steps:
            initial = "plan"

            def plan(self, run):
                children = [run.spawn("ui-leaf", {"n": n}) for n in range(2)]
                return run.wait_all(children, then="rest")

            def rest(self, run):
                return run.sleep(0.05, then="finish")

            def finish(self, run):
                return run.succeed({"done": True})

        @registry.task("ui-leaf")
        class Leaf:
            initial = "go"

            def go(self, run):
                return run.succeed(run.input["n"])

    kernel = runtime().kernel
    handle = kernel.create_session()
    draft = Draft(actor="user:test")
    task_id = draft.create_task("ui-steps", {"why": EVIL})
    handle.commit(draft)
    for _ in range(100):  # a real clock: the 50 ms sleep passes in real time
        Scheduler(kernel).run_until_idle()
        if kernel.task(task_id).terminal:
            break
        time.sleep(0.02)
    assert kernel.task(task_id).terminal

    task = kernel.task(task_id)
    found = pages.timeline(task_id, task.session_id, True)
    assert [r.phase for r in found.rows] == ["plan", "rest", "finish"]
    # Times are floats of seconds since the epoch (~1.8e9): a difference of two carries
    # ~1e-7 s of rounding, more than approx's default relative tolerance of a short span.
    assert sum(r.seconds for r in found.rows) == pytest.approx(found.seconds, abs=1e-5)
    assert found.seconds == pytest.approx(
        (found.commits[-1].at - found.commits[0].at).total_seconds(), abs=1e-5)
    labels = [s.label for r in found.rows for s in r.segments]
    assert "waits on 2 tasks" in labels and any(x.startswith("asleep until") for x in labels)
    assert all(r.holders for r in found.rows)  # every phase names the lease it ran under
    assert found.rows[-1].outcome == "succeeded"

    page = login_as("viewer").get(f"/tasks/{task_id}/").content.decode()
    rows = re.findall(r'<tr class="phase-row[^"]*" data-phase="([^"]+)" data-seconds="([^"]+)"',
                      page)
    assert [p for p, _ in rows] == ["plan", "rest", "finish"]
    span = float(re.search(r'class="span-seconds" data-seconds="([^"]+)"', page).group(1))
    assert sum(float(s) for _, s in rows) == pytest.approx(span, abs=1e-5)
    assert "<script>window" not in page and "&quot;why&quot;" in page  # input as JSON
    assert re.search(r'<time datetime="[^"]+" title="\d{4}-\d\d-\d\d [\d:.]+ UTC" data-ago>',
                     page)


def test_the_timeline_names_who_cancelled_and_why() -> None:
    _, task_id = a_batch()
    operator = an_operator()
    commands.cancel_task(operator, task_id, "c-1", "wrong list", 0)
    page = login_as("viewer").get(f"/tasks/{task_id}/").content.decode()
    log = page[page.index("Operators' actions"):]
    assert "<b>cancel</b> by user:olga" in log and "“wrong list”" in log


def test_filters_for_people() -> None:
    now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert ago_text(now - timedelta(seconds=3), now) == "3 s ago"
    assert ago_text(now - timedelta(minutes=5), now) == "5 min ago"
    assert ago_text(now + timedelta(hours=2), now) == "in 2 h"
    assert ago_text(now, now) == "just now"
    assert [seconds(v) for v in (0.34, 4.25, 185, 7440, None)] == [
        "340 ms", "4.2 s", "3 min 5 s", "2 h 4 min", "—"]
    rendered = str(markdown(f"[x](javascript:alert(1)) ![i](http://e/x.png) {EVIL}"))
    assert "javascript:" not in rendered.split("href")[-1] or 'href="javascript' not in rendered
    assert "<script>" not in rendered and "<img" not in rendered


def test_interrupted_failed_cancelled_and_uncertain_calls_are_marked() -> None:
    kernel = runtime().kernel
    handle = kernel.create_session()
    draft = Draft(actor="user:test")
    conversation = draft.create_conversation()
    handle.commit(draft)
    calls = [{"id": f"call_{n}", "name": "charge", "arguments": {"n": n}} for n in "abcd"]
    draft = Draft(actor="task:turn_y")
    draft.append(conversation, "interruption", {
        "turn": "turn_y", "attempt": 1, "reason": "the worker stopped during the model request"})
    draft.append(conversation, "model_response", {"text": "", "tool_calls": calls,
                                                  "turn": "turn_y", "attempt": 2})
    draft.append(conversation, "tool_result", {"call_id": "call_a", "name": "charge",
                                               "interrupted": True, "partial": "charging…"})
    draft.append(conversation, "tool_result", {"call_id": "call_b", "name": "charge",
                                               "error": "ValueError: no card"})
    draft.append(conversation, "tool_result", {
        "call_id": "call_d", "name": "charge", "cancelled": True, "by": "user:ann",
        "reason": "wrong list", "partial": {"sent": 1, "unsent": ["ben@example.com"]}})
    handle.commit(draft)
    page = login_as("viewer").get(f"/sessions/{handle.id}/").content.decode()
    states = dict(re.findall(r'id="call-(call_\w)" data-state="(\w+)"', page))
    assert states == {"call_a": "interrupted", "call_b": "error", "call_c": "running",
                      "call_d": "cancelled"}
    assert "cancelled by user:ann: wrong list" in page and "ben@example.com" in page
    assert "interrupted: may or may not have run" in page and "charging…" in page
    assert "ValueError: no card" in page
    assert "the worker stopped during the model request" in page and "(attempt 1;" in page

    class Waiting:  # a tool task that waits on an operator's resolution
        id, kind, checkpoint, status = "task_w", "agent-tool", {}, None

    card = _card(calls[2], None, Waiting(), {}, {"task_w"})
    assert (card.state, card.task_id) == ("uncertain", "task_w")


def test_a_call_id_reused_in_later_responses_shows_each_calls_own_result() -> None:
    """Some models number their calls per response: ``call_0`` in two turns and twice in
    one hosted turn (its second result saying which occurrence it answers). Each card
    shows the result that answered it, and one still unanswered shows none."""
    kernel = runtime().kernel
    handle = kernel.create_session(metadata={"title": "agent"})
    draft = Draft(actor="user:test")
    conversation = draft.create_conversation()
    handle.commit(draft)
    draft = Draft(actor="task:turn_a")

    def asks(turn: str) -> None:
        call = {"id": "call_0", "name": "lookup", "arguments": {"q": turn}}
        draft.append(conversation, "model_response", {"text": "", "tool_calls": [call],
                                                      "turn": turn, "attempt": 1})

    asks("turn_a")
    draft.append(conversation, "tool_result", {"call_id": "call_0", "name": "lookup",
                                               "result": "native answer"})
    asks("turn_b")
    draft.append(conversation, "tool_result", {"call_id": "call_0", "name": "lookup",
                                               "result": "hosted first", "turn": "turn_b"})
    asks("turn_b")
    draft.append(conversation, "tool_result", {"call_id": "call_0", "name": "lookup",
                                               "result": "hosted second", "turn": "turn_b",
                                               "occurrence": 2})
    asks("turn_b")  # its third call of call_0: not answered yet
    handle.commit(draft)
    (conv,) = [c for c in pages.transcript(handle.id).items if not c.operations]
    cards = [card for item in conv.items for card in item.tools]
    assert [(c.call_id, c.state, c.result) for c in cards] == [
        ("call_0", "succeeded", '"native answer"'),
        ("call_0", "succeeded", '"hosted first"'),
        ("call_0", "succeeded", '"hosted second"'),
        ("call_0", "running", None),
    ]


def test_a_call_id_reused_in_later_turns_shows_each_calls_own_task() -> None:
    """Each turn's ``call_0`` ran as a tool task of its own: the first turn's card links
    its own task, not the later one still running (whose state, an approval it waits
    for, or its timing would show on the wrong card)."""
    kernel = runtime().kernel
    handle = kernel.create_session(metadata={"title": "agent"})
    draft = Draft(actor="user:test")
    conversation = draft.create_conversation()
    handle.commit(draft)
    made = []
    for turn in ("turn_a", "turn_b"):
        call = {"id": "call_0", "name": "lookup", "arguments": {"q": turn}}
        draft = Draft(actor=f"task:{turn}")
        draft.append(conversation, "model_response", {"text": "", "tool_calls": [call],
                                                      "turn": turn, "attempt": 1})
        made.append(draft.create_task("agent-tool", {"call": call,
                                                     "conversation_id": conversation}))
        handle.commit(draft)
        if turn == "turn_a":
            draft = Draft(actor="task:turn_a")
            draft.append(conversation, "tool_result", {"call_id": "call_0", "name": "lookup",
                                                       "result": "first"})
            handle.commit(draft)
    (conv,) = [c for c in pages.transcript(handle.id).items if not c.operations]
    cards = [card for item in conv.items for card in item.tools]
    assert [(c.call_id, c.task_id, c.state) for c in cards] == [
        ("call_0", made[0], "succeeded"), ("call_0", made[1], "running")]


def test_a_reused_call_ids_uncertain_call_marks_its_card() -> None:
    """A hosted turn waits on ``resolution:<call id>#<n>:<attempt>`` for the n-th call of
    an id its responses reuse: the card of that id is the one shown uncertain."""
    from types import SimpleNamespace

    from controlplane.reads.transcript import _resolving
    from kernel.records import Status

    def waiting_on(signal: str) -> Any:
        return SimpleNamespace(task=SimpleNamespace(
            status=Status.WAITING, waits_on=SimpleNamespace(signal=signal)))

    assert _resolving(waiting_on("resolution:call_0#2:1")) == {"call_0"}
    assert _resolving(waiting_on("resolution:call_7:3")) == {"call_7"}
    assert _resolving(waiting_on("approval:call_7")) == set()
