"""Product code carries no history: no issue references, no measurements.

Why a line of ``kernel/`` or ``controlplane/`` is the way it is belongs in the code; when
it changed, which issue asked for it, and what it measured belong in commit messages and
in ``docs/benchmarks.md``. This scans every Python file of both packages (migrations
excepted: they are history by nature) for

- issue references: ``issue 12``, ``issues 3 and 4``, ``#123`` (a reference to another
  project's tracker, ``owner/repo#123``, names a dependency's bug and is allowed);
- measurements: a figure with a unit of time or a factor (``4.2 ms``, ``3x``, ``2.5
  times slower``) on the same line as a comparison (``against``, ``vs``, ``measured``,
  ``faster``, ``slower``, ``instead of``, ``from ... to``).

The patterns are checked against sample strings first, so the scan cannot pass because a
pattern matches nothing.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("kernel", "controlplane")

ISSUE = re.compile(r"\bissues? #?\d+|(?<![\w/.-])#\d{2,}\b", re.IGNORECASE)
FIGURE = re.compile(
    r"\d(?:[\d,]*\d)?(?:\.\d+)?\s?(?:ms|µs|us|ns|s|sec|seconds|milliseconds|x|×)(?!\w)"
    r"|\b(?:\d+(?:\.\d+)?|two|three|four|five|ten|\w+ty)\s+times\b",
    re.IGNORECASE,
)
COMPARISON = re.compile(
    r"\bagainst\b|\bvs\.?(?!\w)|\bversus\b|\bmeasured\b|\bfaster\b|\bslower\b"
    r"|\binstead of\b|\bfrom\b.+\bto\b|\bbenchmark",
    re.IGNORECASE,
)


def history(line: str) -> str | None:
    """What in ``line`` is history (an issue reference or a measurement), if anything."""
    found = ISSUE.search(line)
    if found:
        return f"issue reference {found.group(0)!r}"
    figure = FIGURE.search(line)
    if figure and COMPARISON.search(line):
        return f"measurement {figure.group(0)!r}"
    return None


@pytest.mark.parametrize("line", [
    "# see issue 42 for why",
    "the claim (issues 7 and 9) takes one statement",
    "fixed in #123",
    "# 4.2 ms against 9.8 ms before",
    "a commit takes 0.35ms vs 1.2ms",
    "measured: 3x the throughput",
    "made a 5,000-task burst's commit 2.5 times slower",
    "renders ~50 times slower than string joins",
    "it went from 12 s to 3 s",
])
def test_patterns_catch_history(line: str) -> None:
    assert history(line) is not None


@pytest.mark.parametrize("line", [
    "KERNEL_CLAIM_SECONDS = 5  # how long a burst claim runs",
    "refused with 409 (the task moved)",
    "checked against the schema the node declared",
    "fails for port 0 (aio-libs/aiosmtpd#388)",
    'return format(context.trace_id, "032x")',
    "a renewal every 5 s and the sweep recovers a dead worker's task 15 s after",
    "tissue 3",
])
def test_patterns_spare_the_present(line: str) -> None:
    assert history(line) is None


def sources() -> list[Path]:
    files = [
        path
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if "migrations" not in path.relative_to(ROOT).parts
    ]
    assert len(files) > 100, "the scan found too few files to mean anything"
    return files


def test_product_code_cites_no_history() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{number}: {what}: {line.strip()}"
        for path in sources()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if (what := history(line))
    ]
    assert not found, "history in product code (move it to a commit message or " \
        "docs/benchmarks.md, keep the why):\n" + "\n".join(found)
