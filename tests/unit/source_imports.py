"""What a Python file imports, read from its source: the one reader that the layout
tests (layers, the kernel's boundaries, the dev package, benchmarks, tests) share.

Every import statement counts, wherever it is (a function, an ``if TYPE_CHECKING:``
block), relative ones resolved; ``from package import name`` gives ``package.name``
as well, since the name may be a module.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def module_name(path: Path) -> str:
    """``kernel/agent/__init__.py`` is ``kernel.agent``; ``kernel/worker.py``,
    ``kernel.worker``."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(source: str, name: str, is_package: bool = False,
             filename: str = "<source>") -> list[tuple[int, str]]:
    """(line, module) for each module the source of module ``name`` imports."""
    package = name.split(".") if is_package else name.split(".")[:-1]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found.append((node.lineno, module))
            found.extend((node.lineno, f"{module}.{alias.name}") for alias in node.names)
    return found


def imports(path: Path, text: str | None = None) -> set[str]:
    """Every module the file at ``path`` (or ``text`` as if it were there) imports."""
    source = path.read_text() if text is None else text
    return {module for _, module in imported(source, module_name(path),
                                             path.name == "__init__.py", str(path))}
