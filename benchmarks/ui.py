"""Dashboard benchmark (issues 6 and 13): a session page with 10,000 tasks, and the
timeline of a task that went through 2,000 phases, and the tasks page over 100,000
tasks in 100 sessions.

- Server render time: ``GET /sessions/<id>/`` through Django's test client in this
  process (the view, its reads and the templates; no network), p50 over many runs.
- Browser time to interactive: the Debian chromium (Playwright) against a real Daphne
  process, from navigation start to ``domInteractive``, and to the page's socket being
  live (its first message applied), median over a few runs.

The session is seeded in SQL (one ``send-batch`` root with 9,999 ``send-notice``
children in mixed states): making them through the kernel would take minutes and
measure nothing here. The tree shows the root collapsed with its counts; children load
by page. The long task's commits are seeded the same way (each phase a commit that
enters it and one mid-phase, as a phase that commits progress makes), and its page is
measured like the session's. The tasks page's sessions, commits and tasks are
copied in the same way, with inputs of a few words each (the text search reads them).
The tasks page is measured on the path each kind of server takes for a word of the
input: with the trigram index where the server has ``pg_trgm``, then with that index
dropped and the expression statistics made instead, as migration 0006 does on a server
without ``pg_trgm`` (the embedded ``pgserver``; controlplane/storage/search.py). On a
server without ``pg_trgm`` only the second path exists.

Run with ``python -m benchmarks.ui`` (``make bench BENCH_ARGS=ui``; ``make bench
BENCH_ARGS='ui -- --only-tasks-page'`` for the tasks page alone); it writes the sections
"Dashboard (issue 6)" and "The tasks page ..." of ``docs/benchmarks.md`` (the second's
heading names the server's kind).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from benchmarks._support import (
    Stats,
    fresh_database,
    parse_arguments,
    progress,
    publish,
    seed_session,
    seed_tasks,
    server_facts,
)

HEADING = "## Dashboard (issue 6)"
TASKS_HEADING = "## The tasks page, with pg_trgm and on the embedded server's path (issue 29)"
EMBEDDED_HEADING = "## The tasks page on a server without pg_trgm (issue 29)"
TRIGRAM_PATH = "pg_trgm's index"
SCAN_PATH = "no index, expression statistics"
DATABASE = "durable_bench_ui"
CHROMIUM = "/usr/bin/chromium"


TASK_QUERIES = {
    "newest first, no filter": "",
    "a common word of the input (1 in 4)": "?q=renewal",
    "a rare word of the input (1 task)": "?q=r4242%40",
    "status failed, by kind": "?status=failed&sort=kind",
    "one kind, page 40": "?kind=agent-turn&page=40",
}
"""The tasks page's URLs measured (under ``/tasks/``)."""


def trigram_index() -> bool:
    """Whether the tasks' inputs have the trigram index here (the server has pg_trgm)."""
    from django.db import connection

    from controlplane.storage import search

    with connection.cursor() as cur:
        cur.execute("SELECT to_regclass(%s) IS NOT NULL", [search.INDEX])
        return bool(cur.fetchone()[0])


def without_trigram_index() -> None:
    """The tasks as a server without pg_trgm holds them: the index dropped, the
    statistics that migration 0006 makes there instead, analysed."""
    from django.db import connection

    from controlplane.storage import search

    with connection.cursor() as cur:
        cur.execute(f"DROP INDEX {search.INDEX}")
        cur.execute(search.CREATE_STATISTICS)
        cur.execute("ANALYZE kernel_task")


