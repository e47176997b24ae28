"""A registered Pydantic AI agent through the product, in-process on Postgres: a
submission names it, its turn runs on the kernel, and the session page shows its
transcript as it shows a native turn's (tool cards with replay policy and duration)."""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings
from django.test import Client

from controlplane import commands
from controlplane.dev.processes import start_provider
from controlplane.errors import Invalid
from controlplane.reads.transcript import _card
from controlplane.worker.runtime import forget_runtime, runtime
from kernel import Draft, Scheduler, SubmissionStatus, agent

from .hosted import conversation, operator

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def hosted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("AGENT_TOOL_DIR", str(tmp_path))
    saved = settings.KERNEL_AGENTS
    settings.KERNEL_AGENTS = {"support": "tests.chaos.pydantic_agent.agent"}
    forget_runtime()
    try:
        with start_provider() as provider:
            monkeypatch.setenv("EMAIL_PROVIDER_URL", provider.url)
            yield
    finally:
        settings.KERNEL_AGENTS = saved
        forget_runtime()


def test_a_submission_naming_the_agent_runs_it_and_the_page_shows_its_cards(hosted: None) -> None:
    user = operator()
    session_id, conversation_id = conversation()
    submitted = commands.submit(user, session_id, conversation_id,
                                {"text": "Tell ana's contacts", "agent": "support"}, "r1",
                                agent.WhenBusy.FOLLOW_UP)
    assert submitted.outcome == "placed" and submitted.submission is not None
    Scheduler(runtime().kernel).run_until_idle()
    stored = runtime().kernel.storage.submission(submitted.submission.id)
    assert stored is not None and stored.status is SubmissionStatus.ANSWERED

    client = Client()
    client.force_login(user)
    page = client.get(f"/sessions/{session_id}/").content.decode()
    transcript = page[page.index('id="transcript"'):page.index('id="submissions"')]
    assert "Tell ana&#x27;s contacts" in transcript
    assert "<strong>Done.</strong>" in transcript  # model text as Markdown
    cards = {}
    for call in ("call_lookup", "call_send", "call_output_2"):
        card = transcript[transcript.index(f'id="call-{call}"'):]
        cards[call] = card[:card.index("</article>")]
    assert "replay safe" in cards["call_lookup"] and "replay unsafe" in cards["call_send"]
    assert all('data-state="succeeded"' in card for card in cards.values())
    assert re.search(r'class="meta duration"', cards["call_send"])
    assert "sent to 2" in cards["call_send"]


def test_a_hosted_agents_conversation_offers_no_compaction_and_refuses_one(
        hosted: None) -> None:
    """The agent rebuilds its requests from its own message history, not from the
    kernel's summaries: a compaction there would change nothing its model is sent."""
    user = operator()
    session_id, conversation_id = conversation()
    commands.submit(user, session_id, conversation_id,
                    {"text": "Tell ana's contacts", "agent": "support"}, "r1",
                    agent.WhenBusy.FOLLOW_UP)
    Scheduler(runtime().kernel).run_until_idle()
    client = Client()
    client.force_login(user)
    page = client.get(f"/sessions/{session_id}/").content.decode()
    assert f'id="conv-{conversation_id}"' in page
    assert f'id="compact-{conversation_id}"' not in page
    newest = runtime().kernel.entries(conversation_id)[-1].id
    answer = client.post(f"/api/conversations/{conversation_id}/compact",
                         {"action_id": "c-1", "reason": "long", "last_entry_id": newest},
                         content_type="application/json")
    assert answer.status_code == 422 and "'support'" in answer.content.decode()
    with pytest.raises(Invalid, match="^conversation: agent 'support'"):
        commands.compact_conversation(user, conversation_id, "c-2", "long", newest)
    assert not [t for t in runtime().kernel.storage.session_tasks(session_id)
                if t.kind == agent.COMPACTION]


