"""The durability capability: a Pydantic AI agent whose model requests and tool calls
are durable units recorded in the Session Store.

Built on Pydantic AI's public engine surface (``BaseDurabilityCapability`` and a
``CallableOperationBackend``): the framework keeps its own model, toolset and output
machinery and hands each unit to :meth:`KernelOperationBackend.execute`, which answers
from the journal what was committed and commits what was not. Outside a kernel run
(no task is running the agent) the capability is transparent: ``agent.run()`` is a plain
run, as with ``DBOSDurability`` outside a workflow.

A tool's replay policy is declared where the tool is defined, in its metadata under
``"kernel"`` (:data:`SAFE`, :data:`UNSAFE`); unsafe is the default. A tool marked
:func:`hands` runs as a task of its own on the ``hands`` queue: the turn does not run the
call, it commits the call's task and waits for it holding no lease (:class:`Units`).

With ``KernelDurability(stream=True)`` model requests stream (the model must support
it), and their text is shown live as previews: progress that costs no commit and that
recovery never reads.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterable, Awaitable, Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, cast

from pydantic_ai.durable_exec import (
    JSON_CODEC,
    BaseDurabilityCapability,
    CallableOperationBackend,
    DurabilityEngineSpec,
    DurableOperationId,
    JournalOperationNamer,
    ModelRequestId,
    RoleBasedOperationConfig,
    ToolsetCallToolId,
    conversation_id_from_run_id,
)
from pydantic_ai.exceptions import UserError
from pydantic_ai.messages import (
    AgentStreamEvent,
    ModelMessagesTypeAdapter,
    PartDeltaEvent,
    PartStartEvent,
    TextPart,
    TextPartDelta,
)
from pydantic_ai.models import Model
from pydantic_ai.tools import AgentDepsT, RunContext
from pydantic_ai.toolsets import ToolsetTool
from pydantic_core import to_jsonable_python

from kernel.agent.tools import Replay
from kernel.agent.turn import PROGRESS, PROGRESS_EVERY
from kernel.errors import UnstorableValue
from kernel.run import Run
from kernel.values import storable

from .bridge import Bridge
from .journal import Journal, unit_of

JSON = Any
CONFIG_KEY = "kernel"
SAFE: dict[str, JSON] = {CONFIG_KEY: {"replay": str(Replay.SAFE)}}
"""Tool metadata: the call may run again when it is not known whether it ran (it reads,
or is idempotent by construction): ``@agent.tool_plain(metadata=SAFE)``."""
UNSAFE: dict[str, JSON] = {CONFIG_KEY: {"replay": str(Replay.UNSAFE)}}
"""Tool metadata: the call must never run twice (the default)."""
HANDS_QUEUE = "hands"


def hands(policy: dict[str, JSON] = UNSAFE) -> dict[str, JSON]:
    """Tool metadata: each call runs as a task of its own on the ``hands`` queue, with
    ``policy`` (:data:`SAFE` or :data:`UNSAFE`, the default), while the turn waits for it
    holding no worker: ``@agent.tool(metadata=hands(SAFE))``."""
    return {CONFIG_KEY: {**(policy.get(CONFIG_KEY) or {}), "queue": HANDS_QUEUE}}


HANDS: dict[str, JSON] = hands(UNSAFE)
"""Tool metadata: an unsafe call that runs on the ``hands`` queue (:func:`hands`)."""


def shown_arguments(arguments: object) -> JSON:
    """A call's validated arguments as JSON, for its intent and its hands task's input (a
    datetime as ISO text, a model as its fields, bytes as base64): what people and the
    storage read; the tool itself is always given the framework's own values."""
    return to_jsonable_python(arguments, bytes_mode="base64", fallback=repr)


def replay_of(config: JSON) -> Replay:
    """The replay policy a tool's resolved config names (unsafe unless it says safe)."""
    value = (config or {}).get("replay", str(Replay.UNSAFE)) if isinstance(config, dict) else None
    if value not in (Replay.SAFE, Replay.UNSAFE):
        raise UserError(f"a tool's {CONFIG_KEY!r} metadata has replay {value!r}: "
                        "'safe' or 'unsafe'")
    return Replay(value)


