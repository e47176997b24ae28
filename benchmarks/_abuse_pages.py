"""The operator's live tasks page while a viewer does its worst (part of ``abuse``).

On a database of ``--tasks`` (300,000) tasks copied in with COPY (the dashboard
benchmark's seeding, ``benchmarks._support.seed_tasks``), one real Daphne with the request
rates on per account (the defaults, 10 a second, bursts of 50; per address off, since both
accounts come from 127.0.0.1) and the per-account budget of server time (the defaults,
0.5 s a second, 5 s at once):

0. warm-up: the same as 1, not counted (:data:`WARMUP_COMMITS`);
1. quiet: an operator follows ``/ws/ui/tasks/`` (no filter, newest first) while
   ``--commits`` commits are made ``--interval`` apart; the latency of each is from the
   commit's return to the first frame showing it;
2. abused: the same, while one viewer holds twenty sockets on the tasks page, each with
   a filter of its own (a common 3-letter word of the inputs, a sort, ``page=100000``),
   and keeps asking ``/tasks/`` for the review's search (a 2-character word, a sort,
   ``page=100000``) and for a 3-letter word with a sort and a deep page, from two
   threads, as fast as it is answered (429s included), its budgets full at the start.
   The viewer runs in a process of its own (:func:`viewer_process`), as another client
   would: in the measuring process, its sockets' frames and its threads' answers would
   be read by the same interpreter and event loop that read the operator's frames, and
   the operator's latency would include the wait for them. It still shares the
   machine's cores with the server and the measuring process.

Both phases run in the same process on the same server, in ``--rounds`` rounds whose
order alternates (quiet then abused, abused then quiet, ...), and each phase's samples
are pooled over the rounds: a p99 of one phase of 200 samples is its second-worst
sample, and on a shared machine a stall that falls in one phase but not the other
moves the ratio more than the viewer does; alternating rounds spread the machine's
drift over both phases alike.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import re
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks._support import Stats, commit_one, progress, seed_tasks

SHOWN = re.compile(r'id="feed-state" data-seq="(\d+)"')
SOCKET_WORDS = ["ren", "inv", "dig", "rem", "rec", "wel", "out", "sur", "new", "voi",
                "ges", "ind", "cei", "lco", "tag", "rve", "ewa", "nvo", "emi", "eip"]
SORTS = ["kind", "-kind", "status", "-status", "created"]
SERVER_SHARE, SERVER_BURST = 0.5, 5.0
"""The per-account budget of server time the server runs with (the settings' defaults)."""
WARMUP_COMMITS = 20
"""Commits followed, and not counted, before the quiet phase: the server's first renders
(its caches and connections cold) would otherwise land in the quiet phase's tail."""
SETTLE_SECONDS = 2.0
"""A pause after each phase: the viewer's last requests and renders end before the next
phase's first commit."""
SEARCHES = ["/tasks/?q=re&sort=kind&page=100000", "/tasks/?q=ren&sort=-status&page=100000"]


@dataclass
class Phase:
    name: str
    samples: Stats
    missing: int
    requests: int = 0
    refused: int = 0
    latencies: list[float] = field(default_factory=list, repr=False)
    """In seconds, for pooling rounds."""
    rounds: list[Stats] = field(default_factory=list, repr=False)
    """Each round's own figures, when pooled."""

    @classmethod
    def pooled(cls, found: list[Phase]) -> Phase:
        """One phase's rounds as one: their samples together, their counts summed."""
        latencies = [x for f in found for x in f.latencies]
        return cls(found[0].name, Stats.of(latencies), sum(f.missing for f in found),
                   sum(f.requests for f in found), sum(f.refused for f in found),
                   latencies, [f.samples for f in found])


def fresh_budgets(redis_url: str) -> None:
    """Every account's request rate and budget of server time back to full: each abused
    phase starts with the viewer able to spend its whole burst, as the first did."""
    import redis

    from controlplane.web.rates import KEY_PREFIX

    client = redis.Redis.from_url(redis_url)
    try:
        keys = list(client.scan_iter(f"{KEY_PREFIX}:*"))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


def accounts() -> tuple[str, str, str]:
    """(operator token, viewer token, viewer session cookie)."""
    from django.conf import settings
    from django.contrib.auth.models import Group, User
    from django.test import Client

    from controlplane.access import issue_token

    operator = User.objects.create_user("bench-operator")
    operator.groups.add(Group.objects.get_or_create(name="operator")[0])
    viewer = User.objects.create_user("bench-viewer")
    viewer.groups.add(Group.objects.get_or_create(name="viewer")[0])
    client = Client()
    client.force_login(viewer)
    cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"
    return issue_token(operator, "bench"), issue_token(viewer, "bench"), cookie


async def follow(ws: Any, seen: list[tuple[float, int]]) -> None:
    async for message in ws:
        for shown in SHOWN.findall(message):
            seen.append((time.perf_counter(), int(shown)))


async def drain(ws: Any) -> None:
    async for _ in ws:
        pass


def hammer(base: str, cookie: str, stop: Any, counts: list[int]) -> None:
    n = 0
    while not stop.is_set():
        request = urllib.request.Request(base + SEARCHES[n % len(SEARCHES)],
                                         headers={"Cookie": cookie})
        n += 1
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                answer.read()
            counts[0] += 1
        except urllib.error.HTTPError as exc:
            counts[0] += 1
            counts[1] += exc.code == 429
            if exc.code == 429:
                stop.wait(float(exc.headers.get("Retry-After", "1")))
        except OSError:
            stop.wait(0.5)


@dataclass(frozen=True)
class Viewer:
    """What the abusing viewer needs to do its worst: the server's addresses, its
    credentials, the commit its sockets start after, and what it does."""

    ws: str
    http: str
    token: str
    cookie: str
    start: int
    does: str


def viewer_process(viewer: Viewer, ready: Any, stop: Any, counted: Any) -> None:
    """The viewer, in a process of its own as another client is: its twenty sockets and
    two searching threads do not share the measuring process's interpreter and event
    loop with the operator's socket. Puts (requests, refused) on ``counted`` when
    ``stop`` is set."""
    asyncio.run(_viewer(viewer, ready, stop, counted))


async def _viewer(viewer: Viewer, ready: Any, stop: Any, counted: Any) -> None:
    from websockets.asyncio.client import connect

    sockets, tasks, counts, threads = [], [], [0, 0], []
    if viewer.does in ("both", "sockets"):
        for i, word in enumerate(SOCKET_WORDS):
            query = f"q={word}&sort={SORTS[i % len(SORTS)]}&page=100000"
            ws = await connect(f"{viewer.ws}/ws/ui/tasks/?{query}", max_size=None,
                               open_timeout=60,
                               additional_headers={"Authorization": f"Bearer {viewer.token}"})
            await ws.send(json.dumps({"after": viewer.start}))
            sockets.append(ws)
            tasks.append(asyncio.create_task(drain(ws)))
    if viewer.does in ("both", "requests"):
        threads = [threading.Thread(target=hammer, args=(viewer.http, viewer.cookie, stop,
                                                         counts)) for _ in range(2)]
        for thread in threads:
            thread.start()
    ready.set()
    await asyncio.to_thread(stop.wait)
    for thread in threads:
        thread.join()
    for ws in sockets:
        await ws.close()
    for task in tasks:
        task.cancel()
    counted.put(tuple(counts))


async def phase(name: str, server: Any, operator: str, viewer: str, cookie: str,
                commits: int, interval: float, abuse: bool, viewer_does: str = "both") -> Phase:
    from django.db import connections

    # One thread of its own for this process's reads and commits, whose connection is
    # closed at the end: a thread of asyncio's pool would leave it open past the run.
    pool = ThreadPoolExecutor(1)

    def run(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Awaitable[Any]:
        return asyncio.get_running_loop().run_in_executor(pool, partial(call, *args, **kwargs))

    try:
        return await _phase(run, name, server, operator, viewer, cookie, commits, interval,
                            abuse, viewer_does)
    finally:
        await run(connections.close_all)
        pool.shutdown()


async def _phase(run: Callable[..., Awaitable[Any]], name: str, server: Any, operator: str,
                 viewer: str, cookie: str, commits: int, interval: float, abuse: bool,
                 viewer_does: str) -> Phase:
    from websockets.asyncio.client import connect

    from controlplane.reads.pages import last_commit_id
    from controlplane.worker.runtime import runtime

    handle = await run(runtime().kernel.create_session, metadata={"benchmark": "abuse"})
    await run(commit_one, handle, "start")
    start = await run(last_commit_id)
    auth = {"Authorization": f"Bearer {operator}"}
    watcher = await connect(f"{server.ws}/ws/ui/tasks/", max_size=None, open_timeout=60,
                            additional_headers=auth)
    await watcher.send(json.dumps({"after": start}))
    seen: list[tuple[float, int]] = []
    tasks = [asyncio.create_task(follow(watcher, seen))]
    viewer_load, counts = None, (0, 0)
    if abuse:
        spawn = multiprocessing.get_context("spawn")
        ready, stop, counted = spawn.Event(), spawn.Event(), spawn.Queue()
        viewer_load = spawn.Process(target=viewer_process, daemon=True, args=(
            Viewer(server.ws, server.http, viewer, cookie, start, viewer_does), ready, stop,
            counted))
        viewer_load.start()
        if not await asyncio.to_thread(ready.wait, 120):
            raise RuntimeError("the viewer's process did not get going")
        await asyncio.sleep(2)  # the viewer's load under way before the first commit
    made: list[tuple[float, int]] = []
    for i in range(commits):
        await run(commit_one, handle, i)
        made.append((time.perf_counter(), await run(last_commit_id)))
        await asyncio.sleep(interval)
    deadline = time.perf_counter() + 30
    while (not seen or seen[-1][1] < made[-1][1]) and time.perf_counter() < deadline:
        await asyncio.sleep(0.1)
    if viewer_load is not None:
        stop.set()
        counts = await asyncio.to_thread(counted.get, True, 120)
        await asyncio.to_thread(viewer_load.join, 60)
    await watcher.close()
    for task in tasks:
        task.cancel()
    latencies, missing = [], 0
    for at, position in made:
        shown = [t for t, p in seen if p >= position]
        if shown:
            latencies.append(shown[0] - at)
        else:
            missing += 1
    return Phase(name, Stats.of(latencies), missing, counts[0], counts[1], latencies)


def run(url: str, redis_url: str, tasks: int, commits: int, interval: float,
        viewer_does: str = "both", server_share: float = SERVER_SHARE,
        warmup: int = WARMUP_COMMITS, server_burst: float = SERVER_BURST,
        rounds: int = 1) -> list[Phase]:
    """The quiet and the abused phase, each pooled over ``rounds`` alternating rounds."""
    from controlplane.dev.processes import Daphne, process_env

    progress(f"seeding {tasks} tasks (COPY)")
    started = time.perf_counter()
    seed_tasks(tasks)
    progress(f"  {time.perf_counter() - started:.0f} s")
    operator, viewer, cookie = accounts()
    env = process_env(url, redis_url, DJANGO_DEBUG="0",
                      USER_REQUESTS_PER_SECOND="10", USER_REQUEST_BURST="50",
                      USER_SERVER_SECONDS_PER_SECOND=str(server_share),
                      USER_SERVER_SECONDS_BURST=str(server_burst),
                      ADDRESS_REQUESTS_PER_SECOND="0")
    phases = []
    with tempfile.TemporaryDirectory() as tmp:
        server = Daphne(Path(tmp) / "daphne.log", env)
        progress("starting daphne")
        server.start()
        try:
            if warmup:
                progress(f"warming up: {warmup} commits, not counted")
                asyncio.run(phase("warm-up", server, operator, viewer, cookie, warmup,
                                  interval, False))
            found: dict[bool, list[Phase]] = {False: [], True: []}
            for round_ in range(rounds):
                order = (False, True) if round_ % 2 == 0 else (True, False)
                for abuse in order:
                    name = "a viewer at its worst" if abuse else "quiet"
                    progress(f"round {round_ + 1}/{rounds}, {name}: {commits} commits "
                             f"{interval * 1000:.0f} ms apart")
                    if abuse:
                        fresh_budgets(redis_url)
                    one = asyncio.run(phase(name, server, operator, viewer, cookie,
                                            commits, interval, abuse, viewer_does))
                    progress(f"  p50 {one.samples.p50:.0f} ms, p99 {one.samples.p99:.0f} ms,"
                             f" missing {one.missing}, viewer's requests {one.requests}"
                             f" ({one.refused} refused 429)")
                    found[abuse].append(one)
                    time.sleep(SETTLE_SECONDS)
            phases = [Phase.pooled(found[False]), Phase.pooled(found[True])]
        finally:
            server.stop()
    return phases
