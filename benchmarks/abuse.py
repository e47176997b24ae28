"""Abuse benchmark (issue 15): another viewer's page latency while one viewer is past its caps.

The scenario is the e2e test ``tests/e2e/test_abuse.py`` (two Daphne processes, one
viewer holding its socket and long-poll limits and asking for more from a process of
its own, another viewer's session page followed over 120 commits). The suite runs it
with a loose latency bound, since a timed assertion on a shared machine is noise; this
module runs the same test with the issue's target (p99 under 250 ms, from a commit's
return to the frame showing it) and publishes what it printed. Run it with
``python -m benchmarks.abuse`` (``make bench BENCH_ARGS=abuse``).

Then an operator's live tasks page on 300,000 tasks, quiet and while a viewer does its
worst, in the same run (``benchmarks/_abuse_pages.py``; target: the abused p99 at most
twice the quiet one). ``--pages-only`` runs that part alone, ``--no-pages`` skips it.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from benchmarks._abuse_pages import SERVER_BURST, WARMUP_COMMITS
from benchmarks._support import database_url, fresh_database, parse_arguments, progress, publish

if TYPE_CHECKING:
    from benchmarks._abuse_pages import Phase

HEADING = "## Abuse: another viewer's page while one is past its caps (issue 15)"
TARGET_MS = 250
PAGES_HEADING = "## Abuse: an operator's live tasks page while a viewer does its worst (issue 26)"
PAGES_DATABASE = "durable_bench_abuse"
ONLY = {"sockets": " (in this run the sockets only: `--viewer-does sockets`)",
        "requests": " (in this run the searches only: `--viewer-does requests`)"}
FIGURES = re.compile(
    r"other viewer's page: (?P<n>\d+) commits, p50 (?P<p50>[\d.]+) ms, p99 (?P<p99>[\d.]+) "
    r"ms, max (?P<max>[\d.]+) ms; abuser refused (?P<sockets>\d+) sockets and "
    r"(?P<polls>\d+) long-polls"
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="how many times to run it")
    parser.add_argument("--pages-only", action="store_true", help="only the operator's page part")
    parser.add_argument("--no-pages", action="store_true", help="skip the operator's page part")
    parser.add_argument("--tasks", type=int, default=300_000)
    parser.add_argument("--commits", type=int, default=100,
                        help="commits followed per phase and round")
    parser.add_argument("--rounds", type=int, default=4,
                        help="rounds of both phases, in alternating order, pooled")
    parser.add_argument("--interval", type=float, default=0.25)
    parser.add_argument("--viewer-does", choices=["both", "sockets", "requests"],
                        default="both", help="what the viewer does (the sockets, the "
                        "searches or both): to see which costs the operator what")
    parser.add_argument("--server-share", type=float, default=0.5,
                        help="USER_SERVER_SECONDS_PER_SECOND of the server (0: its budget of "
                        "server time off, to see what the budget buys)")
    parser.add_argument("--server-burst", type=float, default=SERVER_BURST,
                        help="USER_SERVER_SECONDS_BURST of the server: the server time an "
                        "account may take at once, before the per-second share paces it")
    args, _ = parse_arguments(parser, argv, PAGES_DATABASE)  # --database, --no-write
    failed = 0 if args.pages_only else caps(args)
    if not args.no_pages:
        failed |= pages(args)
    return failed


def pages(args: argparse.Namespace) -> int:
    from benchmarks._abuse_pages import run
    from controlplane.dev.ports import reserved_redis_url

    url = database_url(args.database)
    before = os.getloadavg()
    with reserved_redis_url() as redis_url:
        os.environ["REDIS_URL"] = redis_url
        fresh_database(args, url, redis_url)
        quiet, abused = run(url, redis_url, args.tasks, args.commits, args.interval,
                            args.viewer_does, args.server_share,
                            server_burst=args.server_burst, rounds=args.rounds)
    after = os.getloadavg()
    section, met = render_pages(args, quiet, abused, before, after)
    publish(PAGES_HEADING, section, write=not args.no_write)
    return 0 if met else 1


def rounds_text(rounds: int) -> str:
    if rounds <= 1:
        return "the quiet phase first, then the abused one."
    return (f"{rounds} rounds of both phases, quiet first in odd rounds and abused first in "
            f"even ones, 2 s apart, each phase's samples pooled over the rounds.")


def budget(share: float, burst: float) -> str:
    if share <= 0:
        return "**no** budget of server time (`--server-share 0`)"
    return f"budget of server time ({share:g} s a second, {burst:g} s at once)"


def render_pages(args: argparse.Namespace, quiet: Phase, abused: Phase,
                 before: tuple[float, float, float], after: tuple[float, float, float],
                 ) -> tuple[str, bool]:
    """The operator's page part's report section, and whether the target was met."""
    ratio = abused.samples.p99 / quiet.samples.p99
    lines = [
        PAGES_HEADING, "",
        f"Run {datetime.now(UTC):%Y-%m-%d %H:%M} UTC by `make bench BENCH_ARGS=abuse` "
        f"(`benchmarks/_abuse_pages.py`): {args.tasks:,} tasks copied in, one Daphne with "
        f"production settings, the per-account request rate (10/s, bursts of 50) and "
        f"{budget(args.server_share, args.server_burst)} on. After {WARMUP_COMMITS} "
        f"commits not counted, an "
        f"operator follows `/ws/ui/tasks/` while {args.commits} commits are made "
        f"{args.interval * 1000:.0f} ms apart, alone, and while one viewer holds 20 "
        f"tasks-page sockets with filters of their own (a 3-letter word, a sort, "
        f"`page=100000`) and asks `/tasks/?q=re&sort=kind&page=100000` and a 3-letter "
        f"search with a sort and a deep page from two threads as fast as it is answered"
        f"{ONLY.get(args.viewer_does, '')}, its budgets full at the start, from a process "
        f"of its own; "
        f"{rounds_text(args.rounds)} "
        f"Latency: a commit's return to the operator's frame showing it. The machine is "
        f"shared with other engineers' work: load average (1, 5, 15 min) before "
        f"{before[0]:.2f} {before[1]:.2f} {before[2]:.2f}, after {after[0]:.2f} "
        f"{after[1]:.2f} {after[2]:.2f}; the ratio, from one run on the same server, is the "
        f"figure to read.", "",
        "| phase | commits | missing | p50 ms | p90 ms | p99 ms | max ms | viewer's page "
        "requests (429) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for found in (quiet, abused):
        s = found.samples
        lines.append(f"| {found.name} | {s.count} | {found.missing} | {s.p50:.0f} | "
                     f"{s.p90:.0f} | {s.p99:.0f} | {s.max:.0f} | "
                     f"{found.requests} ({found.refused}) |" if found.requests else
                     f"| {found.name} | {s.count} | {found.missing} | {s.p50:.0f} | "
                     f"{s.p90:.0f} | {s.p99:.0f} | {s.max:.0f} | - |")
    met = ratio <= 2 and abused.missing == 0
    if len(quiet.rounds) > 1:
        lines += ["", "Each round's p99 (ms), quiet / abused: " + ", ".join(
            f"{q.p99:.0f} / {a.p99:.0f}" for q, a in zip(quiet.rounds, abused.rounds,
                                                         strict=True)) + "."]
    lines += ["", f"Abused p99 / quiet p99: **{ratio:.2f}x** (target at most 2x: "
              f"{'met' if met else '**not met**'})."]
    return "\n".join(lines) + "\n", met


def caps(args: argparse.Namespace) -> int:
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
