"""The benchmarks' layout (benchmarks/README.md), checked from the source.

- A benchmark never imports another benchmark: what more than one of them uses lives in
  the support package, ``benchmarks._support``, and they import it from there, never
  from one of its parts (``benchmarks._support.noop``): the package is the one import
  point.
- A private part of one benchmark, ``benchmarks._<owner>_<noun>``, is imported by that
  benchmark alone, and itself imports only the support package.
- The support package's parts import one another and nothing else of ``benchmarks``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.source_imports import imported, module_name

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
SUPPORT = "benchmarks._support"
SUPPORT_PARTS = {p.stem for p in (BENCHMARKS / "_support").glob("*.py")} - {"__init__"}


def owner(private: str) -> str:
    """The benchmark a private part belongs to: ``benchmarks._abuse_pages`` -> ``abuse``."""
    return private.removeprefix("benchmarks._").split("_")[0]


def allowed(importer: str, imported: str) -> bool:
    """Whether module ``importer`` (under ``benchmarks``) may import ``imported``."""
    if not imported.startswith("benchmarks."):
        return True  # the project, the standard library, ``import benchmarks`` itself
    top = imported.split(".")[1]
    if importer == SUPPORT or importer.startswith(f"{SUPPORT}."):
        return top == "_support"  # its own parts, never a benchmark
    if top == "_support":
        rest = imported.split(".")[2:]
        return not rest or rest[0] not in SUPPORT_PARTS  # the package, not its parts
    if top.startswith("_"):
        return importer == f"benchmarks.{owner(imported)}"
    return False  # another benchmark


def offences() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted(BENCHMARKS.rglob("*.py")):
        name = module_name(path)
        wrong = sorted(m for _, m in imported(path.read_text(), name, path.name == "__init__.py")
                       if not allowed(name, m))
        if wrong:
            found[path.relative_to(ROOT).as_posix()] = wrong
    return found


def test_no_benchmark_imports_another() -> None:
    assert len(list(BENCHMARKS.rglob("*.py"))) > 10
    assert offences() == {}


def test_the_check_sees_what_it_looks_for() -> None:
    """The rules refuse what they must (a check that finds nothing proves nothing)."""

    def refused(importer: str, source: str) -> list[str]:
        return sorted(m for _, m in imported(source, importer) if not allowed(importer, m))

    assert "noop" in SUPPORT_PARTS
    assert refused("benchmarks.scaling", "def f():\n    from benchmarks.fanout import Driver\n")
    assert refused("benchmarks.history", "from benchmarks import ui\n")
    assert refused("benchmarks.broker", "from .fanout import TASK_MODULE\n")
    assert refused("benchmarks.fanout", "from benchmarks._support.noop import KIND\n")
    assert refused("benchmarks.ui", "from benchmarks._abuse_pages import run\n")
    assert refused("benchmarks._abuse_pages", "from benchmarks.feed import commit_one\n")
    assert refused("benchmarks._batch_system", "from benchmarks._abuse_pages import run\n")
    assert refused("benchmarks._support.noop", "from benchmarks.batch import Cluster\n")
    assert not refused("benchmarks.abuse", "from benchmarks._abuse_pages import run\n")
    assert not refused("benchmarks.fanout", "from benchmarks._support import KIND, Driver\n")
    assert not refused("benchmarks.ui", "from . import _support\n")
    assert not refused("benchmarks._support.noop", "from benchmarks._support.workers import "
                                                   "Cluster\n")
    assert not refused("benchmarks.__main__", "import benchmarks\n")


def test_the_runner_says_how_to_use_it(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks.__main__ import main

    assert main(["--help"]) == 0
    shown = capsys.readouterr().out
    assert "python -m benchmarks commit -- --count 500" in shown and "fanout" in shown
    assert main(["no-such-benchmark"]) == 2
