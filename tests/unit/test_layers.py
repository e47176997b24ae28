"""The control plane's layers and folders (docs/architecture.md), checked from the source.

- The folders say what runs each part: the root holds only what Django and Celery find
  by name and the two layers (commands, reads) with their errors and access rule; every
  package says its role in a docstring.
- The pages and the sockets are edges beside the API, never on top of it: nothing under
  ``controlplane/ui`` or ``controlplane/sockets`` imports ``controlplane.api``.
- The read layer is generic: it imports no reference app, no worker runtime, no Celery
  app, no edge and no command.
- The reference apps are applications of the platform: nothing outside them (and the
  development tooling) imports them; the settings name their registry.
- Outside ``storage/``, the storage is used through its package's names; only the read
  layer reaches past them, to the row mapping and the search. Outside ``commands/``, the
  commands are used through their package's names.
- Only the read layer and the storage touch the kernel's tables: SQL naming a
  ``kernel_*`` table, or an ORM query on a model of one, appears nowhere else in the
  product (the admin's read-only registrations aside).
- Commands and reads are framework-neutral about the web: they import no HTTP or
  django-ninja types, so every edge translates their errors itself.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.unit.source_imports import imports

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = [p for p in (ROOT / "controlplane").rglob("*.py") if "migrations" not in p.parts]
KERNEL_MODELS = {"Session", "Conversation", "Entry", "Document", "DocumentVersion", "Task",
                 "Submission", "Commit", "Dispatch"}
SQL_ON_KERNEL = re.compile(r"\b(from|join|into|update|table)\s+kernel_\w+", re.IGNORECASE)


def relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def in_layer(path: Path, *layers: str) -> bool:
    name = relative(path)
    return any(name == layer or name.startswith(f"{layer}/") for layer in layers)


ROOT_MODULES = {
    # what Django and Celery find by name
    "__init__", "settings", "urls", "asgi", "wsgi", "celery", "apps", "models", "admin",
    # the layers' errors and who may call them; the models' catalogue
    "errors", "access", "model_catalog",
}
PACKAGES = {"api", "ui", "web", "sockets", "worker", "process", "commands", "reads", "storage",
            "reference", "dev", "migrations", "management", "templatetags"}


def test_the_root_holds_only_what_is_found_by_name_and_the_layers() -> None:
    root = ROOT / "controlplane"
    modules = {p.stem for p in root.glob("*.py")}
    packages = {p.name for p in root.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert (modules, packages) == (ROOT_MODULES, PACKAGES)


def test_every_package_says_its_role() -> None:
    undocumented = [relative(p) for p in PRODUCT if p.name == "__init__.py"
                    and not ast.get_docstring(ast.parse(p.read_text()))]
    assert undocumented == []


def test_the_reads_are_generic() -> None:
    reads = [p for p in PRODUCT if in_layer(p, "controlplane/reads")]
    assert len(reads) > 10
    banned = ("controlplane.reference", "controlplane.worker", "controlplane.celery",
              "controlplane.sockets", "controlplane.web", "controlplane.api", "controlplane.ui",
              "controlplane.commands")
    offenders = {relative(p): sorted(m for m in imports(p) if m.startswith(banned))
                 for p in reads}
    assert {p: m for p, m in offenders.items() if m} == {}


def test_only_the_reference_apps_know_the_reference_apps() -> None:
    outside = [p for p in PRODUCT if not in_layer(p, "controlplane/reference", "controlplane/dev")]
    offenders = {relative(p): sorted(m for m in imports(p)
                                     if m.startswith("controlplane.reference"))
                 for p in outside}
    assert {p: m for p, m in offenders.items() if m} == {}


def test_the_storage_is_used_through_its_package() -> None:
    import controlplane.storage as storage

    public = {f"controlplane.storage.{name}" for name in storage.__all__}
    for_reads = {"controlplane.storage.schema", "controlplane.storage.search"}
    offenders = {}
    for path in PRODUCT:
        if in_layer(path, "controlplane/storage"):
            continue
        allowed = public | (for_reads if in_layer(path, "controlplane/reads") else set())
        reached = {m for m in imports(path) if m.startswith("controlplane.storage.")}
        # ``from controlplane.storage.schema import X`` also lists ``...schema.X``
        modules = {m for m in reached if not any(m.startswith(f"{a}.") for a in allowed)}
        if modules - allowed:
            offenders[relative(path)] = sorted(modules - allowed)
    assert offenders == {}


def test_the_commands_are_used_through_their_package() -> None:
    import controlplane.commands as commands

    public = {f"controlplane.commands.{name}" for name in commands.__all__}
    offenders = {relative(p): sorted(m for m in imports(p)
                                     if m.startswith("controlplane.commands.") and m not in public)
                 for p in PRODUCT if not in_layer(p, "controlplane/commands")}
    assert {p: m for p, m in offenders.items() if m} == {}
    assert "controlplane.commands.fork_graph" in public


def test_pages_and_sockets_do_not_import_the_api() -> None:
    edges = [p for p in PRODUCT if in_layer(p, "controlplane/ui", "controlplane/sockets")]
    assert len(edges) > 10
    offenders = {relative(p): sorted(m for m in imports(p) if m.startswith("controlplane.api"))
                 for p in edges}
    assert {p: m for p, m in offenders.items() if m} == {}


def test_only_the_read_layer_and_storage_query_the_kernel_tables() -> None:
    allowed = ("controlplane/reads", "controlplane/storage")
    sql, orm = [], []
    for path in PRODUCT + list((ROOT / "kernel").rglob("*.py")):
        if in_layer(path, *allowed):
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and SQL_ON_KERNEL.search(node.value):
                sql.append(f"{relative(path)}:{node.lineno}")
            if isinstance(node, ast.Attribute) and node.attr == "objects" \
                    and isinstance(node.value, ast.Attribute) \
                    and node.value.attr in KERNEL_MODELS and relative(path) != \
                    "controlplane/admin.py":
                orm.append(f"{relative(path)}:{node.lineno}")
    assert (sql, orm) == ([], [])


def test_commands_and_reads_use_no_web_types() -> None:
    layers = [p for p in PRODUCT if in_layer(p, "controlplane/reads", "controlplane/commands",
                                             "controlplane/errors.py", "controlplane/access.py")]
    assert len(layers) > 5
    web = ("ninja", "django.http", "django.shortcuts", "controlplane.api", "controlplane.ui")
    offenders = {relative(p): sorted(m for m in imports(p) if m.startswith(web))
                 for p in layers}
    assert {p: m for p, m in offenders.items() if m} == {}


def test_the_checks_see_what_they_look_for() -> None:
    """The patterns match what they must (a check that finds nothing proves nothing)."""
    assert SQL_ON_KERNEL.search("SELECT 1 FROM kernel_task WHERE id = %s")
    assert SQL_ON_KERNEL.search("UPDATE kernel_session SET head_seq = 1")
    assert not SQL_ON_KERNEL.search('db_table = "kernel_task"')
    assert "controlplane.api.tasks" in imports(ROOT / "controlplane/api/__init__.py")
    assert "controlplane.ui.access.may_act" in imports(ROOT / "controlplane/ui/sessions.py")
    assert "controlplane.storage.schema.SESSION" in imports(ROOT / "controlplane/reads/pages.py")