def queue_of(config: JSON) -> str | None:
    """The queue a tool's resolved config sends its calls to (None: the turn runs them)."""
    value = config.get("queue") if isinstance(config, dict) else None
    if value not in (None, HANDS_QUEUE):
        raise UserError(f"a tool's {CONFIG_KEY!r} metadata has queue {value!r}: "
                        f"{HANDS_QUEUE!r} or none")
    return value


class Suspended(BaseException):  # noqa: N818 - a signal to unwind, like GeneratorExit
    """Unwinds the agent's loop where the run must stop without an answer: the turn
    before a model request while calls wait for their hands tasks, a hands task once the
    replay has passed its call. Not an ``Exception``, so neither the framework nor a tool
    catches it."""


def suspended(exc: BaseException) -> bool:
    """Whether ``exc`` is :class:`Suspended`, or a group the event loop wrapped it in."""
    if isinstance(exc, Suspended):
        return True
    return isinstance(exc, BaseExceptionGroup) and all(suspended(e) for e in exc.exceptions)


ON_HANDS: JSON = {"kind": "tool_return", "result": "(this call runs as a task of its own)"}
"""What the framework is given for a call another task runs, so that the other calls
of the response go on: never committed, never shown to the model (the run stops before
its next request and is replayed with the call's recorded result)."""


DEFERRED = ("approval_required", "call_deferred")
"""Payload kinds of a tool call the framework defers (it ends the run's segment): not a
result, so the call runs when the next segment brings its approval."""


