"""Every list is paged: the API's conversations and submissions of a session by a cursor
(``after`` an id, ``limit`` at most 500), and the session page shows the last
conversations and submissions, saying how many more there are and where to read them."""

from __future__ import annotations

import pytest
from django.test import Client

from controlplane.reads import pages
from controlplane.worker.runtime import runtime
from kernel import Draft, agent

from .clients import post

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime().dispatcher, "deliver", lambda task, queue: None)


def busy_session(operator: Client, conversations: int, submissions: int
                 ) -> tuple[str, list[str], list[str]]:
    """A session made through the API (its operations log records that), with
    ``conversations`` and ``submissions`` to the first of them."""
    handle = runtime().kernel.open(post(operator, "/api/sessions", {}).json()["id"])
    draft = Draft(actor="user:test")
    made = [draft.create_conversation() for _ in range(conversations)]
    handle.commit(draft)
    sent = []
    for n in range(submissions):
        submitted = agent.submit(handle, made[0], {"text": f"ask {n}"}, f"r{n}",
                                 actor="user:ann")
        assert submitted.submission is not None
        sent.append(submitted.submission.id)
    return handle.id, made, sent


def pages_of(client: Client, url: str, limit: int) -> list[list[str]]:
    found, after = [], None
    while True:
        page = client.get(url, {"limit": limit, **({"after": after} if after else {})})
        assert page.status_code == 200, page.content
        ids = [item["id"] for item in page.json()]
        if not ids:
            return found
        found.append(ids)
        after = ids[-1]


def test_the_api_pages_conversations_and_submissions_by_cursor(operator: Client) -> None:
    session_id, made, sent = busy_session(operator, conversations=5, submissions=7)
    subs = pages_of(operator, f"/api/sessions/{session_id}/submissions", 3)
    assert [len(p) for p in subs] == [3, 3, 1] and sum(subs, []) == sent
    convs = pages_of(operator, f"/api/sessions/{session_id}/conversations", 2)
    assert set(made) <= set(sum(convs, []))
    assert all(len(p) <= 2 for p in convs)
    default = operator.get(f"/api/sessions/{session_id}/submissions").json()
    assert len(default) == 7
    for url in ("submissions", "conversations"):
        base = f"/api/sessions/{session_id}/{url}"
        assert operator.get(base, {"limit": 501}).status_code == 422
        refused = operator.get(base, {"after": "nope"})
        assert refused.status_code == 422 and "after" in refused.json()["detail"]
        # An empty cursor is no cursor (the schema allows it; the fuzzer sends it).
        first = operator.get(base, {"after": "", "limit": 2})
        assert first.status_code == 200, first.content
        assert first.json() == operator.get(base, {"limit": 2}).json()


def test_the_api_caps_an_unasked_page(operator: Client) -> None:
    session_id, _, sent = busy_session(operator, conversations=1, submissions=103)
    default = operator.get(f"/api/sessions/{session_id}/submissions").json()
    assert [s["id"] for s in default] == sent[:100]


def test_the_session_page_shows_the_last_ones_and_says_how_many_more(
    operator: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pages, "SUBMISSIONS_SHOWN", 4)
    monkeypatch.setattr(pages, "CONVERSATIONS_SHOWN", 2)
    session_id, made, sent = busy_session(operator, conversations=5, submissions=6)
    page = operator.get(f"/sessions/{session_id}/").content.decode()
    subs = page[page.index('id="submissions"'):]
    assert "The last 4 of 6 submissions" in subs
    assert all(f'id="submission-{s}"' in subs for s in sent[2:])
    assert not any(f'id="submission-{s}"' in subs for s in sent[:2])
    transcript = page[page.index('id="transcript"'):page.index('id="submissions"')]
    assert "3 earlier conversations not shown" in transcript
    assert all(f'id="conv-{c}"' in transcript for c in made[3:])
    assert not any(f'id="conv-{c}"' in transcript for c in made[:3])
    assert "Operations log" in transcript
