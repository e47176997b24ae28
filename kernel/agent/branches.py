"""A turn branched from one of its model responses (DESIGN §14, recovery from a node).

The branch is a new conversation forked at the response's entry (its transcript is the
original's up to and with that response) and a new turn on it that starts from that
response as committed: the model is not asked again for anything before it, the
response's tool calls are made anew (new tool tasks, so new operation ids), and the
model is asked from there on. The original conversation and turn stay as they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kernel.commit import Draft
from kernel.errors import IllegalTransition, UnknownRecord
from kernel.session import SessionHandle

from .context import RESPONSE
from .turn import CONVERSATION

JSON = Any


@dataclass(frozen=True)
class Branch:
    conversation_id: str
    turn_id: str
    origin_turn: str
    seq: int


def branch_turn(
    handle: SessionHandle,
    conversation_id: str,
    entry_id: str,
    *,
    actor: str,
    also: Any = None,
    key: str | None = None,
) -> Branch:
    """Branch the turn that committed the model response ``entry_id`` of
    ``conversation_id`` there; ``also(draft)`` adds writes to the same commit (an operator
    action records itself so), under the idempotency ``key``.
    UnknownRecord if there is no such response; IllegalTransition for a response that no
    native turn of this kernel committed (a hosted agent's run is forked by its host)."""
    kernel = handle.kernel
    entry = next((e for e in kernel.entries(conversation_id) if e.id == entry_id), None)
    if entry is None or entry.session_id != handle.id:
        raise UnknownRecord(f"no entry {entry_id} in conversation {conversation_id}")
    if entry.kind != RESPONSE:
        raise IllegalTransition(f"entry {entry_id} is a {entry.kind}, not a model response")
    origin = kernel.task(str(entry.payload.get("turn") or ""))
    if origin.kind != "agent-turn":
        raise IllegalTransition(
            f"entry {entry_id} was committed by a {origin.kind} run, not a native turn"
        )
    draft = Draft(actor=actor, key=key)
    branch = draft.create_conversation(fork_of=conversation_id, fork_entry_id=entry_id)
    model = (origin.checkpoint or {}).get("model") or origin.input.get("model")
    options = (origin.checkpoint or {}).get("options") or origin.input.get("options") or {}
    turn = draft.create_task("agent-turn", {
        "conversation_id": branch, "submissions": [], "model": model, "options": options,
        "from_response": entry_id, "branch_of": origin.id,
    })
    draft.update_document(CONVERSATION, branch, {
        "op": "set", "path": [], "value": {"active": turn, "queue": [], "steering": []},
    })
    if also is not None:
        also(draft)
    written = handle.commit(draft)
    return Branch(branch, turn, origin.id, written.commit.seq)