def test_the_session_page_reads_which_conversations_an_agent_answers_in_one_query(
        hosted: None) -> None:
    """Each conversation shown is asked whether an agent keeps its history, and a live
    page renders again at every commit: the answer for all of them is one query."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    user = operator()
    session_id, hosted_id = conversation()
    handle = runtime().kernel.open(session_id)
    draft = Draft(actor="user:test")
    native_ids = [draft.create_conversation() for _ in range(3)]
    for native in native_ids:
        draft.append(native, "user", {"text": "hello"})
    handle.commit(draft)
    commands.submit(user, session_id, hosted_id,
                    {"text": "Tell ana's contacts", "agent": "support"}, "r1",
                    agent.WhenBusy.FOLLOW_UP)
    client = Client()
    client.force_login(user)
    with CaptureQueriesContext(connection) as queries:
        page = client.get(f"/sessions/{session_id}/").content.decode()
    assert f'id="compact-{hosted_id}"' not in page
    assert all(f'id="compact-{c}"' in page for c in native_ids)
    asked = [q["sql"] for q in queries.captured_queries
             if "kernel_submission" in q["sql"] and "agent" in q["sql"]]
    assert len(asked) == 1, asked


def test_a_submission_naming_an_unknown_agent_is_refused_and_writes_nothing(
    hosted: None,
) -> None:
    user = operator()
    session_id, conversation_id = conversation()
    head = runtime().kernel.storage.session(session_id)
    with pytest.raises(Invalid, match="agent: no agent 'billing' is registered"):
        commands.submit(user, session_id, conversation_id, {"text": "hi", "agent": "billing"},
                        "r1", agent.WhenBusy.FOLLOW_UP)
    assert runtime().kernel.storage.session(session_id) == head


def test_a_hosted_call_waiting_on_an_operator_is_marked_uncertain() -> None:
    call = {"id": "call_send", "name": "send_notice", "arguments": {}}
    card = _card(call, None, None, {}, {"call_send"})
    assert card.state == "uncertain"


def test_the_demo_starts_a_session_its_pydantic_ai_agent_answers_up_to_an_approval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``make demo`` registers the offline demo agent; ``manage.py demo`` then starts a
    session it answers: run here in-process, it looks the customer up and waits for an
    operator to approve its notice; approved, it answers with what the tool returned."""
    from django.core.management import call_command

    from controlplane.management.commands.demo import DEMO_AGENT
    from controlplane.reads import approvals
    from kernel.agent import approval
    from kernel.hosts.pydantic_ai import demo

    monkeypatch.setattr(demo, "WORD_PAUSE", 0.0)
    monkeypatch.setattr(settings, "KERNEL_AGENTS",
                        {DEMO_AGENT: "kernel.hosts.pydantic_ai.demo.agent"})
    forget_runtime()
    try:  # the demo's batch sends its five notices to a provider of the test's own
        with start_provider() as provider:
            monkeypatch.setenv("EMAIL_PROVIDER_URL", provider.url)
            call_command("demo", force=True, stdout=io.StringIO())
            kernel = runtime().kernel
            Scheduler(kernel, "demo-test").run_until_idle()
        (pending,) = approvals.pending_anywhere()
        assert (pending.name, pending.arguments) == ("send_notice", {"to": "ana@example.com"})
        draft = Draft(actor="user:operator")
        approval.decide(draft, pending.task_id, approval.APPROVE, by="user:operator",
                        reason="demo", seen=pending.digest)
        kernel.open(pending.session_id).commit(draft)
        Scheduler(kernel, "demo-test").run_until_idle()
        (turn,) = [t for t in kernel.storage.session_tasks(pending.session_id)
                   if t.kind == f"agent:{DEMO_AGENT}"]
        assert turn.outcome is not None and turn.outcome["kind"] == "succeeded", turn.outcome
        assert "the notice to ana@example.com is queued" in turn.outcome["result"]["output"]
    finally:
        forget_runtime()


@pytest.fixture
def mailer() -> Iterator[None]:
    from tests.integration import pydantic_mailer

    saved = settings.KERNEL_AGENTS
    settings.KERNEL_AGENTS = {"mailer": "tests.integration.pydantic_mailer.agent"}
    forget_runtime()
    pydantic_mailer.asked.clear()
    try:
        yield
    finally:
        pydantic_mailer.cancel.clear()
        settings.KERNEL_AGENTS = saved
        forget_runtime()


