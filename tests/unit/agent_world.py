"""The agent loop's world on the reference storage: a scripted model, the tools it may call
(a batch, a slow batch, safe and unsafe calls, one that kills its worker) and the crashes a
test asks for; and the two-round script that calls the notice tool once."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kernel import (
    Draft,
    InMemoryStorage,
    Kernel,
    ManualClock,
    Preview,
    Registry,
    Run,
    Transition,
)
from kernel.agent import (
    Compaction,
    ModelRequest,
    ModelResponse,
    Replay,
    ScriptedProvider,
    Tool,
    Toolbox,
    ToolCall,
    register_agent,
    submit,
)
from tests.unit.crashes import Crash, CrashPoints, run_across_crashes

RECIPIENTS = ["ana@example.com", "ben@example.com", "cai@example.com"]
NOTICE = ToolCall("call_1", "send_notices", {"recipients": RECIPIENTS, "subject": "S"})


@dataclass
class World(CrashPoints):
    provider: ScriptedProvider
    effects: list[str] = field(default_factory=list)
    storage: InMemoryStorage = field(default_factory=InMemoryStorage)
    clock: ManualClock = field(default_factory=ManualClock)
    previews: list[Preview] = field(default_factory=list)
    partial_fails: bool = False
    compaction: Compaction | None = None
    lookup_kind: str | None = None
    """Where lookup runs as a task of this kind (a deploy that moved it): not in the call."""
    page_manual: str = "Read a page"
    """The page tool's description: a long one makes the tool schemas a large part of
    every request."""

    def kernel(self) -> Kernel:
        registry = Registry()

        @registry.task("fake-batch")
        class FakeBatch:
            initial = "send"

            def send(self, run: Run) -> Transition:
                world.effects.extend(f"sent:{to}" for to in run.input["recipients"])
                return run.succeed(
                    {"receipts": {to: f"msg-{to}" for to in run.input["recipients"]}}
                )

        @registry.task("slow-batch")
        class SlowBatch:
            """Sends to the first recipient, records it, then waits to be let go on."""

            initial = "first"

            def first(self, run: Run) -> Transition:
                first = run.input["recipients"][0]
                world.effects.append(f"sent:{first}")
                run.set("slow-plan", run.task_id, [], {"sent": [first]})
                return run.wait_for("go", then="rest")

            def rest(self, run: Run) -> Transition:
                return run.succeed({"sent": run.input["recipients"]})

        def slow_partial(run: Run, task_id: str | None, args: dict[str, Any]) -> Any:
            if world.partial_fails:
                raise RuntimeError("the plan cannot be read")
            sent = run.document("slow-plan", task_id).get("sent", []) if task_id else []
            return {"sent": sent, "unsent": [to for to in args["recipients"] if to not in sent]}

        registry.document("slow-plan")
        world = self
        toolbox = Toolbox()
        toolbox.add(
            Tool(
                "send_notices",
                "Send the approved notice",
                {
                    "type": "object",
                    "properties": {
                        "recipients": {"type": "array", "items": {"type": "string"}},
                        "subject": {"type": "string"},
                    },
                    "required": ["recipients"],
                },
                task_kind="fake-batch",
            )
        )

        def lookup(run: Run, args: dict[str, Any]) -> Any:
            world.effects.append(f"lookup:{args['q']}")
            world.maybe_crash("lookup")
            return {"found": args["q"]}

        def charge(run: Run, args: dict[str, Any]) -> Any:
            world.effects.append(f"charge:{args['amount']}")
            world.maybe_crash("charge")
            return {"charged": args["amount"]}

        def charge_unstorably(run: Run, args: dict[str, Any]) -> Any:
            world.effects.append(f"charge:{args['amount']}")
            return {"charged": args["amount"], "receipt": "r-1\x00"}  # NUL: no storage holds it

        def always_dies(run: Run, args: dict[str, Any]) -> Any:
            world.effects.append("die")
            raise Crash()

        toolbox.add(
            Tool(
                "send_slowly",
                "Send the approved notice, one by one",
                {"type": "object", "properties": {"recipients": {"type": "array"}}},
                task_kind="slow-batch",
                partial=slow_partial,
            )
        )
        number = {"type": "object", "properties": {"amount": {"type": "number"}}}
        if self.lookup_kind is None:
            toolbox.add(Tool("lookup", "Read", {"type": "object"}, Replay.SAFE, run=lookup))
        else:
            @registry.task(self.lookup_kind)
            class Lookup:
                initial = "read"

                def read(self, run: Run) -> Transition:
                    return run.succeed(lookup(run, run.input))

            toolbox.add(Tool("lookup", "Read", {"type": "object"}, Replay.SAFE,
                             task_kind=self.lookup_kind))
        toolbox.add(Tool("charge", "Pay", number, Replay.UNSAFE, run=charge))
        for name, above in [("charge_unstorably", 16_384), ("charge_unstorably_whole", None)]:
            toolbox.add(Tool(name, "Pay; its receipt cannot be stored", number, Replay.UNSAFE,
                             run=charge_unstorably, artifact_above=above))
        toolbox.add(Tool("die", "Crashes", {"type": "object"}, Replay.SAFE, run=always_dies))
        toolbox.add(Tool("page", self.page_manual, {"type": "object"}, Replay.SAFE,
                         run=lambda run, args: {"text": f"{args.get('n')}:" + "p" * 5000}))
        register_agent(registry, {"scripted": self.provider}, toolbox, "scripted",
                       self.compaction)
        kernel = Kernel(self.storage, registry, self.clock)
        kernel.on_preview(self.previews.append)
        return kernel

    def run(self, crashes_allowed: int = 0, advance_clock: bool = True) -> int:
        """Run to idle; a Crash is a dead process: start a fresh one, as often as allowed."""
        return run_across_crashes(self.kernel, self.clock, crashes_allowed=crashes_allowed,
                                  advance_clock=advance_clock)

    def start(self, text: str = "Send the approved notice and summarise", **kw: Any) -> Any:
        kernel = self.kernel()
        handle = kernel.create_session()
        draft = Draft()
        conversation = draft.create_conversation()
        handle.commit(draft)
        submitted = submit(
            handle, conversation, {"text": text}, kw.pop("request_id", "req-1"), **kw
        )
        return kernel, handle, conversation, submitted


def two_rounds(final: str = "Sent to all three.") -> ScriptedProvider:
    def script(request: ModelRequest) -> ModelResponse:
        if any(m["role"] == "tool" for m in request.messages):
            receipts = [m["content"] for m in request.messages if m["role"] == "tool"]
            return ModelResponse(
                f"{final} {receipts}", usage={"input_tokens": 20, "output_tokens": 8}
            )
        return ModelResponse("", (NOTICE,), {"input_tokens": 10, "output_tokens": 4})

    return ScriptedProvider(script)


def kinds(kernel: Kernel, conversation: str) -> list[str]:
    return [e.kind for e in kernel.entries(conversation)]