def seed_long_task(phases: int) -> str:
    """A terminal task whose commit log holds ``phases`` phases: for each, the commit
    that entered it (by its lease) and one mid-phase commit; returns its id."""
    from django.db import connection

    from controlplane.storage.schema import COMMIT, SESSION, TASK
    from kernel.records import Commit, SessionRecord, Status, Task, new_id

    session_id, task_id = new_id("sess"), new_id("task")
    start = datetime.now(UTC) - timedelta(seconds=phases)
    commits, seq = [], 0

    def commit(at: float, **item: object) -> None:
        nonlocal seq
        seq += 1
        summary = [{"type": "task", "id": task_id, "kind": "long-job", **item}]
        commits.append(Commit(session_id, seq, start + timedelta(seconds=at),
                              f"task:{task_id}", summary))

    commit(0.0, status="pending", phase="p0")
    for n in range(phases):
        holder = {"holder": f"bench-host:{1000 + n % 4}", "epoch": n + 1}
        commit(n + 0.4, status="running", phase=f"p{n}", **holder)
        if n + 1 < phases:
            commit(n + 1.0, status="pending", phase=f"p{n + 1}", **holder)
    commit(float(phases), status="terminal", phase=f"p{phases - 1}", outcome="succeeded",
           holder="bench-host:1000", epoch=phases)
    task = Task(task_id, session_id, "long-job", 1, {"phases": phases}, Status.TERMINAL,
                f"p{phases - 1}", {}, 1, seq, outcome={"kind": "succeeded"}, epoch=phases)
    connection.ensure_connection()
    with connection.connection.cursor() as cur:
        session = SessionRecord(session_id, seq, start, {"title": "long task"})
        cur.execute(f"INSERT INTO {SESSION.name} ({', '.join(SESSION.inserted)}) VALUES "
                    f"({', '.join(['%s'] * len(SESSION.inserted))})", SESSION.values(session))
        cur.execute(f"INSERT INTO {TASK.name} ({', '.join(TASK.inserted)}) VALUES "
                    f"({', '.join(['%s'] * len(TASK.inserted))})", TASK.values(task))
        with cur.copy(f"COPY {COMMIT.name} ({', '.join(COMMIT.inserted)}) FROM STDIN") as copy:
            for row in commits:
                copy.write_row(COMMIT.values(row))
    return task_id


def viewer_client() -> object:
    from django.contrib.auth.models import Group, User
    from django.test import Client

    user = User.objects.create_user(f"bench-viewer-{time.monotonic_ns()}", password="bench")
    user.groups.add(Group.objects.get_or_create(name="viewer")[0])
    client = Client()
    client.force_login(user)
    return client


def measure_render(session_id: str, runs: int, warmup: int = 2,
                   path: str = "/sessions/{}/", cpu: list[float] | None = None) -> Stats:
    """Server-side time of the session page (or ``path`` of another id): view, reads and
    templates. ``cpu`` collects this process's CPU time of each run (the database's is
    not in it): on a busy machine it shows what the wall time hides."""
    client = viewer_client()
    samples = []
    for i in range(warmup + runs):
        started, used = time.perf_counter(), time.process_time()
        answer = client.get(path.format(session_id))  # type: ignore[attr-defined]
        elapsed, used = time.perf_counter() - started, time.process_time() - used
        assert answer.status_code == 200, answer.status_code
        if i >= warmup:
            samples.append(elapsed)
            if cpu is not None:
                cpu.append(used)
    return Stats.of(samples)


@dataclass
class Browser:
    interactive_ms: list[float] = field(default_factory=list)
    live_ms: list[float] = field(default_factory=list)
    html_bytes: int = 0


def measure_browser(url: str, session_id: str, runs: int) -> Browser:
    """Chromium against a real Daphne: time to ``domInteractive`` and to a live socket."""
    from playwright.sync_api import sync_playwright

    from controlplane.dev.processes import Daphne, process_env

    env = process_env(url, DJANGO_DEBUG="0")
    found = Browser()
    from django.contrib.auth.models import Group, User

    user = User.objects.create_user(f"bench-ui-{time.monotonic_ns()}", password="bench-pw")
    user.groups.add(Group.objects.get_or_create(name="viewer")[0])
    with tempfile.TemporaryDirectory() as tmp:
        server = Daphne(Path(tmp) / "daphne.log", env)
        server.start()
        try:
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=CHROMIUM,
                                                     args=["--no-sandbox"])
                page = browser.new_page()
                page.goto(f"{server.http}/accounts/login/")
                page.fill("#id_username", user.username)
                page.fill("#id_password", "bench-pw")
                page.click("button[type=submit]")
                page.wait_for_url(f"{server.http}/")
                for _ in range(runs):
                    page.goto(f"{server.http}/sessions/{session_id}/")
                    page.wait_for_selector("#conn-state.conn-live", timeout=60_000)
                    timing = page.evaluate(
                        "(() => { const n = performance.getEntriesByType('navigation')[0];"
                        " return [n.domInteractive, performance.now(), n.transferSize]; })()")
                    found.interactive_ms.append(float(timing[0]))
                    found.live_ms.append(float(timing[1]))
                    found.html_bytes = int(timing[2])
                browser.close()
        finally:
            server.stop()
    return found