class Preview:
    """A model request's streamed text, pushed as previews of the turn's progress
    document (often, but not at every token: each one is a hop to the phase's thread)."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.text = ""
        self.pushed = 0.0

    def add(self, delta: str) -> bool:
        """Add ``delta``; True when it is time to push."""
        self.text += delta
        now = time.monotonic()
        if now - self.pushed < PROGRESS_EVERY:
            return False
        self.pushed = now
        return True

    def push(self) -> None:
        self.run.preview(PROGRESS, self.run.task_id, ["text"], self.text)

    def fold(self) -> None:
        """The response is committed: its text is in the transcript now."""
        if self.text:
            self.run.set(PROGRESS, self.run.task_id, ["text"], self.text)
        self.text, self.pushed = "", 0.0


@dataclass
class Units:
    """The kernel run the agent's loop is inside: its bridge to the phase and its journal.

    A unit's writes join the run's next commit rather than each making one where that
    keeps every promise (fewer commits per step): a response whose calls are all unsafe
    is committed with the first call's intent (both must be durable before the call
    starts, and nothing runs between them); a safe call's result waits for the next
    commit (usually the next response), since losing it only makes the call run again.
    An answer (a response that calls no tool) of an agent with no output validator is
    committed with the run's end, since only the framework's own handling of it runs
    between (a crash there asks the model again, as one during the request would). A
    response is still committed before any tool starts, before the next request and
    before the run ends. An unsafe call's result is committed as soon as the call returns
    (before the model's next request, where the run's loop is on the phase's thread; while
    it is made, where the loop has a thread of its own: :mod:`.bridge`); in a hands task,
    with the task's end, the next thing it commits and what wakes the turn.
    """

    bridge: Bridge
    journal: Journal
    segment: int
    task_id: str
    started_at: datetime | None
    decisions: dict[str, JSON] = field(default_factory=dict)
    """Operators' decisions on deferred calls, by call id (shown with their results)."""
    stream: Preview | None = None
    unsafe_tools: frozenset[str] = frozenset()
    """The function tools whose calls commit before they start (an unsafe call's intent, a
    hands call's task): what a held response may name."""
    only_call: str | None = None
    """In a hands task: the one call it runs; every other call is another task's."""
    parked: dict[str, JSON] = field(default_factory=dict)
    """In the turn: the calls of the current response that hands tasks are to run, by
    call id (name, arguments, replay policy), in the order the framework reached them."""
    handed: dict[str, JSON] = field(default_factory=dict)
    """In the turn: what the framework is given for calls whose hands task ended
    without a result (deferred by the tool), by call id."""
    deferred: JSON = None
    """In a hands task: what the framework got when its call was deferred by the tool."""
    requests: int = 0
    calls: dict[str, str] = field(default_factory=dict)
    staged: list[Callable[[], None]] = field(default_factory=list)
    """Writes waiting for the run's next commit, run on the phase's thread before it."""
    answer_ends: bool = False
    """An answer may wait for the run's end (:attr:`HostedAgent.answer_ends`)."""
    holding_response: bool = False
    """A response is staged, not committed: only an unsafe call's intent, or the run's
    end, may follow it."""
    occurrences: dict[str, int] = field(default_factory=dict)
    """By call id: how many of the turn's responses so far made a call with that id (the
    latest one's calls are the ones that run: :func:`~.journal.unit_of`)."""

    def __post_init__(self) -> None:
        # The segments before this one: the run goes on from their last response.
        earlier = sorted((int(segment), int(n), payload)
                         for key, payload in self.journal.responses.items()
                         for segment, _, n in [key.split(":")]
                         if int(segment) < self.segment)
        for _, _, payload in earlier:
            self.count_calls(payload)

    def count_calls(self, payload: JSON) -> None:
        """Count the call ids of a response the run has reached."""
        if isinstance(payload, dict):
            for call_id in {part.get("tool_call_id") for part in payload.get("parts") or []
                            if part.get("part_kind") == "tool-call"}:
                if call_id:
                    self.occurrences[call_id] = self.occurrences.get(call_id, 0) + 1

    def unit(self, call_id: str) -> tuple[str, int]:
        """The journal's key for a call of the latest response, and its occurrence."""
        occurrence = self.occurrences.get(call_id) or 1
        return unit_of(call_id, occurrence), occurrence

    @property
    def run_id(self) -> str:
        """The framework's id of this segment's run: each ``agent.run`` needs its own."""
        return self.task_id if self.segment == 0 else f"{self.task_id}.{self.segment}"

    def take_staged(self) -> list[Callable[[], None]]:
        staged, self.staged = self.staged, []
        return staged

    def _after_staged(self, fn: Callable[[], None]) -> Callable[[], None]:
        """``fn``, which commits, preceded by the staged writes (so they join its commit)."""
        staged = self.take_staged()
        self.holding_response = False

        def on_phase() -> None:
            for stage in staged:
                stage()
            fn()

        return on_phase

    async def write(self, fn: Callable[[], None]) -> None:
        """Run ``fn``, which commits, on the phase's thread, after the staged writes (so
        they join its commit)."""
        await self.bridge.call(self._after_staged(fn))

    def post(self, fn: Callable[[], None]) -> None:
        """:meth:`write` without waiting for the commit: the run goes on while it is
        written, and every later write is committed after it."""
        self.bridge.post(self._after_staged(fn))

    async def flush(self) -> None:
        """Commit a held response (its calls did not all reach their intents)."""
        if self.holding_response:
            await self.write(self.journal.commit)

    def holds(self, payload: JSON) -> bool:
        """Whether a response may wait for the next commit: it calls only unsafe function
        tools (each commits an intent before it starts), or it is an answer that may wait
        for the run's end."""
        if not isinstance(payload, dict):
            return False
        names = [part.get("tool_name") for part in payload.get("parts") or []
                 if part.get("part_kind") == "tool-call"]
        if not names:
            return self.answer_ends
        return all(name in self.unsafe_tools for name in names)

    async def streamed(self, events: Any) -> None:
        """The event stream handler's side: text deltas of the request under way."""
        async for event in events:
            delta = None
            if isinstance(event, PartStartEvent) and isinstance(event.part, TextPart):
                delta = event.part.content
            elif isinstance(event, PartDeltaEvent) and isinstance(event.delta, TextPartDelta):
                delta = event.delta.content_delta
            if delta and self.stream is not None and self.stream.add(delta):
                await self.bridge.call(self.stream.push)

    async def model_request(self, body: Callable[[], Awaitable[object]],
                            messages: object = None) -> object:
        key = f"{self.segment}:model:{self.requests}"
        self.requests += 1
        recorded = self.journal.responses.get(key)
        if recorded is not None:
            self.count_calls(recorded)
            return recorded  # a committed response is never requested again
        if self.only_call is not None or self.parked:
            # A hands task never asks the model; the turn asks only once every call of the
            # response has its result, so it stops here and waits for the hands tasks.
            raise Suspended()
        await self.flush()
        if self.bridge.failure is not None:
            # A write the run did not wait for failed (an unsafe call's result the
            # storage refuses): the run ends with it, and a request now would be paid
            # for and thrown away.
            raise self.bridge.failure
        payload = await body()
        self.count_calls(payload)
        stream = self.stream
        # The request that opens a conversation holds the agent's system prompt, which the
        # framework sends only there: a cancelled turn hands it on (leave_cancelled).
        request = None
        if key == "0:model:0" and isinstance(messages, list) and len(messages) == 1:
            request = ModelMessagesTypeAdapter.dump_python(messages, mode="json")[0]

        def stage() -> None:
            if stream is not None:
                stream.fold()
            self.journal.record_response(key, payload, request)

        self.staged.append(stage)
        if self.holds(payload):
            self.holding_response = True
        else:
            await self.write(self.journal.commit)
        return payload

    async def tool_call(self, call_id: str, name: str, arguments: JSON, replay: Replay,
                        body: Callable[[], Awaitable[object]], queue: str | None = None) -> object:
        # A call id an earlier response of the turn used too names another call there.
        key, occurrence = self.unit(call_id)
        recorded = self.journal.results.get(key)
        if recorded is not None:
            return recorded
        if self.only_call is not None and key != self.only_call:
            return dict(ON_HANDS)  # another task's call: never run here
        if self.only_call is None and queue is not None:
            if key in self.handed:
                return self.handed[key]
            # Its own task runs it: the other calls of the response go on meanwhile, and
            # the run stops before anything that needs this call's result.
            self.parked[key] = {"name": name, "arguments": arguments, "replay": str(replay),
                                "call_id": call_id, "occurrence": occurrence}
            return dict(ON_HANDS)
        if replay is Replay.UNSAFE:
            await self.write(lambda: self.journal.record_intent(call_id, name, arguments,
                                                                occurrence))
        else:
            await self.flush()
        started = time.monotonic()
        payload = await body()
        seconds = round(time.monotonic() - started, 6)
        if isinstance(payload, dict) and payload.get("kind") in DEFERRED:
            if replay is Replay.UNSAFE:  # asked instead of running: nothing took effect
                await self.write(lambda: self.journal.forget_intent(key))
            if key == self.only_call:  # the turn defers it (its hands task's answer)
                self.deferred = payload
            return payload
        try:
            storable(payload, f"the result of tool {name!r}")
        except UnstorableValue as exc:
            # The call has run: it is answered so, as a native call is, both now and on
            # replay (the journal holds this answer). Its own result would fail its
            # commit and end the turn, leaving a call that certainly ran uncertain.
            payload = {"kind": "tool_failed",
                       "message": f"The call ran, but its result cannot be stored (so it "
                                  f"is not shown): {exc}"}
        decided = self.decisions.get(call_id)
        extra = {} if decided is None else {"approval": decided}
        if replay is Replay.SAFE or key == self.only_call:
            # A safe call's result may wait for the next commit: losing it only makes the
            # call run again. A hands task's call (either policy) waits for the commit that
            # ends the task, which nothing runs before and which is what wakes the turn: a
            # crash before it leaves an unsafe call uncertain, as during its own commit.
            self.staged.append(lambda: self.journal.record_result(
                call_id, name, payload, replay, seconds, commit=False, occurrence=occurrence,
                **extra))
        else:
            # Not awaited where the loop has a thread of its own: the next model request
            # is made while the result is committed (a crash before it is committed leaves
            # the call uncertain, as it would during an awaited commit), and the phase's
            # thread commits it before anything after. On the phase's thread: now.
            self.post(lambda: self.journal.record_result(
                call_id, name, payload, replay, seconds, occurrence=occurrence, **extra))
        return payload


