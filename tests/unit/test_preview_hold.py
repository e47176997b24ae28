"""A task's commit holds the previews it made before it: the session page drops them even
when its socket read the commit (a poll) before the previews reached it, as happens
when the notifier sends them a moment after the commit was readable. Otherwise a
streamed text already saved stayed on the page, "a preview, not saved yet", until the
session's next commit (an approval's wait: as long as the operator takes)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest

from controlplane.sockets import notify
from controlplane.sockets.notify import Notifier
from controlplane.sockets.pages import SessionPageConsumer
from kernel.records import Preview
from tests.unit.recording_layer import Layer


def test_a_commit_of_a_task_that_showed_previews_names_it_in_its_hint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    layer = Layer()
    monkeypatch.setattr(notify, "get_channel_layer", lambda alias: layer)
    notifier = Notifier(gap=0.01)
    notifier.preview(Preview("sess_a", "task_t", "progress", "task_t", ("text",), "I will", 3))

    def committed(seq: int, *tasks: str) -> None:
        notifier.after_commit(SimpleNamespace(  # type: ignore[arg-type]
            commit=SimpleNamespace(session_id="sess_a", seq=seq, id=seq),
            updated_tasks=[SimpleNamespace(id=t) for t in tasks]))

    committed(4, "task_t", "task_u")  # task_u showed no preview here
    committed(5, "task_t")  # nothing shown since its last commit
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not any(m.get("seq") == 5 for _, m in layer.sent):
        time.sleep(0.01)
    sent = [m for g, m in layer.sent if g == "session.sess_a"]
    assert [m.get("held") for m in sent if "seq" in m and m.get("held")] == [{"task_t": 4}]
    assert sent[-1]["seq"] == 5


def consumer(shown: dict[tuple[str, ...], dict[str, Any]], last: int) -> Any:
    page = SessionPageConsumer()
    page.previews, page.last, page.closing = shown, last, False
    page.changed = asyncio.Event()
    page.sent = []

    async def send_shown_previews() -> None:
        page.sent.append(sorted(p["value"] for p in page.previews.values()))

    page.send_shown_previews = send_shown_previews
    return page


def preview(task: str, value: str, after: int) -> dict[str, Any]:
    return {"task_id": task, "kind": "progress", "key": task, "path": ["text"],
            "value": value, "after": after}


def test_the_page_drops_a_preview_its_tasks_commit_holds_though_it_read_the_commit_first(
) -> None:
    async def talk() -> Any:
        page = consumer({("task_t", "text"): preview("task_t", "I will pay", 3),
                         ("task_u", "text"): preview("task_u", "still streaming", 2)},
                        last=4)  # a poll read commit 4 before its hint came
        page.on_hint({"session_id": "sess_a", "seq": 4, "held": {"task_t": 4}})
        await asyncio.sleep(0.01)
        return page

    page = run(talk)
    assert list(page.previews) == [("task_u", "text")]  # another task's goes on
    assert page.sent == [["still streaming"]]


def test_previews_that_come_with_the_commit_holding_them_are_not_shown(
) -> None:
    async def talk() -> Any:
        page = consumer({}, last=4)
        page.on_hint({"session_id": "sess_a", "seq": 4, "held": {"task_t": 4}, "previews": [
            preview("task_t", "made before commit 4", 3),
            preview("task_u", "another task's, streaming", 2)]})
        await asyncio.sleep(0.01)
        return page

    page = run(talk)
    assert [p["value"] for p in page.previews.values()] == ["another task's, streaming"]


def run(talk: Any) -> Any:
    return asyncio.run(talk())
