"""Driving and reading a Pydantic AI agent's runs on a chaos stack: start a turn, hold a
worker at a point and kill it there, and count what the model, the tools and the
provider saw (shared by the agent's kill tests)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings

from controlplane.dev.processes import Process
from controlplane.worker.runtime import forget_runtime
from kernel import Draft, Task
from kernel.agent import submit

from .harness import Stack, chaos_stack, lines, wait_for


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


@contextmanager
def agent_stack_of(tmp_path: Path, agents: dict[str, str]) -> Iterator[Stack]:
    """Workers that run ``agents`` (name: module path); this process knows them too (the
    API's kernel checks submissions and decisions against its registry)."""
    saved = settings.KERNEL_AGENTS
    settings.KERNEL_AGENTS = agents
    forget_runtime()
    env = {"KERNEL_AGENTS": json.dumps(agents), "AGENT_TOOL_DIR": str(tmp_path)}
    try:
        with chaos_stack(tmp_path, env=env) as running:
            yield running
    finally:
        settings.KERNEL_AGENTS = saved
        forget_runtime()