@dataclass
class Result:
    when: datetime
    tasks: int
    render: Stats | None
    browser: Browser | None
    load: tuple[float, float]
    timeline: Stats | None = None
    phases: int = 0
    cpu: dict[str, Stats] = field(default_factory=dict)
    """Server CPU time (this process) per measured page, by the row's name."""
    found: int = 0
    """Tasks seeded for the tasks page."""
    tasks_page: dict[str, dict[str, Stats]] = field(default_factory=dict)
    """Server render of the tasks page by path (:data:`TRIGRAM_PATH`, :data:`SCAN_PATH`),
    then by :data:`TASK_QUERIES` name."""
    server: str = ""
    """The server's version and settings, as the tasks page's section names them."""
    only_tasks_page: bool = False


def render(result: Result) -> str:
    r = result.render
    assert r is not None, "the session page was not measured"

    def cpu(name: str) -> list[str]:
        c = result.cpu.get(name)
        return [f"| … its CPU time in the server process (ms) | {c.count} | {c.p50:.1f} | "
                f"{c.p90:.1f} | {c.max:.1f} |"] if c else []

    lines = [
        HEADING,
        "",
        f"Run {result.when:%Y-%m-%d %H:%M} UTC by `make bench BENCH_ARGS=ui` "
        f"(`python -m benchmarks.ui`); {os.cpu_count()} CPUs, PostgreSQL on the same host, "
        f"`DEBUG` off. Load average (1 min) at start / end: {result.load[0]:.2f} / "
        f"{result.load[1]:.2f}.",
        "",
        f"A session of {result.tasks:,} tasks (one `send-batch` root, {result.tasks - 1:,} "
        "`send-notice` children in five states, seeded in SQL). The page shows the root "
        "with its children counted by status; children load by pages of 50. The task page "
        "shows a timeline row per phase (seeded: two commits per phase). The measuring "
        "process freezes its start-up heap as a web process does (`controlplane.process.heap`).",
        "",
        "| measure | runs | p50 | p90 | max |",
        "|---|---:|---:|---:|---:|",
        f"| server render of the session page (ms) | {r.count} | {r.p50:.1f} | {r.p90:.1f} "
        f"| {r.max:.1f} |",
        *cpu("session"),
    ]
    t = result.timeline
    if t is not None:
        lines.append(f"| server render of the task page, a {result.phases:,}-phase timeline "
                     f"(ms) | {t.count} | {t.p50:.1f} | {t.p90:.1f} | {t.max:.1f} |")
        lines += cpu("timeline")
    b = result.browser
    if b is not None and b.interactive_ms:
        lines += [
            f"| browser: navigation to `domInteractive` (ms) | {len(b.interactive_ms)} | "
            f"{statistics.median(b.interactive_ms):.1f} | — | {max(b.interactive_ms):.1f} |",
            f"| browser: navigation to socket live (ms) | {len(b.live_ms)} | "
            f"{statistics.median(b.live_ms):.1f} | — | {max(b.live_ms):.1f} |",
            "",
            f"Browser: Debian chromium (headless, Playwright) against one Daphne process; "
            f"the page's HTML is {b.html_bytes:,} bytes on the wire.",
        ]
    return "\n".join(lines) + "\n"


def tasks_heading(result: Result) -> str:
    """The tasks page's section: both paths where the server has pg_trgm, else its own."""
    return TASKS_HEADING if TRIGRAM_PATH in result.tasks_page else EMBEDDED_HEADING


