"""Two operators deciding one thing at once: both have read it before either commits
(a barrier after the read), then both commit, each on its own thread and Postgres
connection. Exactly one decision may land; the other is refused. Or a competing commit
landed between one command's read and its commit (:func:`just_before`)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

from controlplane import commands


def both_read_first(monkeypatch: pytest.MonkeyPatch, owner: object, read: str) -> None:
    """Make ``owner.read`` wait, once it has read, until the other decision has read too."""
    both_read = threading.Barrier(2, timeout=10)
    original = getattr(owner, read)

    def read_then_wait(*args: Any) -> Any:
        found = original(*args)
        both_read.wait()
        return found

    monkeypatch.setattr(owner, read, read_then_wait)


def decide_at_once(
    decide: Callable[[int], commands.ActionResult],
) -> tuple[commands.ActionResult, Exception]:
    """Run ``decide(0)`` and ``decide(1)`` at once; the one that landed and the refusal."""
    answers: list[Any] = [None, None]

    def one(i: int) -> None:
        try:
            answers[i] = decide(i)
        except Exception as exc:  # noqa: BLE001 - the refusal is what we look at
            answers[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    landed = [a for a in answers if isinstance(a, commands.ActionResult)]
    refused = [a for a in answers if isinstance(a, Exception)]
    assert len(landed) == 1 and len(refused) == 1, answers
    return landed[0], refused[0]


def just_before(monkeypatch: pytest.MonkeyPatch, owner: object, name: str,
                change: Callable[[], object]) -> list[object]:
    """Make the first call of ``owner.name`` (a command's commit, called once it has read
    and checked what it acts on) run ``change`` first: a competing commit that lands
    between the command's read and its commit. Returns what ``change`` returned, once run."""
    original = getattr(owner, name)
    landed: list[object] = []

    def change_then_commit(*args: Any, **kwargs: Any) -> Any:
        if not landed:
            landed.append(None)  # the change may call through here itself
            landed[0] = change()
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, change_then_commit)
    return landed
