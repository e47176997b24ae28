"""Tests share fixtures and helpers through ``conftest.py`` files and helper modules, never
through each other: no module under ``tests/`` imports a ``test_*`` module of this
repository, absolutely or relatively.

Importing a test module puts its tests and fixtures into the importer's namespace (pytest
collects an imported test function a second time there, and sees an imported fixture in
two places), and ties the helpers to whichever tests happen to sit beside them. Other
projects' test utilities (``langgraph.checkpoint.conformance.test_utils``) are not ours
and may be imported.
"""

from __future__ import annotations

from pathlib import Path

from tests.unit.source_imports import ROOT, imported, module_name

TESTS = ROOT / "tests"


def imported_modules(source: str, path: Path) -> list[tuple[int, str]]:
    """(line, module) for each module that ``source``, sitting at ``path``, imports."""
    return imported(source, module_name(path), path.name == "__init__.py", str(path))


def is_a_test_module_of_ours(module: str) -> bool:
    parts = module.split(".")
    return parts[0] == "tests" and any(part.startswith("test_") for part in parts[1:])


def test_no_module_under_tests_imports_a_test_module() -> None:
    offences: dict[str, str] = {}  # one line per import statement, naming the module
    for path in sorted(TESTS.rglob("*.py")):
        for line, module in imported_modules(path.read_text(), path):
            if is_a_test_module_of_ours(module):
                offences.setdefault(f"{path.relative_to(ROOT).as_posix()}:{line}", module)
    assert not offences, "tests import test modules:\n" + "\n".join(
        f"{where} imports {module}" for where, module in offences.items())


def test_the_check_sees_relative_absolute_and_function_local_imports() -> None:
    source = ("from .test_api import post\n"
              "from . import test_feed_api\n"
              "from ..unit.test_agent import World\n"
              "import tests.chaos.test_beat\n"
              "def later():\n"
              "    from tests.e2e.test_proxy import PROXY\n"
              "from .api_client import post as also\n"
              "from tests import databases\n"
              "from langgraph.checkpoint.conformance.test_utils import generate_metadata\n")
    modules = imported_modules(source, TESTS / "integration" / "probe.py")
    assert sorted({m for _, m in modules if is_a_test_module_of_ours(m)}) == [
        "tests.chaos.test_beat", "tests.e2e.test_proxy", "tests.e2e.test_proxy.PROXY",
        "tests.integration.test_api", "tests.integration.test_api.post",
        "tests.integration.test_feed_api", "tests.unit.test_agent",
        "tests.unit.test_agent.World"]
