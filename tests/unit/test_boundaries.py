"""The kernel's boundaries.

It is framework-free (importing it loads neither Django nor Celery), and its modules
form layers: the import graph of ``kernel/`` (``kernel/agent`` included) has no cycle,
counting imports under ``if TYPE_CHECKING:`` and inside functions too. A type-only or
deferred import still ties the two modules together; it only hides the circle from
the interpreter.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.unit.source_imports import ROOT, module_name
from tests.unit.source_imports import imported as imported_in

KERNEL = ROOT / "kernel"
FRAMEWORK_IMPORTS = ("import django", "from django", "import celery", "from celery")


def test_importing_the_kernel_imports_neither_django_nor_celery() -> None:
    probe = (
        "import sys, kernel, kernel.memory, kernel.scheduler, kernel.worker, kernel.agent\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('django', 'celery', 'kombu'))\n"
        "print(','.join(bad))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == ""


def test_no_kernel_module_mentions_a_framework_import() -> None:
    offenders = [
        str(path.relative_to(ROOT))
        for path in sorted(KERNEL.rglob("*.py"))
        for line in path.read_text().splitlines()
        if line.lstrip().startswith(FRAMEWORK_IMPORTS)
    ]
    assert offenders == []


def test_only_the_pydantic_ai_host_imports_pydantic_ai() -> None:
    """Pydantic AI is an optional dependency of the kernel: its host alone imports it,
    and importing the rest of the kernel does not load it."""
    host = KERNEL / "hosts" / "pydantic_ai"
    offenders = [
        str(path.relative_to(ROOT))
        for path in sorted(KERNEL.rglob("*.py"))
        if host not in path.parents
        for line in path.read_text().splitlines()
        if line.lstrip().startswith(("import pydantic_ai", "from pydantic_ai"))
    ]
    assert offenders == []
    probe = (
        "import sys, kernel, kernel.worker, kernel.agent, kernel.hosts\n"
        "print(','.join(sorted(m for m in sys.modules if m.startswith('pydantic_ai'))))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == ""


def test_only_the_langgraph_host_imports_langgraph() -> None:
    """LangGraph is imported by its host alone (nothing else in the kernel or the
    control plane); reading a thread (its layout, an interrupt) loads none of it, so a
    process that only shows threads never does."""
    host = KERNEL / "hosts" / "langgraph"
    offenders = [
        str(path.relative_to(ROOT))
        for tree in (KERNEL, ROOT / "controlplane")
        for path in sorted(tree.rglob("*.py"))
        if host not in path.parents
        for line in path.read_text().splitlines()
        if line.lstrip().startswith(("import langgraph", "from langgraph"))
    ]
    assert offenders == []
    probe = (
        "import sys, kernel, kernel.worker, kernel.agent, kernel.hosts\n"
        "import kernel.hosts.langgraph.layout, kernel.hosts.langgraph.interrupts\n"
        "print(','.join(sorted(m for m in sys.modules if m.startswith('langgraph'))))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == ""


# -- the import graph ------------------------------------------------------------


def kernel_modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(KERNEL.rglob("*.py"))}


def imported(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The kernel modules ``name`` imports anywhere in its file (any block, any function)."""
    found = imported_in(path.read_text(), name, path.name == "__init__.py", str(path))
    return {target for _, target in found if target in modules and target != name}


def import_graph() -> dict[str, set[str]]:
    modules = kernel_modules()
    return {name: imported(name, path, modules) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a closed path (first node repeated at the end), or None."""
    done: set[str] = set()
    stack: list[str] = []
    on_stack: set[str] = set()

    def visit(node: str) -> list[str] | None:
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target in on_stack:
                return stack[stack.index(target) :] + [target]
            if target not in done:
                cycle = visit(target)
                if cycle:
                    return cycle
        stack.pop()
        on_stack.discard(node)
        done.add(node)
        return None

    for start in sorted(graph):
        if start not in done:
            cycle = visit(start)
            if cycle:
                return cycle
    return None


def test_the_graph_sees_every_kind_of_import() -> None:
    graph = import_graph()
    assert "kernel.agent.turn" in graph  # kernel/agent is covered
    assert "kernel.records" in graph["kernel.agent.context"]  # absolute import
    assert "kernel.records" in graph["kernel.tasks"]  # relative import
    assert "kernel.agent.models" in graph["kernel.agent"]  # a package's own import
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_a_type_only_or_deferred_import_is_an_edge(tmp_path: Path) -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from .b import B\n"
        "def f():\n"
        "    from kernel import c\n"
        "    import kernel.d\n"
    )
    modules = {name: Path() for name in ("kernel.a", "kernel.b", "kernel.c", "kernel.d")}
    path = tmp_path / "a.py"
    path.write_text(source)
    assert imported("kernel.a", path, modules) == {"kernel.b", "kernel.c", "kernel.d"}


def test_kernel_modules_import_each_other_without_a_cycle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle in kernel/: " + " -> ".join(cycle or [])
