"""LangGraph graphs the hosting tests run, offline: langchain_core's fake chat models.

Loaded into real workers with ``KERNEL_TASK_MODULES=tests.langgraph_graphs.register``.
Each model call and each tool run appends a line to ``$LANGGRAPH_RUNS`` (``model <pid>``,
``lookup <pid>``, ``send <to> <pid>``), so a test counts them from outside the worker.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import InjectedToolCallId, tool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import create_react_agent
from langgraph.types import interrupt
from pydantic import BaseModel, field_validator

from kernel import Kernel, Registry
from kernel.hosts.langgraph.host import GraphHost, register_graph

AGENT = "langgraph-notice-agent"
APPROVAL = "langgraph-approval"
PIPELINE = "langgraph-pipeline"
PIPELINE_V2 = "langgraph-pipeline-v2"
"""The pipeline again, its model answering otherwise: a new version of a graph, which a
fork may go on with from the first one's checkpoints."""
NOTE = "langgraph-note"
"""A graph whose interrupt declares no schema: any JSON value resumes it."""
TWICE = "langgraph-twice"
"""A node that asks twice (a second interrupt after its first is answered, at the same
checkpoint)."""
PAYMENT = "langgraph-payment"
"""A graph whose interrupt declares its resume value with LangGraph's ``response_schema``."""
RECIPIENTS = [f"{name}@example.com" for name in ("ana", "ben", "cai", "dee", "eve")]


def record(line: str) -> None:
    path = os.environ.get("LANGGRAPH_RUNS")
    if path:
        with Path(path).open("a") as runs:
            runs.write(f"{line} {os.getpid()}\n")


def runs(path: Path) -> list[str]:
    """The lines recorded so far, without their pids."""
    if not path.exists():
        return []
    return [line.rsplit(" ", 1)[0] for line in path.read_text().splitlines()]


class ScriptedModel(FakeMessagesListChatModel):
    """Answers with ``responses[n]``, n the number of model answers already in the
    conversation: the same answer after a restart as before it (the list's own counter
    lives in the process), and each call recorded."""

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None,
                  **kwargs: Any) -> ChatResult:
        record("model")
        answered = sum(isinstance(m, AIMessage) for m in messages)
        response = self.responses[min(answered, len(self.responses) - 1)]
        return ChatResult(generations=[ChatGeneration(message=response)])

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedModel:
        return self


@tool
def lookup_recipients(group: str) -> list[str]:
    """The addresses of a group of customers."""
    record("lookup")
    return RECIPIENTS


@tool
def send_notice(
    recipients: list[str], call_id: Annotated[str, InjectedToolCallId], config: RunnableConfig
) -> str:
    """Send the approved notice to each recipient, once: the provider takes each message
    under a key made of the thread, the tool call and the recipient, so a re-run
    of this tool after a crash sends nothing twice."""
    from controlplane.reference.notices.provider import HttpEmailProvider, Message

    provider = HttpEmailProvider(os.environ["EMAIL_PROVIDER_URL"], timeout=60)
    thread = config["configurable"]["thread_id"]
    for to in recipients:
        record(f"send {to}")
        provider.send(Message(to, "Notice", "Approved text."), f"{thread}:{call_id}:{to}")
    return f"sent {len(recipients)}"


def notice_agent() -> Any:
    model = ScriptedModel(responses=[
        AIMessage("", tool_calls=[
            {"name": "lookup_recipients", "args": {"group": "customers"}, "id": "call-lookup"},
            {"name": "send_notice", "args": {"recipients": RECIPIENTS}, "id": "call-send"},
        ]),
        AIMessage("Sent the notice to five customers."),
    ])
    with warnings.catch_warnings():  # moved to langchain.agents, which we do not install
        warnings.simplefilter("ignore", DeprecationWarning)
        return create_react_agent(model, [lookup_recipients, send_notice])


DECISION = {"type": "object", "required": ["approved"], "additionalProperties": False,
            "properties": {"approved": {"type": "boolean"}}}
"""The resume value the approval node declares it takes."""


class Approval(TypedDict):
    text: str
    approved: Any