def test_a_turn_cancelled_mid_call_tells_the_next_request_the_call_s_partial_result(
    mailer: None,
) -> None:
    from pydantic_ai.messages import ToolReturnPart

    from kernel.agent.context import CANCELLED_NOTE
    from tests.integration.pydantic_mailer import RECIPIENTS, asked, cancel

    user = operator()
    session_id, conversation_id = conversation()
    kernel = runtime().kernel

    def turn() -> str:
        return next(t.id for t in kernel.storage.session_tasks(session_id)
                    if t.kind == "agent:mailer" and not t.terminal)

    cancel.update(user="olga", task=turn)
    first = commands.submit(user, session_id, conversation_id,
                            {"text": "Send the notice", "agent": "mailer"}, "r1",
                            agent.WhenBusy.FOLLOW_UP)
    assert first.submission is not None
    for _ in range(3):  # the cancelled phase's next commit is refused: its worker moves on
        try:
            Scheduler(kernel).run_until_idle(advance_clock=True)
            break
        except Exception:
            continue
    stored = kernel.storage.submission(first.submission.id)
    assert stored is not None and stored.status is SubmissionStatus.CANCELLED
    [card] = [e.payload for e in kernel.entries(conversation_id) if e.kind == "tool_result"]
    assert card["cancelled"] is True and card["by"] == "user:olga"
    assert card["partial"] == {"sent": RECIPIENTS[:1]}

    cancel.clear()
    second = commands.submit(user, session_id, conversation_id,
                             {"text": "Did it go out?", "agent": "mailer"}, "r2",
                             agent.WhenBusy.FOLLOW_UP)
    assert second.submission is not None
    Scheduler(kernel).run_until_idle()
    stored = kernel.storage.submission(second.submission.id)
    assert stored is not None and stored.status is SubmissionStatus.ANSWERED
    told = [p for m in asked[-1] for p in m.parts if isinstance(p, ToolReturnPart)]
    assert [(p.tool_call_id, p.content) for p in told] == [("call_send", {
        "cancelled": True, "reason": "cancelled by user:olga: wrong list",
        "partial": {"sent": RECIPIENTS[:1]}, "note": CANCELLED_NOTE,
    })]

    client = Client()
    client.force_login(user)
    page = client.get(f"/sessions/{session_id}/").content.decode()
    shown = page[page.index('id="call-call_send"'):]
    assert 'data-state="cancelled"' in shown[:shown.index("</article>")]


def test_a_hosted_turn_offers_no_restart_from_a_phase_and_the_api_refuses_one(
    hosted: None,
) -> None:
    from .clients import client_as, post

    user = operator()
    session_id, conversation_id = conversation()
    submitted = commands.submit(user, session_id, conversation_id,
                                {"text": "Tell ana's contacts", "agent": "support"}, "r1",
                                agent.WhenBusy.FOLLOW_UP)
    Scheduler(runtime().kernel).run_until_idle()
    kernel = runtime().kernel
    (turn,) = [t for t in kernel.storage.session_tasks(session_id) if t.kind == "agent:support"]
    assert turn.outcome is not None and turn.outcome["kind"] == "succeeded"
    olga = client_as("olga", "operator")
    (first, *_) = olga.get(f"/api/tasks/{turn.id}/restarts").json()
    preview = olga.get(f"/api/tasks/{turn.id}/restarts/{first['seq']}").json()
    assert "does not start again from a phase" in preview["refused"]
    assert "Submit the request again" in preview["refused"]
    answer = post(olga, f"/api/tasks/{turn.id}/restart", {
        "action_id": "r1", "reason": "try again", "seq": first["seq"],
        "expected_seq": turn.updated_seq})
    assert answer.status_code == 409, answer.content
    assert "does not start again from a phase" in answer.json()["detail"]
    assert kernel.task(turn.id) == turn
    page = olga.get(f"/tasks/{turn.id}/").content.decode()
    assert 'id="no-restart"' in page and 'class="restart"' not in page
    assert submitted.submission is not None
