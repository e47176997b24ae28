"""Random task trees for the crash property (tests/unit/test_crash_property.py, and on Postgres
tests/integration/test_crash_property_postgres.py): the node task kind, the tree strategy,
and a driver that runs a tree with the process "dying" at chosen fault points, then checks
both runs agree."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

from kernel import (
    Draft,
    InMemoryStorage,
    JoinPolicy,
    Kernel,
    ManualClock,
    Registry,
    Run,
    Scheduler,
    Status,
    Storage,
    Transition,
)
from kernel.storage import FaultHook
from tests.unit.crashes import Crash

LEASE = 30.0


@dataclass
class Faults:
    crash_at: set[int]
    count: int = 0
    crashes: int = 0

    def point(self, _name: str = "") -> None:
        self.count += 1
        if self.count in self.crash_at:
            self.crashes += 1
            raise Crash()


@dataclass
class Effects:
    external: list[str] = field(default_factory=list)


def node_registry(faults: Faults, effects: Effects) -> Registry:
    registry = Registry()
    registry.document("log")

    def log(run: Run, what: str) -> None:
        run.update("log", "tree", {"op": "append", "path": [run.input["name"]], "value": what})

    def act(run: Run, what: str) -> None:
        faults.point()
        effects.external.append(f"{run.input['name']}:{what}")
        faults.point()

    @registry.task("node")
    class Node:
        initial = "begin"

        def begin(self, run: Run) -> Transition:
            act(run, "begin")
            log(run, "begin")
            if run.input["sleep"]:
                return run.sleep(run.input["sleep"], then="ask")
            return run.next("ask")

        def ask(self, run: Run) -> Transition:
            if run.input["signal"] is None:
                return run.next("fan")
            if run.signal("go") is None:
                log(run, "ask")
                return run.wait_for("go")
            act(run, "answered")
            log(run, "answered")
            return run.next("fan")

        def fan(self, run: Run) -> Transition:
            act(run, "fan")
            log(run, "fan")
            if not run.input["children"]:
                return run.next("finish")
            ids = [run.spawn("node", child) for child in run.input["children"]]
            return run.wait_all(ids, then="finish", policy=JoinPolicy(run.input["policy"]))

        def finish(self, run: Run) -> Transition:
            act(run, "finish")
            log(run, "finish")
            children_ok = all(o["kind"] == "succeeded" for o in run.outcomes().values())
            if run.input["fail"] or not children_ok:
                return run.fail("failed as planned")
            return run.succeed(run.input["name"])

        def on_cancel(self, run: Run) -> None:
            act(run, "cancel")
            log(run, "cancelled")

    return registry


# -- trees -------------------------------------------------------------------------------


def leaf(name: str, fail: bool, sleep: int, signal: str | None) -> dict[str, Any]:
    return {"name": name, "fail": fail, "sleep": sleep, "signal": signal, "children": [],
            "policy": "all_settled"}


@st.composite
def trees(draw: st.DrawFn, name: str = "r", depth: int = 0) -> dict[str, Any]:
    node = leaf(
        name,
        fail=draw(st.booleans()) and draw(st.booleans()),
        sleep=draw(st.sampled_from([0, 0, 5, 120])),
        signal=draw(st.sampled_from([None, None, "deliver", "cancel"])),
    )
    if depth >= 2:
        return node
    policy = draw(st.sampled_from(["all_settled", "fail_fast"]))
    count = draw(st.integers(min_value=1 if depth == 0 else 0, max_value=3))
    children = [draw(trees(f"{name}.{i}", depth + 1)) for i in range(count)]
    if policy == "fail_fast" and children:
        failer = draw(st.integers(min_value=-1, max_value=len(children) - 1))
        children = [
            leaf(c["name"], True, 0, None) if i == failer else _delayed(_fail_free(c))
            for i, c in enumerate(children)
        ]
    node.update(children=children, policy=policy)
    return node


def _fail_free(node: dict[str, Any]) -> dict[str, Any]:
    """A subtree whose outcome cannot depend on when its fail_fast sibling fails."""
    signal = "deliver" if node["signal"] else None
    children = [_fail_free(c) for c in node["children"]]
    return {**node, "fail": False, "signal": signal, "children": children}


def _delayed(node: dict[str, Any]) -> dict[str, Any]:
    """Still unfinished when an immediate sibling failure cancels it."""
    return {**node, "sleep": node["sleep"] if node["signal"] else 120}


# -- driving -------------------------------------------------------------------------------


@dataclass
class Result:
    outcomes: dict[str, str]
    logs: dict[str, list[str]]
    seqs: list[int]
    head: int
    crashes: int


def spec_of(tree: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found = {tree["name"]: tree}
    for child in tree["children"]:
        found.update(spec_of(child))
    return found


def drive(
    tree: dict[str, Any],
    crash_at: set[int],
    make_storage: Callable[[FaultHook], Storage] = InMemoryStorage,
) -> Result:
    faults = Faults(crash_at)
    storage = make_storage(faults.point)
    clock = ManualClock()
    specs = spec_of(tree)
    registry = node_registry(Faults(set()), Effects())
    kernel = Kernel(storage, registry, clock)
    handle = kernel.create_session()
    while True:
        try:
            draft = Draft(actor="user:test")
            draft.create_task("node", tree)
            handle.commit(draft)
            break
        except Crash:
            if storage.session(handle.id).head_seq:
                break
            handle = kernel.open(handle.id)
    for generation in range(60):
        kernel = Kernel(storage, node_registry(faults, Effects()), clock)
        try:
            Scheduler(kernel, f"worker-{generation}", LEASE).run_until_idle(advance_clock=True)
            waiting = [
                t
                for t in storage.session_tasks(handle.id)
                if t.status is Status.WAITING and t.wait and "signal" in t.wait
            ]
            if not waiting:
                break
            for task in waiting:
                draft = Draft(actor="user:operator")
                if specs[task.input["name"]]["signal"] == "cancel":
                    draft.cancel(task.id, "operator said so")
                else:
                    draft.signal(task.id, "go", {"by": "operator"})
                kernel.open(handle.id).commit(draft)
        except Crash:
            continue
    else:
        raise AssertionError("the tree never became idle")
    tasks = storage.session_tasks(handle.id)
    assert all(t.terminal for t in tasks), [(t.input["name"], t.status) for t in tasks]
    final = Kernel(storage, registry, clock)
    commits = final.commits_after(handle.id, 0, 100_000)
    return Result(
        outcomes={t.input["name"]: t.outcome["kind"] for t in tasks},
        logs=final.document(handle.id, "log", "tree"),
        seqs=[c.seq for c in commits],
        head=storage.session(handle.id).head_seq,
        crashes=faults.crashes,
    )


def compare_runs(
    tree: dict[str, Any],
    crash_at: set[int],
    make_storage: Callable[[FaultHook], Storage] = InMemoryStorage,
) -> tuple[Result, Result]:
    """Run ``tree`` without and with crashes and check the property; return both runs."""
    reference = drive(tree, set(), make_storage)
    crashed = drive(tree, crash_at, make_storage)
    assert crashed.outcomes == reference.outcomes
    assert_logged_once(crashed, reference)
    assert crashed.seqs == list(range(1, crashed.head + 1))
    assert reference.seqs == list(range(1, reference.head + 1))
    return reference, crashed


PHASES = ["begin", "ask", "answered", "fan", "finish"]


def assert_logged_once(crashed: Result, reference: Result) -> None:
    """Every committed effect landed once. A task cancelled by a fail_fast sibling may
    have got further in one run than the other (work is reordered by crashes), but
    only along its phases, in order, each once."""
    for name, outcome in reference.outcomes.items():
        got = crashed.logs.get(name, [])
        if outcome != "cancelled":
            assert got == reference.logs.get(name, []), name
            continue
        assert got[-1:] == ["cancelled"], (name, got)
        progress = got[:-1]
        assert progress == [p for p in PHASES if p in progress], (name, got)
