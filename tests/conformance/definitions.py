"""Task definitions the conformance tests drive: small, but each phase kind appears.

``effects`` records external work (what an outside system would see); the
``log`` document records committed work. Comparing the two is how tests tell
"the action ran twice" from "the committed effect was applied twice". ``start`` puts one
task of them in a new session.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from kernel import Draft, JoinPolicy, Registry, Run, Transition

from .world import World


@dataclass
class Effects:
    calls: list[str] = field(default_factory=list)
    hooks: dict[str, Callable[[Run], None]] = field(default_factory=dict)

    def external(self, run: Run, name: str) -> None:
        self.calls.append(f"{run.input.get('name', run.task_id)}:{name}")
        hook = self.hooks.get(name)
        if hook is not None:
            hook(run)


def log(run: Run, what: str) -> None:
    run.update(
        "log", "main", {"op": "append", "path": [run.input.get("name", run.task_id)], "value": what}
    )


def make_registry(effects: Effects) -> Registry:
    registry = Registry()
    registry.document("log")
    registry.document("plan")

    @registry.task("step")
    class Step:
        """Intent commit, external call, result commit: the shape of a tool call."""

        initial = "start"

        def start(self, run: Run) -> Transition:
            run.commit(phase="act")
            return self.act(run)

        def act(self, run: Run) -> Transition:
            effects.external(run, "act")
            log(run, "act")
            if run.input.get("fail"):
                return run.fail("asked to fail")
            return run.succeed({"name": run.input.get("name")})

    @registry.task("napper")
    class Napper:
        initial = "nap"

        def nap(self, run: Run) -> Transition:
            log(run, "nap")
            return run.sleep(run.input.get("seconds", 10), then="wake")

        def wake(self, run: Run) -> Transition:
            log(run, "wake")
            return run.succeed("rested")

    @registry.task("asker")
    class Asker:
        """Waits for an operator's resolution (a named external signal)."""

        initial = "ask"

        def ask(self, run: Run) -> Transition:
            answer = run.signal("resolution")
            if answer is None:
                log(run, "ask")
                return run.wait_for("resolution")
            log(run, f"answer:{answer['decision']}")
            return run.succeed(answer)

        def on_cancel(self, run: Run) -> None:
            log(run, "cancelled")

    @registry.task("parent")
    class Parent:
        """Fans out to children, joins them, summarises their outcomes."""

        initial = "fan_out"

        def fan_out(self, run: Run) -> Transition:
            children = [run.spawn(c["kind"], c["input"]) for c in run.input["children"]]
            policy = JoinPolicy(run.input.get("policy", "all_settled"))
            log(run, "fan_out")
            return run.wait_all(children, then="summarize", policy=policy)

        def summarize(self, run: Run) -> Transition:
            outcomes = run.outcomes()
            kinds = sorted(o["kind"] for o in outcomes.values())
            log(run, "summarize")
            if run.input.get("finish_early"):
                return run.succeed(kinds)
            if all(k == "succeeded" for k in kinds):
                return run.succeed(kinds)
            return run.fail(f"children: {kinds}", result=kinds)

        def on_cancel(self, run: Run) -> None:
            log(run, "cancelled")

    @registry.task("quitter")
    class Quitter:
        """Spawns a child and finishes without waiting: the owner goes completing."""

        initial = "go"

        def go(self, run: Run) -> Transition:
            run.spawn(run.input["child"]["kind"], run.input["child"]["input"])
            return run.succeed("done early")

    return registry


def start(world: World, kind: str, input: dict, registry: Registry | None = None):
    registry = registry or make_registry(Effects())
    kernel = world.kernel(registry)
    handle = kernel.create_session()
    draft = Draft(actor="user:ann")
    task_id = draft.create_task(kind, input)
    handle.commit(draft)
    return kernel, handle, task_id