def render_tasks_page(result: Result) -> str:
    both = TRIGRAM_PATH in result.tasks_page
    lines = [
        tasks_heading(result),
        "",
        f"Run {result.when:%Y-%m-%d %H:%M} UTC by `make bench BENCH_ARGS="
        + ("'ui -- --only-tasks-page'` (`python -m benchmarks.ui --only-tasks-page`)"
           if result.only_tasks_page else "ui` (`python -m benchmarks.ui`)")
        + f"; {os.cpu_count()} CPUs, {result.server}, `DEBUG` off. "
        f"Load average (1 min) at start / end: {result.load[0]:.2f} / {result.load[1]:.2f}.",
        "",
        f"The tasks page (`/tasks/`) over {result.found:,} tasks in 100 sessions (four "
        "kinds, six shown states, inputs of a few words; seeded in SQL), server render. "
        "A word of the input is `(input)::text ILIKE '%word%'` on every server: "
        + (f"\"{TRIGRAM_PATH}\" is the trigram index that migration 0006 makes where the "
           f"server has pg_trgm; \"{SCAN_PATH}\" is the same database with that index "
           "dropped and the statistics on the expression made and analysed, as migration "
           "0006 does on a server without pg_trgm (the embedded pgserver)."
           if both else
           "this server has no pg_trgm, so migration 0006 made statistics on the "
           "expression and no index (the embedded pgserver's path)."),
        "",
        "| tasks page | path | runs | p50 | p90 | max |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name, query in TASK_QUERIES.items():
        for path, found in result.tasks_page.items():
            s = found[name]
            lines.append(f"| {name} (`/tasks/{query}`) (ms) | {path} | {s.count} | "
                         f"{s.p50:.1f} | {s.p90:.1f} | {s.max:.1f} |")
    return "\n".join(lines) + "\n"


def measure_url(url: str, runs: int, warmup: int = 2) -> Stats:
    """Server-side time of a page by its URL (no id to fill in)."""
    return measure_render("", runs, warmup, path=url.replace("{", "{{").replace("}", "}}"))


def measure_tasks_page(runs: int, warmup: int = 2) -> dict[str, Stats]:
    return {name: measure_url(f"/tasks/{query}", runs, warmup)
            for name, query in TASK_QUERIES.items()}


def run(args: argparse.Namespace, url: str) -> Result:
    load_start = os.getloadavg()[0]
    stats = timeline = browser = None
    used: dict[str, list[float]] = {"session": [], "timeline": []}
    if not args.only_tasks_page:
        progress(f"seeding a session of {args.tasks} tasks")
        session_id, _ = seed_session(args.tasks)
        progress(f"server render x{args.runs}")
        stats = measure_render(session_id, args.runs, cpu=used["session"])
        progress(f"  p50 {stats.p50:.1f} ms")
        if args.phases:
            progress(f"seeding a task of {args.phases} phases; its page x{args.runs}")
            timeline = measure_render(seed_long_task(args.phases), args.runs,
                                      path="/tasks/{}/", cpu=used["timeline"])
            progress(f"  p50 {timeline.p50:.1f} ms")
        if args.browser_runs and os.path.exists(CHROMIUM):
            progress(f"browser x{args.browser_runs}")
            browser = measure_browser(url, session_id, args.browser_runs)
    progress(f"seeding {args.found} tasks for the tasks page")
    seed_tasks(args.found)
    tasks_page = {}
    paths = [TRIGRAM_PATH, SCAN_PATH] if trigram_index() else [SCAN_PATH]
    for path in paths:
        if path == SCAN_PATH and TRIGRAM_PATH in tasks_page:
            progress("dropping the trigram index, analysing the statistics instead")
            without_trigram_index()
        tasks_page[path] = measure_tasks_page(args.runs)
        for name, found in tasks_page[path].items():
            progress(f"  tasks page ({path}), {name}: p50 {found.p50:.1f} ms")
    return Result(datetime.now(UTC), args.tasks, stats, browser, (load_start, os.getloadavg()[0]),
                  timeline, args.phases, {k: Stats.of(v) for k, v in used.items() if v},
                  found=args.found, tasks_page=tasks_page, server=server(),
                  only_tasks_page=args.only_tasks_page)


def server() -> str:
    """The server as the tasks page's section names it."""
    from django.db import connection

    connection.ensure_connection()
    facts = server_facts(connection.connection)
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_available_extensions WHERE name = 'pg_trgm'")
        trgm = "pg_trgm available" if cur.fetchone()[0] else "no pg_trgm"
    return (f"PostgreSQL {facts['version']} on the same host ({trgm}; "
            f"shared_buffers {facts['shared_buffers']})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ui", description=__doc__)
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--found", type=int, default=100_000,
                        help="tasks seeded for the tasks page")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--phases", type=int, default=2_000,
                        help="phases of the long task whose timeline is measured (0: none)")
    parser.add_argument("--browser-runs", type=int, default=5)
    parser.add_argument("--only-tasks-page", action="store_true",
                        help="measure (and write the section of) the tasks page alone")
    args, url = parse_arguments(parser, argv, DATABASE)
    fresh_database(args, url)
    from controlplane.process.heap import settle

    settle()  # as a server process does once it has started (controlplane.asgi)
    result = run(args, url)
    if not args.only_tasks_page:
        publish(HEADING, render(result), write=not args.no_write)
    return publish(tasks_heading(result), render_tasks_page(result), write=not args.no_write)


if __name__ == "__main__":
    raise SystemExit(main())
