"""Commits to the plan document, the document kind the feed tests change."""

from __future__ import annotations

from typing import Any

from kernel import Draft, SessionHandle

PLAN = "email-plan"  # a document kind the project registers


def commit(handle: SessionHandle, value: Any, actor: str = "user:ann") -> Any:
    draft = Draft(actor=actor)
    draft.set(PLAN, "doc", ["n"], value)
    return handle.commit(draft).commit
