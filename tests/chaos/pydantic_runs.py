"""Driving and reading a Pydantic AI agent's runs on a chaos stack: start a turn, hold a
worker at a point and kill it there, and count what the model, the tools and the
provider saw (shared by the agent's kill tests)."""

from __future__ import annotations

from collections import Counter

from controlplane.dev.processes import Process
from kernel import Draft, Task
from kernel.agent import submit

from .harness import Stack, lines, wait_for


def start(stack: Stack, text: str = "Tell ana's contacts") -> tuple[str, str, str]:
    handle = stack.kernel.create_session(metadata={"title": "pydantic chaos"})
    draft = Draft(actor="user:chaos")
    conversation = draft.create_conversation()
    handle.commit(draft)
    submitted = submit(handle, conversation, {"text": text, "agent": "support"}, "req-1")
    assert submitted.submission is not None
    return handle.id, conversation, submitted.submission.id


def model_steps(stack: Stack) -> list[int]:
    return [int(step) for step in lines(stack, "model")]


def runs(stack: Stack) -> Counter[str]:
    return Counter(line.split()[0] for line in lines(stack, "runs"))


def kill_at(stack: Stack, point: str) -> Process:
    """Ask the first worker to reach ``point`` to hold there; SIGKILL it once it does."""
    (stack.tmp / f"hold-{point}").touch()
    held = wait_for(lambda: next((line for line in lines(stack, "holding")
                                  if line.split()[0] == point), None),
                    f"a worker to hold at {point}", timeout=60)
    pid = int(held.split()[1])
    worker = next(p for p in stack.processes if p.pid == pid)
    worker.kill()
    return worker


def turn_of(stack: Stack, session_id: str) -> Task:
    (turn,) = [t for t in stack.tasks(session_id) if t.kind == "agent:support"]
    return turn


def delivered(stack: Stack) -> Counter[str]:
    return Counter(m["to"] for m in stack.admin.messages())
