"""Abuse benchmark (issue 15): another viewer's page latency while one viewer is past its caps.

The scenario is the e2e test ``tests/e2e/test_abuse.py`` (two Daphne processes, one
viewer holding its socket and long-poll limits and asking for more from a process of
its own, another viewer's session page followed over 120 commits). The suite runs it
with a loose latency bound, since a timed assertion on a shared machine is noise; this
module runs the same test with the issue's target (p99 under 250 ms, from a commit's
return to the frame showing it) and publishes what it printed. Run it with
``python -m benchmarks.abuse`` (``make bench BENCH_ARGS=abuse``).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from datetime import UTC, datetime

from benchmarks._support import REPORT, progress, publish

HEADING = "## Abuse: another viewer's page while one is past its caps (issue 15)"
TARGET_MS = 250
FIGURES = re.compile(
    r"other viewer's page: (?P<n>\d+) commits, p50 (?P<p50>[\d.]+) ms, p99 (?P<p99>[\d.]+) "
    r"ms, max (?P<max>[\d.]+) ms; abuser refused (?P<sockets>\d+) sockets and "
    r"(?P<polls>\d+) long-polls"
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="how many times to run it")
    parser.add_argument("--no-write", action="store_true", help=f"do not update {REPORT.name}")
    args = parser.parse_args(argv)
    rows, failures = [], 0
    before = os.getloadavg()
    for run in range(1, args.runs + 1):
        progress(f"run {run}/{args.runs}")
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
             "tests/e2e/test_abuse.py"],
            env={**os.environ, "ABUSE_P99_LIMIT": str(TARGET_MS / 1000)},
            capture_output=True, text=True, check=False,
        )
        found = FIGURES.search(done.stdout)
        if found is None:
            print(done.stdout[-3000:], done.stderr[-3000:], file=sys.stderr)
            return 1
        failures += done.returncode != 0
        rows.append((run, found, "met" if float(found["p99"]) < TARGET_MS else "**not met**"))
    after = os.getloadavg()
    lines = [
        HEADING, "",
        f"Run {datetime.now(UTC):%Y-%m-%d %H:%M} UTC by `make bench BENCH_ARGS=abuse` "
        f"(`python -m benchmarks.abuse`): `tests/e2e/test_abuse.py` with "
        f"`ABUSE_P99_LIMIT={TARGET_MS / 1000}`, {args.runs} runs. Load average (1, 5, 15 min) "
        f"before {before[0]:.2f} {before[1]:.2f} {before[2]:.2f}, after {after[0]:.2f} "
        f"{after[1]:.2f} {after[2]:.2f}: other work on the machine lengthens the tail.", "",
        "| run | commits | p50 ms | p99 ms | max ms | sockets refused (4429) | "
        "long-polls refused (429) | p99 < 250 ms |",
        "|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    lines += [
        f"| {run} | {f['n']} | {f['p50']} | {f['p99']} | {f['max']} | {f['sockets']} | "
        f"{f['polls']} | {verdict} |"
        for run, f, verdict in rows
    ]
    lines += ["", "Latency is from a commit's return to the frame showing it on the other "
              "viewer's session page (one Daphne of two; the abuser's sockets and long-polls "
              "are spread over both)."]
    publish(HEADING, "\n".join(lines) + "\n", write=not args.no_write)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