_UNITS: ContextVar[Units | None] = ContextVar("kernel_hosted_run", default=None)


def current_units() -> Units | None:
    return _UNITS.get()


def operation_id(ctx: RunContext[Any]) -> str:
    """Inside a tool: an id for this call that is the same on every replay of the run
    (the task and the model's call id), for an outside system's idempotency key."""
    units = _UNITS.get()
    if units is None:
        return f"op_{ctx.run_id}_{ctx.tool_call_id}"
    key, _ = units.unit(str(ctx.tool_call_id))
    return f"op_{units.task_id}_{key}"


def save_partial(ctx: RunContext[Any], value: JSON) -> None:
    """Inside a tool: commit ``value`` (JSON) as what this call has done so far, say the
    recipients a notice already went to. If the turn is cancelled before the call
    returns, the next turn's model is told the call was cancelled, with this value as
    its partial result. Each call is a commit (it blocks until committed); outside a
    kernel run it does nothing."""
    units = _UNITS.get()
    if units is None or ctx.tool_call_id is None:
        return
    call_id = ctx.tool_call_id
    units.bridge.call_sync(lambda: units.journal.save_partial(call_id, value))


class KernelOperationBackend(CallableOperationBackend[dict[str, Any]]):
    """Runs each unit through the journal of the kernel run it is inside."""

    async def execute(
        self,
        *,
        operation_id: DurableOperationId,
        name: str,
        body: Callable[[], Awaitable[object]],
        cache_key: tuple[object, ...],
        config: dict[str, Any],
    ) -> object:
        units = _UNITS.get()
        if units is None:
            return await body()
        match operation_id:
            case ModelRequestId():
                return await units.model_request(body, cache_key[1])
            case ToolsetCallToolId():
                tool_name, arguments, ctx = cache_key[0], cache_key[1], cache_key[2]
                assert isinstance(ctx, RunContext) and ctx.tool_call_id is not None
                return await units.tool_call(ctx.tool_call_id, str(tool_name),
                                             shown_arguments(arguments), replay_of(config),
                                             body, queue_of(config))
            case _:
                # Argument validation, discovery, event handling, capability operations:
                # deterministic or without effects, so they run again on replay.
                return await body()


