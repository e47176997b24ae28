"""The product never imports its development tooling (``controlplane.dev``).

``controlplane/dev/`` holds the stand-ins (local email provider, SMTP stand-in), the
embedded services and the process launcher of the tests and benchmarks. A deployment
runs everything else under ``controlplane/``, so no module there may import it, not
even lazily inside a function: every import statement of the file is looked at.

No exception is needed: ``manage.py demo`` (``controlplane/management/commands/demo.py``)
creates accounts and commits a batch; the demo's provider is started by honcho from
the ``Procfile`` as a script, never imported.
"""

from __future__ import annotations

from pathlib import Path

from tests.unit.source_imports import ROOT, imported, module_name

PRODUCT = ROOT / "controlplane"
DEV = PRODUCT / "dev"
DEV_MODULE = "controlplane.dev"


def imported_modules(path: Path, text: str | None = None) -> list[str]:
    """Every module an import statement of ``path`` (or of ``text`` as if it were at
    ``path``) names, relative ones resolved (``from controlplane import dev`` names the
    package through an alias)."""
    source = path.read_text() if text is None else text
    found = imported(source, module_name(path), path.name == "__init__.py", str(path))
    return [module for _, module in found]


def is_dev(module: str) -> bool:
    return module == DEV_MODULE or module.startswith(DEV_MODULE + ".")


def product_modules() -> list[Path]:
    return sorted(p for p in PRODUCT.rglob("*.py") if DEV not in p.parents)


def test_no_product_module_imports_the_dev_package() -> None:
    offenders = {
        str(path.relative_to(ROOT)): [m for m in imported_modules(path) if is_dev(m)]
        for path in product_modules()
    }
    assert {path: found for path, found in offenders.items() if found} == {}


def test_the_check_sees_every_kind_of_import() -> None:
    """Absolute, relative, aliased and function-local imports are all caught, so the
    check above cannot pass by seeing nothing."""
    probe = (
        "import controlplane.dev.ports\n"
        "from controlplane.dev import processes\n"
        "from controlplane import dev\n"
        "from ..dev.services import main\n"
        "def later():\n"
        "    from ..dev import smtp_server\n"
    )
    found = imported_modules(PRODUCT / "notices" / "probe.py", probe)
    assert [m for m in found if is_dev(m)] == [
        "controlplane.dev.ports",
        "controlplane.dev",
        "controlplane.dev.processes",
        "controlplane.dev",
        "controlplane.dev.services",
        "controlplane.dev.services.main",
        "controlplane.dev",
        "controlplane.dev.smtp_server",
    ]
    lookalike = imported_modules(PRODUCT / "x.py", "import controlplane.devices")
    assert not any(is_dev(m) for m in lookalike)
    assert len(product_modules()) > 20
