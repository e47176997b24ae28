"""Long agent histories (issue 24): what a long conversation persists, and what the next
request's context costs to rebuild as the conversation grows.

Two measurements, on Postgres:

1. The workload of temporalio/sdk-python#1890, where Temporal ended an agent at 53 of
   100 model calls with 50 MB of history: 100 model calls (ten user messages, each
   answered after nine tool calls) by a scripted model, 5 KB tool outputs, a
   conversation of about 209,000 tokens, a model window of 128,000 tokens (so it is
   compacted on the way). It runs through the real agent loop (turns, tool tasks,
   compaction tasks) on ``PostgresStorage`` in-process, and reports the bytes the
   kernel tables grew by, table by table (heap, TOAST and indexes:
   ``pg_total_relation_size``), beside the logical size of what the conversation holds.
   Values above the artifact threshold are stored apart as artifacts, in Postgres as the
   control plane's default store keeps them (``kernel_artifact``), and counted with the
   rest.
   Target: at most 10 MB.
2. Conversations of 1,000 and 10,000 turns (a user message, a response calling a tool,
   its 1 KB result) with a summary covering all but the newest 20 turns, as compaction
   leaves them: the next request's context rebuild (``Kernel.context`` and the
   messages built from it) timed ``--repeat`` times each, interleaved. Target: p95 at
   most 50 ms, and within 20% between the two lengths. The rebuild of the whole
   10,000-turn conversation (what every request cost before summaries) is timed beside
   it for reference.

Run it with ``make bench BENCH_ARGS=history``; it writes the section "Long agent
histories (issue 24)" of ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import time
from dataclasses import dataclass
from typing import Any

from benchmarks._support import (
    Stats,
    fresh_database,
    machine_state,
    parse_arguments,
    percentile,
    progress,
    publish,
    seed_session,
)
from kernel.artifacts import DEFAULT_THRESHOLD

HEADING = "## Long agent histories (issue 24)"
DATABASE = "durable_bench_history"
TABLES = ("kernel_entry", "kernel_commit", "kernel_task", "kernel_document",
          "kernel_document_version", "kernel_submission", "kernel_dispatch",
          "kernel_conversation", "kernel_session", "kernel_artifact")
TOOL_OUTPUT = 5_000
RESPONSE_TEXT = 3_800
MESSAGES = 10
CALLS_PER_MESSAGE = 9
WINDOW = 128_000
RECENT_TURNS = 20


WORDS = (
    "the customer order invoice shipped returned account balance page report total "
    "status pending approved refund email address line item quantity price tax date "
    "warehouse carrier tracking number delayed delivered note review policy section "
    "contract renewal term payment method card bank transfer reference summary of and "
    "to in for with on by from at is was were has have had not this that which will"
)
VOCABULARY = tuple(WORDS.split(" "))


def prose(length: int, seed: int) -> str:
    """``length`` characters of word-like text: it compresses about as prose does (a
    run of one repeated character would make TOAST's compression look far too good)."""
    pick = random.Random(seed).choice
    words: list[str] = []
    size = 0
    while size < length:
        word = pick(VOCABULARY)
        words.append(word)
        size += len(word) + 1
    return " ".join(words)[:length]


@dataclass
class Persisted:
    model_calls: int
    summary_calls: int
    tokens: int
    logical: dict[str, int]
    grown: dict[str, int]
    summaries: int
    entries: int


def workload_script() -> Any:
    from kernel.agent import ModelRequest, ModelResponse, ToolCall

    def script(request: ModelRequest) -> ModelResponse:
        if request.purpose == "compaction":
            return ModelResponse("Summary: " + prose(2000, len(request.messages)),
                                 usage={"input_tokens": 1, "output_tokens": 1})
        # Where the turn stands, from its newest message (compaction always keeps it): a
        # new question, or the result of the n-th call made for it.
        last = request.messages[-1]
        if last["role"] == "tool":
            tag, done = last["tool_call_id"].rsplit("-", 1)
            read = int(done) + 1
        else:
            tag, read = "call-" + hashlib.sha1(str(last["content"]).encode()).hexdigest()[:8], 0
        text = prose(RESPONSE_TEXT, len(request.messages))
        if read < CALLS_PER_MESSAGE:
            call = ToolCall(f"{tag}-{read}", "fetch_page", {"page": read})
            return ModelResponse(text, (call,), {"input_tokens": 1, "output_tokens": 1})
        return ModelResponse(text, (), {"input_tokens": 1, "output_tokens": 1})

    return script


def sizes(cur: Any) -> dict[str, int]:
    found = {}
    for table in TABLES:
        # A partitioned table (the commit log) holds nothing itself: its partitions do.
        cur.execute(
            "SELECT pg_total_relation_size(%s::regclass) + coalesce((SELECT "
            "sum(pg_total_relation_size(inhrelid)) FROM pg_inherits WHERE inhparent = "
            "%s::regclass), 0)", [table, table])
        found[table] = int(cur.fetchone()[0])
    return found


def run_workload() -> Persisted:
    from django.db import connection

    from controlplane.storage import PostgresArtifacts, PostgresStorage
    from kernel import Draft, Kernel, Registry, Scheduler
    from kernel.agent import (
        Compaction,
        Replay,
        ScriptedProvider,
        Tool,
        Toolbox,
        register_agent,
        submit,
    )
    from kernel.agent.compaction import estimate_tokens

    provider = ScriptedProvider(workload_script())
    toolbox = Toolbox()
    toolbox.add(Tool("fetch_page", "A page of a document", {"type": "object"}, Replay.SAFE,
                     run=lambda run, args: {"page": args["page"],
                                            "text": prose(TOOL_OUTPUT, args["page"])}))
    registry = Registry()
    register_agent(registry, {"scripted": provider}, toolbox, "scripted",
                   Compaction({"scripted": WINDOW}))
    kernel = Kernel(PostgresStorage(), registry, artifacts=PostgresArtifacts())
    with connection.cursor() as cur:
        cur.execute("VACUUM ANALYZE")
        before = sizes(cur)
    handle = kernel.create_session()
    draft = Draft()
    conversation = draft.create_conversation()
    handle.commit(draft)
    for number in range(MESSAGES):
        submit(handle, conversation, {"text": f"Read the next pages ({number})"}, f"m{number}")
        Scheduler(kernel, "bench").run_until_idle()
        progress(f"workload: message {number + 1}/{MESSAGES} answered")
    entries = kernel.entries(conversation)
    with connection.cursor() as cur:
        cur.execute("VACUUM ANALYZE")
        after = sizes(cur)
        logical = {}
        for name, query in {
            "entry payloads": "SELECT coalesce(sum(octet_length(payload::text)), 0) "
                              "FROM kernel_entry",
            "task inputs and checkpoints": "SELECT coalesce(sum(octet_length(input::text) + "
                                           "octet_length(checkpoint::text)), 0) FROM kernel_task",
            "document versions": "SELECT coalesce(sum(octet_length(ops::text) + "
                                 "coalesce(octet_length(baseline::text), 0)), 0) "
                                 "FROM kernel_document_version",
            "commit summaries": "SELECT coalesce(sum(octet_length(summary::text)), 0) "
                                "FROM kernel_commit",
            "values stored apart (artifacts)": "SELECT coalesce(sum(size), 0) "
                                               "FROM kernel_artifact",
        }.items():
            cur.execute(query)
            logical[name] = int(cur.fetchone()[0])
    shown = [e for e in entries if e.kind != "summary"]
    return Persisted(
        model_calls=sum(1 for r in provider.requests if r.purpose == "turn"),
        summary_calls=sum(1 for r in provider.requests if r.purpose == "compaction"),
        tokens=sum(estimate_tokens(e.payload) for e in shown),
        logical=logical,
        grown={t: after[t] - before[t] for t in TABLES},
        summaries=sum(1 for e in entries if e.kind == "summary"),
        entries=len(entries),
    )


def build_conversation(kernel: Any, handle: Any, turns: int, usage: bool = False) -> str:
    """``turns`` turns, then a summary of all but the newest :data:`RECENT_TURNS`; with
    ``usage``, each response reports tokens as a model's does (the page totals them)."""
    from kernel import Draft
    from kernel.agent.requests import USAGE, conversation_key
    from kernel.records import SUMMARY

    draft = Draft()
    conversation = draft.create_conversation()
    handle.commit(draft)
    last_covered = None
    per_commit = 100
    for start in range(0, turns, per_commit):
        draft = Draft()
        for turn in range(start, min(start + per_commit, turns)):
            call = {"id": f"c{turn}", "name": "fetch_page", "arguments": {"page": turn}}
            draft.append(conversation, "user", {"text": f"question {turn}"})
            used = {"input_tokens": 900 + turn, "output_tokens": 40} if usage else {}
            draft.append(conversation, "model_response",
                         {"text": "", "tool_calls": [call], "usage": used, "turn": f"t{turn}"})
            draft.append(conversation, "tool_result",
                         {"call_id": f"c{turn}", "name": "fetch_page",
                          "result": {"text": "r" * 1000}})
            if usage:  # the running totals a turn adds its response's usage to
                draft.update_document(USAGE, conversation_key(conversation), *(
                    {"op": "incr", "path": ["models", "scripted", name], "value": count}
                    for name, count in used.items()))
        written = handle.commit(draft).entries
        for index, entry in enumerate(written):
            if start + index // 3 == turns - RECENT_TURNS - 1 and entry.kind == "tool_result":
                last_covered = entry
        if (start // per_commit) % 20 == 0:
            progress(f"conversation of {turns} turns: {start + per_commit} written")
    assert last_covered is not None
    draft = Draft()
    draft.append(conversation, SUMMARY, {"text": "Summary: " + "s" * 2000, "covers": {
        "first": {"id": "-", "seq": 0, "ordinal": 0},
        "last": {"id": last_covered.id, "seq": last_covered.seq,
                 "ordinal": last_covered.ordinal}}})
    handle.commit(draft)
    return conversation


def run_rebuilds(
    repeat: int, lengths: tuple[int, int] = (1000, 10_000)
) -> tuple[dict[int, list[float]], Stats, int]:
    from django.db import connection

    from controlplane.storage import PostgresStorage
    from kernel import Kernel, Registry
    from kernel.agent.context import messages

    kernel = Kernel(PostgresStorage(), Registry())
    handle = kernel.create_session()
    conversations = {turns: build_conversation(kernel, handle, turns) for turns in lengths}
    with connection.cursor() as cur:
        cur.execute("VACUUM ANALYZE kernel_entry")
    samples: dict[int, list[float]] = {turns: [] for turns in conversations}
    size = 0
    for _ in range(repeat):
        for turns, conversation in conversations.items():  # interleaved: noise hits both
            started = time.perf_counter()
            built = messages(kernel.context(conversation))
            samples[turns].append(time.perf_counter() - started)
            size = len(built)
    whole = []
    for _ in range(max(3, repeat // 40)):
        started = time.perf_counter()
        messages(kernel.entries(conversations[lengths[-1]]))
        whole.append(time.perf_counter() - started)
    return samples, Stats.of(whole), size


Pages = dict[str, tuple[Stats, Stats]]
"""The session page's wall and CPU time, by what the session holds."""
TASKS_PAGE = "10,000 tasks (`benchmarks.ui`'s page)"


def run_pages(runs: int, lengths: tuple[int, int] = (1000, 10_000),
              tasks: int = 10_000) -> tuple[Pages, Stats]:
    """The dashboard's session page of a session holding one conversation of each
    length (with usage on every response), server render as ``benchmarks.ui`` times it,
    interleaved with that benchmark's page of a session of ``tasks`` tasks: on a busy
    machine the ratio between them says more than either time."""
    from django.contrib.auth.models import Group, User
    from django.db import connection
    from django.test import Client

    from controlplane.storage import PostgresStorage
    from kernel import Kernel, Registry
    from kernel.agent.requests import USAGE

    registry = Registry()
    registry.document(USAGE)
    kernel = Kernel(PostgresStorage(), registry)
    sessions = {}
    for turns in lengths:
        handle = kernel.create_session()
        build_conversation(kernel, handle, turns, usage=True)
        sessions[f"a conversation of {turns:,} turns"] = handle.id
    long = sessions[f"a conversation of {lengths[-1]:,} turns"]
    sessions[TASKS_PAGE.replace("10,000", f"{tasks:,}")] = seed_session(tasks)[0]
    with connection.cursor() as cur:
        cur.execute("VACUUM ANALYZE")
    user = User.objects.create_user(f"bench-history-{time.monotonic_ns()}", password="bench")
    user.groups.add(Group.objects.get_or_create(name="viewer")[0])
    client = Client()
    client.force_login(user)
    wall: dict[str, list[float]] = {name: [] for name in sessions}
    cpu: dict[str, list[float]] = {name: [] for name in sessions}
    rounds = max(1, runs // 5)
    for lap in range(rounds + 1):  # the first lap warms up
        for name, session_id in sessions.items():  # interleaved: noise hits each
            for _ in range(min(5, runs)):
                started, used = time.perf_counter(), time.process_time()
                answer = client.get(f"/sessions/{session_id}/")
                elapsed, used = time.perf_counter() - started, time.process_time() - used
                assert answer.status_code == 200, answer.status_code
                if lap:
                    wall[name].append(elapsed)
                    cpu[name].append(used)
    found = {name: (Stats.of(wall[name]), Stats.of(cpu[name])) for name in sessions}
    for name, (page, _) in found.items():
        progress(f"session page, {name}: p50 {page.p50:.1f} ms")
    return found, summed_usage(long, max(3, runs // 3))


def summed_usage(session_id: str, runs: int) -> Stats:
    """For reference: the longer conversation's usage summed over every response in SQL,
    what the page read before running totals (still the path of a conversation without
    them)."""
    from controlplane import models
    from controlplane.reads import sessions, transcript

    conversation = models.Conversation.objects.filter(session_id=session_id).exclude(
        id__startswith="conv_ops").values_list("id", flat=True).get()
    scope = sessions.transcript_scope(conversation)
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        transcript._summed(session_id, scope)
        samples.append(time.perf_counter() - started)
    return Stats.of(samples)


def render_pages(pages: Pages, summed: Stats) -> list[str]:
    from controlplane.reads.pages import ENTRY_TAIL

    return [
        "",
        "### The session page of a long conversation",
        "",
        "A session holding one conversation (turns as above, a summary of all but the "
        f"newest {RECENT_TURNS} turns, usage on every response); `GET /sessions/<id>/` "
        "rendered by Django's test client in the benchmark process, as `benchmarks.ui` "
        "times its page of a session of 10,000 tasks (section \"Dashboard (issue 6)\"), "
        "which is measured here too, interleaved with them, for reference:",
        "",
        "| the session holds | runs | p50 ms | p90 ms | max ms | CPU in the server "
        "process, p50 ms |",
        "|---|---:|---:|---:|---:|---:|",
        *(f"| {name} | {s.count} | {s.p50:.1f} | {s.p90:.1f} | {s.max:.1f} | {cpu.p50:.1f} |"
          for name, (s, cpu) in pages.items()),
        "",
        f"The page reads the last {ENTRY_TAIL} entries (earlier ones load by pages), counts "
        "up to 1,000, reads the tool tasks of the calls it shows and the conversation's "
        "running usage totals (docs/agents.md, \"In the dashboard\"). For reference, the "
        "usage of the longer conversation summed over every response in SQL (what the page "
        "read before running totals): p50 "
        f"{summed.p50:.0f} ms over {summed.count} runs.",
    ]


def render(persisted: Persisted, rebuilds: dict[int, list[float]], whole: Stats, size: int,
           load: tuple[str, str], pages: tuple[Pages, Stats]) -> str:
    total = sum(persisted.grown.values())
    mb = total / 1_000_000
    lines = [
        HEADING,
        "",
        f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. "
        f"{machine_state(load[0])} (load average {load[0]} before, {load[1]} after): the "
        "times are this run's, comparable only with each other.",
        "",
        "### The workload of temporalio/sdk-python#1890",
        "",
        f"{persisted.model_calls} model calls (and {persisted.summary_calls} summary "
        f"requests), {MESSAGES} user messages, {TOOL_OUTPUT // 1000} KB tool outputs, a "
        f"conversation of about {persisted.tokens:,} tokens ({persisted.entries} entries, "
        f"{persisted.summaries} of them summaries), a {WINDOW:,}-token window.",
        "",
        f"**Bytes persisted: {total:,} ({mb:.2f} MB; target at most 10 MB: "
        f"{'met' if mb <= 10 else 'NOT met'}).** Where they go (growth of each table with "
        "its TOAST and indexes, after VACUUM; word-like text, which TOAST compresses about "
        "as it would prose; a task row's dead versions, one per phase commit, stay in its "
        "table's pages for reuse):",
        "",
        "| table | bytes |",
        "|---|---:|",
        *(f"| `{t}` | {b:,} |" for t, b in persisted.grown.items()
          if b or t == "kernel_artifact"),
        "",
        "What those tables hold, as JSON text before compression:",
        "",
        "| part | bytes |",
        "|---|---:|",
        *(f"| {n} | {b:,} |" for n, b in persisted.logical.items()),
        "",
        "Each entry is written once and read back by range; nothing is rewritten per call "
        "(Temporal's history grows with every call's full input). An entry payload, a "
        "document value or a tool result whose JSON passes the artifact threshold "
        f"({DEFAULT_THRESHOLD:,} bytes) is stored apart in `kernel_artifact`, counted "
        "above (this workload's values are all below it).",
        "",
        "### The next request's context rebuild",
        "",
        f"A summary covers all but the newest {RECENT_TURNS} turns ({size} messages "
        "rebuilt); `Kernel.context` plus the messages built from it, interleaved:",
        "",
        "| turns | samples | p50 ms | p95 ms | p99 ms | max ms |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    p95: dict[int, float] = {}
    for turns, samples in rebuilds.items():
        stats = Stats.of(samples)
        p95[turns] = percentile(sorted(s * 1000.0 for s in samples), 95)
        lines.append(f"| {turns:,} | {stats.count} | {stats.p50:.2f} | {p95[turns]:.2f} | "
                     f"{stats.p99:.2f} | {stats.max:.2f} |")
    short, long = min(p95), max(p95)
    ratio = p95[long] / p95[short]
    lines += [
        "",
        f"p95 at most 50 ms: {'met' if max(p95.values()) <= 50 else 'NOT met'}; {long:,} "
        f"against {short:,} turns: {ratio:.2f}x (within 20%: "
        f"{'met' if abs(ratio - 1) <= 0.2 else 'NOT met'}).",
        "",
        f"For reference, rebuilding from every entry of the {long:,}-turn conversation (what "
        f"each request read before summaries): p50 {whole.p50:.0f} ms over {whole.count} "
        "runs.",
        *render_pages(*pages),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.history", description=__doc__)
    parser.add_argument("--repeat", type=int, default=400, help="rebuilds timed per length")
    parser.add_argument("--page-runs", type=int, default=30, help="session page renders")
    parser.add_argument("--only-page", action="store_true",
                        help="only the session page (prints it; docs/benchmarks.md untouched)")
    args, url = parse_arguments(parser, argv, DATABASE)
    fresh_database(args, url)
    if args.only_page:
        print("\n".join(render_pages(*run_pages(args.page_runs))))
        return 0
    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    persisted = run_workload()
    rebuilds, whole, size = run_rebuilds(args.repeat)
    pages = run_pages(args.page_runs)
    load_after = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return publish(HEADING, render(persisted, rebuilds, whole, size,
                                   (load_before, load_after), pages), write=not args.no_write)


if __name__ == "__main__":
    raise SystemExit(main())