def approval_graph() -> Any:
    def draft(state: Approval) -> dict[str, Any]:
        record("draft")
        return {"text": f"draft of {state['text']}"}

    def approve(state: Approval) -> dict[str, Any]:
        # LangGraph runs this node again from its start on resume: what comes before
        # interrupt() must be safe to repeat (here, a recorded line).
        record("approve")
        answer = interrupt({"question": "publish?", "text": state["text"], "schema": DECISION})
        return {"approved": answer}

    def publish(state: Approval) -> dict[str, Any]:
        record("publish")
        return {}

    builder = StateGraph(Approval)
    builder.add_node("draft", draft)
    builder.add_node("approve", approve)
    builder.add_node("publish", publish)
    builder.add_edge(START, "draft")
    builder.add_edge("draft", "approve")
    builder.add_edge("approve", "publish")
    builder.add_edge("publish", END)
    return builder.compile()


class Note(TypedDict):
    text: str
    note: Any


def note_graph() -> Any:
    def ask(state: Note) -> dict[str, Any]:
        return {"note": interrupt({"question": "any note?", "text": state["text"]})}

    builder = StateGraph(Note)
    builder.add_node("ask", ask)
    builder.add_edge(START, "ask")
    builder.add_edge("ask", END)
    return builder.compile()


def twice_graph() -> Any:
    def ask(state: Note) -> dict[str, Any]:
        first = interrupt({"question": "publish?", "text": state["text"]})
        second = interrupt({"question": "delete the draft?", "text": state["text"]})
        return {"note": [first, second]}

    builder = StateGraph(Note)
    builder.add_node("ask", ask)
    builder.add_edge(START, "ask")
    builder.add_edge("ask", END)
    return builder.compile()


class Payment(BaseModel):
    """A payment's resume value: LangGraph validates it in the node, the limit included
    (which its JSON schema does not say)."""

    amount: int

    @field_validator("amount")
    @classmethod
    def at_most_100(cls, amount: int) -> int:
        if amount > 100:
            raise ValueError("at most 100")
        return amount


class Paid(TypedDict):
    paid: int


def payment_graph() -> Any:
    """A node asking how much to pay, its resume value declared by ``response_schema``."""
    builder = StateGraph(Paid)
    builder.add_node("ask", lambda state: {
        "paid": interrupt("how much?", response_schema=Payment).amount})
    builder.add_edge(START, "ask")
    builder.add_edge("ask", END)
    return builder.compile()


class Pipeline(TypedDict):
    messages: Annotated[list[BaseMessage], add_messages]


def pipeline_graph(steps: int = 4, answer: str = "answer") -> Any:
    """``steps`` nodes in a row, each asking the model once (which says ``answer`` and
    how many it answered before)."""
    model = ScriptedModel(responses=[AIMessage(f"{answer} {n}") for n in range(steps)])

    def ask(state: Pipeline) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(Pipeline)
    previous = START
    for n in range(steps):
        builder.add_node(f"step{n}", ask)
        builder.add_edge(previous, f"step{n}")
        previous = f"step{n}"
    builder.add_edge(previous, END)
    return builder.compile()


def register_all(registry: Registry, kernel: Callable[[], Kernel]) -> dict[str, GraphHost]:
    return {
        AGENT: register_graph(registry, AGENT, notice_agent(), kernel=kernel),
        APPROVAL: register_graph(registry, APPROVAL, approval_graph(), kernel=kernel),
        PIPELINE: register_graph(registry, PIPELINE, pipeline_graph(), kernel=kernel),
        PIPELINE_V2: register_graph(registry, PIPELINE_V2, pipeline_graph(answer="revised"),
                                    kernel=kernel),
        NOTE: register_graph(registry, NOTE, note_graph(), kernel=kernel),
        TWICE: register_graph(registry, TWICE, twice_graph(), kernel=kernel),
        PAYMENT: register_graph(registry, PAYMENT, payment_graph(), kernel=kernel),
    }


def register(registry: Registry) -> None:
    """``KERNEL_TASK_MODULES``' entry point: the graphs on the process's kernel."""

    def kernel() -> Kernel:
        from controlplane.worker.runtime import runtime

        return runtime().kernel

    register_all(registry, kernel)


_ON_RUNTIME: dict[str, GraphHost] = {}


def on_runtime() -> dict[str, GraphHost]:
    """The graphs registered (once per process) on the control plane's kernel, for the
    tests that run them in-process."""
    from controlplane.worker.runtime import runtime

    registry = runtime().kernel.registry
    if not _ON_RUNTIME and APPROVAL not in registry.kinds():
        _ON_RUNTIME.update(register_all(registry, lambda: runtime().kernel))
    return _ON_RUNTIME


def release(hosts: dict[str, GraphHost]) -> None:
    """Close the hosts' savers (their thread and connection); the next run opens one."""
    for host in hosts.values():
        if host._saver is not None:
            host._saver.close()
            host._saver = None