@dataclass(init=False, kw_only=True)
class KernelDurability(BaseDurabilityCapability[AgentDepsT]):
    """Makes an agent's runs durable on the kernel: add it to ``capabilities=[...]`` and
    register the agent (:func:`kernel.hosts.pydantic_ai.register_agent`)."""

    engine_spec = DurabilityEngineSpec(
        engine_name="the durable kernel",
        durable_unit_noun="step",
        durable_unit_plural="steps",
        durable_container_noun="task",
        codec=JSON_CODEC,  # units are journaled as JSON entries
        wrapped_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
        toolset_lifecycles={"function": "enter-always", "mcp": "enter-in-durable-unit",
                            "dynamic": "enter-never"},
        unsupported_runtime_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
        tool_config_key=CONFIG_KEY,
    )

    def __init__(self, *, models: Mapping[str, Model] | None = None,
                 name: str | None = None, stream: bool = False) -> None:
        super().__init__(models=models, name=name,
                         event_stream_handler=previews if stream else None)

    @property
    def in_durable_context(self) -> bool:
        return _UNITS.get() is not None

    def get_default_run_id(self) -> str | None:
        units = _UNITS.get()
        return None if units is None else units.run_id

    def get_default_conversation_id(self, run_id: str) -> str | None:
        units = _UNITS.get()  # one conversation over the turn's segments
        return None if units is None else conversation_id_from_run_id(units.task_id)

    async def get_run_start_time(self, run_id: str) -> datetime | None:
        units = _UNITS.get()
        return None if units is None else units.started_at

    def get_durable_operation_backend(self) -> KernelOperationBackend:
        resolve = self._build_resolve_tool_config({})

        def tool_config(operation: DurableOperationId, tool: object | None,
                        tool_name: str) -> dict[str, Any] | Literal[False]:
            found = resolve(cast(ToolsetTool[Any] | None, tool), tool_name)
            return False if found is False else dict(found or {})

        return KernelOperationBackend(
            namer=JournalOperationNamer(self.name or "agent"),
            config=RoleBasedOperationConfig(model={}, event={}, capability={}, tool={},
                                            resolve_tool=tool_config),
        )


async def previews(ctx: RunContext[Any], events: AsyncIterable[AgentStreamEvent]) -> None:
    """The event stream handler ``stream=True`` installs: in a kernel run, the model's
    text as previews; outside one, nothing."""
    units = _UNITS.get()
    if units is not None:
        await units.streamed(events)
    else:
        async for _ in events:
            pass


def enter(units: Units) -> None:
    """Mark the calling context as inside ``units``' kernel run (the agent thread's)."""
    _UNITS.set(units)
