"""The kernel is framework-free: importing it must load neither Django nor Celery."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FRAMEWORK_IMPORTS = ("import django", "from django", "import celery", "from celery")


def test_importing_the_kernel_imports_neither_django_nor_celery() -> None:
    probe = (
        "import sys, kernel, kernel.memory, kernel.scheduler, kernel.worker\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('django', 'celery', 'kombu'))\n"
        "print(','.join(bad))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == ""


def test_no_kernel_module_mentions_a_framework_import() -> None:
    offenders = [
        path.name
        for path in (ROOT / "kernel").glob("*.py")
        for line in path.read_text().splitlines()
        if line.lstrip().startswith(FRAMEWORK_IMPORTS)
    ]
    assert offenders == []
