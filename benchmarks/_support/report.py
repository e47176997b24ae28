"""What a run tells: a line per stage on stderr, and its section of ``docs/benchmarks.md``.

The report file holds every benchmark's section; a run replaces only its own, so the
other benchmarks' figures stay as their last runs left them. Within its own, a run
replaces only the printout: what a section holds from a line :data:`EARLIER_RUNS` on (the earlier
runs, written by hand) stays under the new printout.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
REPORT = ROOT / "docs" / "benchmarks.md"

_started = time.monotonic()

EARLIER_RUNS = "<!-- earlier runs: make bench keeps what follows -->"
"""The line of a section from which a run keeps what is there."""


def progress(message: str) -> None:
    """One line per stage on stderr, so a long run shows where it is."""
    print(f"[bench {time.monotonic() - _started:6.1f}s] {message}", file=sys.stderr, flush=True)


def replace_section(text: str, heading: str, section: str) -> str:
    """``text`` with the section under ``heading`` replaced by ``section`` (or appended).

    A section runs from its ``## `` heading to the next ``## `` heading, so other
    benchmarks' sections in the same file are left as they are; a :data:`EARLIER_RUNS` line in
    it ends what is replaced, and it and what follows it stay.
    """
    body = section.rstrip("\n") + "\n"
    ends = rf"^## |^{re.escape(EARLIER_RUNS)}[ \t]*$|\Z"
    pattern = re.compile(rf"^{re.escape(heading)}[ \t]*\n.*?(?={ends})", re.M | re.S)
    match = pattern.search(text)
    if match is None:
        base = text.rstrip("\n")
        return (base + "\n\n" if base else "") + body
    tail = text[match.end() :]
    return text[: match.start()] + body + ("\n" if tail else "") + tail


def publish(heading: str, section: str, *, write: bool) -> int:
    """Print a benchmark's section and, unless told not to, put it in the report."""
    if write:
        write_section(heading, section)
        progress(f"wrote {REPORT.relative_to(REPORT.parent.parent)}")
    print(section)
    return 0


def write_section(heading: str, section: str, path: Path = REPORT) -> None:
    """Write ``section`` into the report file, replacing only its own previous version."""
    text = path.read_text() if path.exists() else "# Benchmarks\n\nWritten by `make bench`.\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(replace_section(text, heading, section))
