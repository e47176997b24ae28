"""Every tracked text file is free of unresolved merge-conflict markers.

A merge resolved by hand once left a README with both sides and their markers; nothing
read the README, so it landed. Git's own markers at the start of a line are never
legitimate in this repository's text.
"""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^(<{7} |={7}$|>{7} )", re.MULTILINE)


def tracked_text_files() -> list[Path]:
    names = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True
    ).stdout.decode().split("\0")
    return [ROOT / name for name in names if name and (ROOT / name).is_file()]


def test_no_tracked_file_holds_a_merge_conflict_marker() -> None:
    found = []
    for path in tracked_text_files():
        data = path.read_bytes()
        if b"\0" in data:
            continue
        text = data.decode("utf-8", errors="replace")
        for match in MARKER.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append(f"{path.relative_to(ROOT)}:{line}")
    assert not found, "merge-conflict markers: " + ", ".join(found)
