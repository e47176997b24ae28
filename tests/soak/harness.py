"""The soak: the real stack under a seeded random mix of operator actions and faults,
then the invariants of issue 11 (and issue 30's checks) on what it left behind.

The stack (all through ``controlplane.dev``'s launchers and the chaos suite's private
services): a private Postgres and Redis, the local email provider, the SMTP stand-in,
a loopback model stand-in (model ``remote``, :mod:`tests.soak.model`), Daphne (the API
and the change feeds), two solo-pool Celery workers and one ``-P threads -c 4`` worker
beside them throughout, and beat. The workers and the web server load the soak's own
tools and task kind (:mod:`tests.soak.tools`).

The driver (one thread, ``random.Random(seed)``) does, until the time is up:
email batches over HTTP and SMTP (``manage.py send_notices``, as an operator would),
agent submissions through the API (steer / follow_up / reject; text with addresses
makes the scripted model call the ``send_notices`` tool), tool turns on the remote
model (soak tools that work for seconds, soak jobs that fail), cancels aimed at work
that is running at the time, resolutions of sends that wait for an operator (stale
ones, and two at once; a send is made uncertain on purpose when none waits),
resubmits, wakes, single retries, and bulk retries and cancels while new failures
arrive. The fault thread (its own ``Random(seed + 1)``) SIGKILLs workers, beat and the
web server, SIGSTOPs a worker that holds a lease until past the lease's end and then
SIGCONTs it, terminates one worker's database connection, steps a worker's clock,
restarts Redis and Postgres, and arms provider stalls and dropped answers; websocket
clients follow session feeds, drop and reconnect with their last seq.

Then faults stop, every process is up, the SMTP sends still waiting for an operator
are decided (truthfully, from the SMTP server's log, as an operator would), a fresh
burst is sent through every queue, and once nothing moves the checks run. A seed
reproduces the mix and the fault schedule (not the timing): ``SOAK_SEED=... make soak``.

``SOAK_FAULTS`` turns on what today's kernel cannot survive yet (:data:`OPTIONAL`):
``all``, or a comma-separated list of those names.
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import random
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
from websockets.exceptions import WebSocketException
from websockets.sync.client import connect

from controlplane.dev.processes import (
    QUEUES,
    ROOT,
    CeleryWorker,
    Daphne,
    Process,
    celery_worker,
    wait_for,
)
from controlplane.dev.smtp_server import SmtpStandIn, start_smtp_server
from tests.chaos.private_services import (
    PrivatePostgres,
    PrivateStack,
    private_stack,
)
from tests.model_stand_in import ModelStandIn, model_stand_in, models_env

from . import model, tools

SETTLE_SECONDS = 240.0
DRAIN_SECONDS = 120.0  # for the burst sent after settling to end
WEBSOCKET_CLIENTS = 3
TOOL_SESSIONS = 3
TERMINALISH = ("terminal",)
CLOCK_HOOK = Path(__file__).with_name("clock")  # its sitecustomize steps a worker's clock
CLOCK_STEP_LIMIT = 10.0  # seconds a worker's clock is ever off
STOP_LIMIT = 12.0  # seconds a SIGSTOP lasts at most
# What today's kernel cannot survive yet (issue 30): off unless SOAK_FAULTS names them.
OPTIONAL = {
    "values": "tool results and task results with NUL (\\u0000) and a datetime (not JSON)",
    "orphans": "check: no dispatch row for a terminal task",
    "cancel-truth": "check: a cancel answered 200 (not a replay) ends its task cancelled",
    "bulk-set": "check: a bulk action acts only on tasks its preview showed, and the same "
                "request again answers what the first did",
}
# What the web server answers while it or Postgres is down: a client tries again later, so
# such an answer says nothing of what the request did.
NO_ANSWER = (0, 502, 503)
# The sends of the SMTP batch a resolve starts when too few wait for an operator: each one's
# connection is dropped after DATA (a batch starts slowly: a Django start-up).
UNCERTAIN_PER_BATCH = 3
UNSURE = "unsure"  # how those batches' recipients begin
# How long after a tool returns its result may still be on its way to a commit.
COMMIT_GRACE = 5.0
# What a 10-minute run (``make soak``) must have done; shorter runs report them scaled.
TARGETS = {
    "cancels of running work landed": 50,
    "resolutions landed": 20,
    "worker SIGKILL": 30,
    "worker SIGSTOP past a lease": 10,
    "connection kill": 5,
}
TARGET_SECONDS = 600.0
# The fields a refused value can be in: an error refusing one names its field.
VALUE_FIELDS = ("result", "checkpoint", "payload", "entry", "receipt", "outcome")


def optional_faults(spec: str | None = None) -> frozenset[str]:
    """What ``SOAK_FAULTS`` turns on: empty, ``all``, or names of :data:`OPTIONAL`."""
    spec = os.environ.get("SOAK_FAULTS", "") if spec is None else spec
    names = {n.strip() for n in spec.split(",") if n.strip()}
    if "all" in names:
        return frozenset(OPTIONAL)
    unknown = names - set(OPTIONAL)
    if unknown:
        raise ValueError(f"SOAK_FAULTS: unknown {sorted(unknown)}; known: all, "
                         + ", ".join(sorted(OPTIONAL)))
    return frozenset(names)


ACTION_KINDS = ("cancel", "resolve", "retry", "wake", "resubmit", "bulk", "submit", "tool-turn")


@dataclass
class Report:
    seed: int
    seconds: float
    enabled: frozenset[str] = frozenset()
    operations: Counter[str] = field(default_factory=Counter)
    actions: Counter[str] = field(default_factory=Counter)
    landed: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    checked: Counter[str] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    shortfalls: list[str] = field(default_factory=list)

    def violation(self, what: str) -> None:
        self.violations.append(what)

    def by_action(self) -> dict[str, dict[str, int]]:
        """Attempted against landed (a 2xx answer) per action kind, with the refusals."""
        table: dict[str, Counter[str]] = defaultdict(Counter)
        for key, count in self.actions.items():
            kind, _, answer = key.rpartition(":")
            if not kind.startswith(ACTION_KINDS) or kind.endswith(("-settle", "-preview")):
                continue
            row = table[kind]
            row["attempted"] += count
            if answer.isdigit() and 200 <= int(answer) < 300:
                row["landed"] += count
            elif answer == "409":
                row["refused (409)"] += count
            elif answer == "0":
                row["no answer"] += count
            else:
                row[f"answered {answer}"] += count
        return {k: dict(sorted(v.items())) for k, v in sorted(table.items())}

    def targets(self) -> dict[str, dict[str, Any]]:
        scale = min(1.0, self.seconds / TARGET_SECONDS)
        got = {**self.faults, **self.landed}
        return {name: {"want": int(want * scale), "got": got.get(name, 0),
                       "met": got.get(name, 0) >= int(want * scale)}
                for name, want in TARGETS.items()}

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "seconds": self.seconds,
            "faults_enabled": sorted(self.enabled),
            "operations": sum(self.operations.values()),
            "operations_by_kind": dict(sorted(self.operations.items())),
            "actions_by_answer": dict(sorted(self.actions.items())),
            "landed_vs_attempted": self.by_action(),
            "landed": dict(sorted(self.landed.items())),
            "faults_by_kind": dict(sorted(self.faults.items())),
            "targets": self.targets(),
            "checked": dict(sorted(self.checked.items())),
            "violations": len(self.violations),
            "violation_list": self.violations[:50],
            "shortfalls": self.shortfalls,
        }

    def markdown(self, command: str) -> str:
        data = self.to_json()
        lines = [
            f"Reproduce: `{command}`",
            "",
            f"- seed {self.seed}, {self.seconds:g} s of load and faults; optional faults on: "
            + (", ".join(data["faults_enabled"]) or "none"),
            f"- operations: {data['operations']} ("
            + ", ".join(f"{k} {v}" for k, v in data["operations_by_kind"].items()) + ")",
            "- faults: " + ", ".join(f"{k} {v}" for k, v in data["faults_by_kind"].items()),
            "- landed / attempted: " + ", ".join(
                f"{k} {v.get('landed', 0)}/{v['attempted']}"
                for k, v in data["landed_vs_attempted"].items()),
            "- landed: " + ", ".join(f"{k} {v}" for k, v in data["landed"].items()),
            "- targets: " + ", ".join(
                f"{k} {v['got']}/{v['want']}" + ("" if v["met"] else " (short)")
                for k, v in data["targets"].items()),
            "- actions by answer: "
            + ", ".join(f"{k} {v}" for k, v in data["actions_by_answer"].items()),
            "- checked: " + ", ".join(f"{k} {v}" for k, v in data["checked"].items()),
            f"- **violations: {data['violations']}**",
        ]
        lines += [f"  - {v}" for v in data["violation_list"]]
        lines += [f"- shortfall: {s}" for s in self.shortfalls]
        return "\n".join(lines) + "\n"


def step_of(task: dict[str, Any]) -> dict[str, Any]:
    """The step a resolution names: the one the operator saw the task wait on."""
    step = task.get("step") or {}
    return {"signal": step.get("signal", ""), "epoch": step.get("epoch", 0)}


class Api:
    """The operator's HTTP client: a bearer token; a down server is an answer too."""

    def __init__(self, base: str, token: str) -> None:
        self.base, self.token = base, token

    def call(
        self, method: str, path: str, body: Any = None, timeout: float = 15
    ) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.base + path, data=data, method=method,
            headers={"Authorization": f"Bearer {self.token}",
                     "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                raw = answer.read()
                return answer.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                return exc.code, json.loads(raw) if raw else None
            except ValueError:
                return exc.code, raw.decode(errors="replace")
        except (OSError, urllib.error.URLError):
            return 0, None  # the web server is down (killed, restarting)


class FeedClient(threading.Thread):
    """Follows one session's feed; drops and reconnects with its last seq now and then.
    Every commit frame is recorded, so duplicates and gaps show."""

    def __init__(self, soak: Soak, session_id: str, seed: int) -> None:
        super().__init__(daemon=True, name=f"feed-{session_id}")
        self.soak, self.session_id = soak, session_id
        self.random = random.Random(seed)
        self.seen: list[int] = []
        self.reconnects = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            last = self.seen[-1] if self.seen else 0
            url = f"{self.soak.web.ws}/ws/sessions/{self.session_id}/feed/"
            hold = self.random.uniform(1, 8)
            try:
                with connect(url, open_timeout=5, close_timeout=1) as ws:
                    ws.send(json.dumps({"token": self.soak.token, "after": last}))
                    until = time.monotonic() + hold
                    while not self.stop.is_set() and (
                        self.soak.settling or time.monotonic() < until
                    ):
                        try:
                            frame = json.loads(ws.recv(timeout=1))
                        except TimeoutError:
                            continue
                        commits = frame.get("commits", [frame] if frame.get("type") == "commit"
                                            else [])
                        self.seen.extend(int(c["seq"]) for c in commits)
            except (OSError, WebSocketException, TimeoutError, ValueError):
                time.sleep(0.5)
            self.reconnects += 1


@dataclass
class Soak:
    seed: int
    seconds: float
    tmp: Path
    stack: PrivateStack
    smtp: SmtpStandIn
    model: ModelStandIn
    enabled: frozenset[str] = frozenset()
    web: Daphne = field(init=False)
    workers: list[CeleryWorker] = field(default_factory=list)
    threads_worker: CeleryWorker = field(init=False)
    beat: Process = field(init=False)
    token: str = ""
    settling: bool = False
    report: Report = field(init=False)
    sessions: list[tuple[str, str]] = field(default_factory=list)  # agent (session, conv)
    tool_sessions: list[tuple[str, str]] = field(default_factory=list)  # remote-model turns
    # Turns whose tools return values Postgres refuses: never a cancel's target, so that a
    # task those values wedge stays wedged for the checks to see.
    value_sessions: list[tuple[str, str]] = field(default_factory=list)
    batches: list[tuple[str, str, str]] = field(default_factory=list)  # session, task, chan
    submissions: list[str] = field(default_factory=list)
    feeds: list[FeedClient] = field(default_factory=list)
    names: Iterator[int] = field(default_factory=itertools.count)
    batch_queue: queue.Queue[Any] = field(default_factory=lambda: queue.Queue(maxsize=1))
    # The batches a resolve starts to have sends to resolve: a starter of their own, so that
    # they never wait behind the other batches' start-ups on a loaded machine.
    uncertain_queue: queue.Queue[Any] = field(default_factory=lambda: queue.Queue(maxsize=1))
    cancels: list[tuple[str, str]] = field(default_factory=list)  # task, its status then
    retried: set[str] = field(default_factory=set)  # tasks an operator retried since
    concurrent: list[tuple[str, list[int]]] = field(default_factory=list)  # task, answers
    bulk_log: list[dict[str, Any]] = field(default_factory=list)
    clock_offsets: dict[str, float] = field(default_factory=dict)
    stopped: CeleryWorker | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    # When a fault could cut a phase short: (from, to, the worker's pid, or None for all).
    cuts: list[tuple[float, float, int | None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.report = Report(self.seed, self.seconds, self.enabled)
        self.random = random.Random(self.seed)
        self.fault_random = random.Random(self.seed + 1)
        env = {**self.stack.env, "SMTP_HOST": "127.0.0.1", "SMTP_PORT": str(self.smtp.port),
               "EMAIL_PROVIDER_TIMEOUT": "5", **models_env(self.model.url, timeout=10),
               "ASSISTANT_TOOL_MODULES": "tests.soak.tools",
               "KERNEL_TASK_MODULES": "tests.soak.tools.register",
               "AGENT_TOOL_DIR": str(self.tmp)}
        self.stack.env = env
        self.web = Daphne(self.tmp / "web.log", env)
        self.web.start()
        self.stack.processes.append(self.web)
        for n in (1, 2):
            self.workers.append(self.stack.worker(f"w{n}", **self.worker_env(f"w{n}")))
        self.threads_worker = self.start_threads_worker("t1")
        self.workers.append(self.threads_worker)
        for worker in self.workers:
            worker.append = True  # a respawn keeps what the killed process logged
        self.beat = self.stack.beat()
        self.stack.manage(
            "shell", "-c",
            "from django.contrib.auth.models import User, Group; "
            "u = User.objects.create_user('soak'); "
            "u.groups.add(Group.objects.get_or_create(name='operator')[0])",
        )
        self.token = self.stack.manage("api_token", "soak").strip()
        self.api = Api(self.web.http, self.token)

    def worker_env(self, name: str) -> dict[str, str]:
        """A worker's own: its database connections named (``application_name``, so one
        can be found and terminated), and its clock-step hook and file."""
        clock = self.tmp / f"clock-{name}"
        clock.write_text("0\n")
        self.clock_offsets[name] = 0.0
        path = os.pathsep.join(p for p in [str(CLOCK_HOOK), str(ROOT),
                                           self.stack.env.get("PYTHONPATH", "")] if p)
        return {"PGAPPNAME": f"soak-{name}", "PYTHONPATH": path, "SOAK_CLOCK_FILE": str(clock)}

    def start_threads_worker(self, name: str) -> CeleryWorker:
        """A ``-P threads -c 4`` worker (as the compose file runs the hands pool): several
        leases in one process, its heartbeat and listener threads beside them."""
        worker = celery_worker(self.tmp, name, {**self.stack.env, **self.worker_env(name)},
                               queues=QUEUES, host="chaos")
        at = worker.command.index("-P")
        worker.command[at:at + 2] = ["-P", "threads", "-c", "4"]
        self.stack.processes.append(worker.spawn())
        worker.wait_ready(timeout=60)
        return worker

    # -- the driver ---------------------------------------------------------------------

    def name(self, prefix: str) -> str:
        return f"{prefix}-{self.seed}-{next(self.names)}"

    def act(self, kind: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        status, answer = self.api.call(method, path, body)
        with self.lock:
            self.report.actions[f"{kind}:{status}"] += 1
        return status, answer

    def drive(self) -> None:
        operations = [
            (self.batch, 3), (self.agent, 4), (self.tool_turn, 4), (self.cancel, 4),
            (self.resolve, 2), (self.resubmit, 1), (self.bulk, 2), (self.wake, 1),
            (self.retry, 1),
        ]
        choices, weights = zip(*operations, strict=True)
        end = time.monotonic() + self.seconds
        while time.monotonic() < end:
            operation = self.random.choices(choices, weights)[0]
            self.report.operations[operation.__name__] += 1
            operation()
            time.sleep(self.random.uniform(0.05, 0.4))

    def batch(self) -> None:
        """Queue a batch for the starter thread: one ``manage.py`` at a time (each is a
        Django start-up; a crowd of them would starve the stack on two cores)."""
        if self.batch_queue.full():
            self.report.actions["batch:skipped, one is starting"] += 1
            return
        channel = self.random.choice(["http", "http", "smtp"])
        tag = self.name("b")
        count = self.random.randint(1, 4)
        self.batch_queue.put((channel, [f"{tag}-{i}@example.com" for i in range(count)]))

    def start_batches(self, starting: queue.Queue[Any]) -> None:
        while True:
            item = starting.get()
            if item is None:
                return
            self.start_batch(*item)

    def start_batch(self, channel: str, recipients: list[str]) -> str | None:
        try:
            done = subprocess.run(
                [sys.executable, "manage.py", "send_notices", *recipients, "--channel",
                 channel, "--actor", "user:soak"],
                cwd=ROOT, env=self.stack.env, capture_output=True, text=True, timeout=60,
            )
        except subprocess.TimeoutExpired:
            self.report.actions["batch:timeout"] += 1
            return None
        if done.returncode != 0:
            self.report.actions["batch:refused"] += 1  # Postgres down, say
            return None
        fields = dict(line.split(" ", 1) for line in done.stdout.split("\n") if " " in line)
        self.batches.append((fields["session"], fields["task"], channel))
        self.report.actions["batch:started"] += 1
        return fields["task"]

    def new_conversation(self, into: list[tuple[str, str]]) -> tuple[str, str] | None:
        status, session = self.act("session", "POST", "/api/sessions", {})
        if status != 201:
            return None
        status, conv = self.act(
            "conversation", "POST", f"/api/sessions/{session['id']}/conversations", {}
        )
        if status != 201:
            return None
        into.append((session["id"], conv["id"]))
        if len(self.feeds) < WEBSOCKET_CLIENTS:
            feed = FeedClient(self, session["id"], self.random.randrange(1 << 30))
            self.feeds.append(feed)
            feed.start()
        return session["id"], conv["id"]

    def conversation(self) -> tuple[str, str] | None:
        if (len(self.sessions) < 4 or self.random.random() < 0.05) and (
            self.new_conversation(self.sessions) is None
        ):
            return None
        return self.random.choice(self.sessions)

    def agent(self) -> None:
        picked = self.conversation()
        if picked is None:
            return
        session_id, conversation = picked
        tag = self.name("a")
        text = (f"Send the notice to {tag}@example.com" if self.random.random() < 0.5
                else f"Hello ({tag})")
        when_busy = self.random.choice(["steer", "follow_up", "reject"])
        status, answer = self.act(
            f"submit-{when_busy}", "POST", f"/api/sessions/{session_id}/submissions",
            {"conversation_id": conversation, "request_id": tag, "input": {"text": text},
             "when_busy": when_busy},
        )
        if status in (200, 201):
            self.submissions.append(answer["id"])

    def tool_call(self) -> tuple[str, str]:
        """Which soak tool the next tool turn calls, and how: mostly work that runs for a
        few seconds (something to cancel while it runs) and jobs that fail (failures that
        keep arriving); with ``values`` on, results Postgres refuses too."""
        if "values" in self.enabled and self.random.random() < 0.3:
            return self.random.choice([("soak_work", "nul"), ("soak_job", "nul"),
                                       ("soak_job", "datetime"), ("soak_stamp", "datetime")])
        return self.random.choice([("soak_work", "ok"), ("soak_work", "ok"), ("soak_job", "ok"),
                                   ("soak_job", "fail"), ("soak_job", "fail"),
                                   ("soak_stamp", "ok")])

    def tool_turn(
        self, call: tuple[str, str] | None = None, seconds: float | None = None,
        session: tuple[str, str] | None = None,
    ) -> None:
        """A submission to the remote model, which calls one soak tool and then answers."""
        tool, mode = call or self.tool_call()
        if mode in tools.VALUE_MODES:  # a conversation of its own: a wedged turn blocks it
            session = self.new_conversation(self.value_sessions)
            if session is None:
                return
        elif len(self.tool_sessions) < TOOL_SESSIONS:
            self.new_conversation(self.tool_sessions)
        if session is None and not self.tool_sessions:
            return
        session_id, conversation = session or self.random.choice(self.tool_sessions)
        tag = self.name("u")
        hold = self.random.uniform(1.0, 6.0) if seconds is None else seconds
        status, answer = self.act(
            "tool-turn", "POST", f"/api/sessions/{session_id}/submissions",
            {"conversation_id": conversation, "request_id": tag, "when_busy": "follow_up",
             "input": {"text": model.tool_text(tag, tool, mode, hold), "model": "remote"}},
        )
        if status in (200, 201):
            self.submissions.append(answer["id"])
            self.report.checked[f"tool calls asked: {tool} {mode}"] += 1

    def targets(self, found: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """What an operator action may aim at: not the value-fault sessions' tasks."""
        spared = {session_id for session_id, _ in self.value_sessions}
        return [t for t in found if t["session_id"] not in spared]

    def running_now(self) -> list[dict[str, Any]]:
        """Tasks whose phase runs right now: status running, a lease that has not ended."""
        code, found = self.act("find", "GET", "/api/tasks?status=running&limit=100")
        if code != 200:
            return []
        now = datetime.now().astimezone()
        return [t for t in self.targets(found) if t["lease_until"] is not None
                and datetime.fromisoformat(t["lease_until"]) > now]

    def cancel(self) -> None:
        """Aim at work that runs now (a soak tool or job holding its phase, a send in
        flight, a turn); now and then at a waiting, sleeping or pending task instead."""
        found = [] if self.random.random() < 0.15 else self.running_now()
        if not found:
            for status in ("waiting", "sleeping", "pending"):
                code, tasks = self.act("find", "GET", f"/api/tasks?status={status}&limit=20")
                if code != 200:  # an error's body (a 503 while Postgres restarts) is no list
                    continue
                found += [t for t in self.targets(tasks) if not (
                    status == "waiting" and (t.get("wait") or {}).get("signal"))]
        if not found:
            return
        task = self.random.choice(sorted(found, key=lambda t: t["id"]))
        code, answer = self.act(f"cancel-{task['status']}", "POST",
                                f"/api/tasks/{task['id']}/cancel",
                                {"action_id": self.name("c"), "reason": "soak cancel",
                                 "expected_run": task["run"]})
        if code == 200 and not answer.get("replayed"):
            self.cancels.append((task["id"], task["status"]))

    def smtp_operations(self) -> Counter[str]:
        """Messages at the SMTP server by the operation id their header carries."""
        found: Counter[str] = Counter()
        for message in self.smtp.messages():
            for line in message.data.decode(errors="replace").splitlines():
                if line.lower().startswith("x-operation-id:"):
                    found[line.split(":", 1)[1].strip()] += 1
        return found

    def smtp_holds(self, operation_id: str) -> bool:
        return self.smtp_operations()[operation_id] > 0

    def decision_for(self, task: dict[str, Any]) -> str:
        """What an operator who reads the SMTP server's log decides."""
        if self.smtp_holds(task["input"]["operation_id"]):
            return "sent"
        return self.random.choice(["not_sent_send_again", "give_up"])

    def resolve(self) -> None:
        code, found = self.act("find", "GET", "/api/tasks?waiting_for_resolution=true&limit=20")
        found = [t for t in found or [] if code == 200 and t["kind"] == "send-notice"]
        if len(found) < UNCERTAIN_PER_BATCH:
            # Too few sends wait for an operator: start an SMTP batch whose every send is
            # uncertain (the connection dropped after DATA), so the next resolves have some.
            # One rule for all such batches, armed again each time (the SMTP fault armed
            # meanwhile replaces it): a batch still starting when the next is asked for
            # keeps its drops.
            self.smtp.drop_after_data(to_prefix=f"{UNSURE}-{self.seed}-")
            if not self.uncertain_queue.full():
                tag = self.name(UNSURE)
                self.report.faults["smtp drop after DATA (to be resolved)"] += 1
                self.uncertain_queue.put(
                    ("smtp", [f"{tag}-{i}@example.com" for i in range(UNCERTAIN_PER_BATCH)]))
        if not found:
            return
        task = self.random.choice(found)
        body = {"decision": self.decision_for(task), "reason": "soak decides", **step_of(task)}
        shape = self.random.choice(["once", "twice-at-once", "stale"])
        path = f"/api/tasks/{task['id']}/resolve"
        if shape == "twice-at-once":
            answers: list[int] = []
            threads = [
                threading.Thread(target=lambda: answers.append(self.act(
                    "resolve-concurrent", "POST", path, {**body, "action_id": self.name("r")})[0]))
                for _ in range(2)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            self.concurrent.append((task["id"], sorted(answers)))
            if 200 in answers:
                self.report.landed["resolutions landed"] += 1
                self.report.landed["resolutions landed: concurrent pair"] += 1
            return
        first, _ = self.act("resolve" if shape == "once" else "resolve-stale-first", "POST",
                            path, {**body, "action_id": self.name("r")})
        if first == 200:
            self.report.landed["resolutions landed"] += 1
            self.report.landed[f"resolutions landed: {shape}"] += 1
        if shape == "stale":
            second, _ = self.act("resolve-stale-second", "POST", path,
                                 {**body, "action_id": self.name("r")})
            if first == 200 and second == 409:
                self.report.landed["stale resolutions refused (409)"] += 1

    def resubmit(self) -> None:
        if not self.submissions:
            return
        submission = self.random.choice(self.submissions)
        code, found = self.act("find", "GET", f"/api/submissions/{submission}")
        if code != 200 or found["status"] not in ("cancelled", "failed", "unanswered"):
            return
        code, answer = self.act("resubmit", "POST", f"/api/submissions/{submission}/resubmit",
                                {"action_id": self.name("s"), "reason": "soak resubmit",
                                 "expected_seq": found["updated_seq"]})

    def one_task(self, query: str) -> dict[str, Any] | None:
        code, found = self.act("find", "GET", f"/api/tasks?{query}&limit=20")
        found = self.targets(found) if code == 200 else []
        if not found:
            return None
        return self.random.choice(sorted(found, key=lambda t: t["id"]))

    def wake(self) -> None:
        """An operator wakes a sleeping task early (a batch's notice in its backoff)."""
        task = self.one_task("status=sleeping")
        if task is not None:
            self.act("wake", "POST", f"/api/tasks/{task['id']}/wake",
                     {"action_id": self.name("w"), "reason": "soak wakes",
                      "expected_seq": task["updated_seq"]})

    def retry(self) -> None:
        """An operator retries one failed or cancelled task (the bulk form covers many)."""
        task = self.one_task(f"outcome={self.random.choice(['failed', 'cancelled'])}")
        if task is not None:
            status, _ = self.act(f"retry-{task['kind']}", "POST",
                                 f"/api/tasks/{task['id']}/retry",
                                 {"action_id": self.name("t"), "reason": "soak retries",
                                  "expected_seq": task["updated_seq"]})
            if status == 200:
                self.retried.add(task["id"])

    def bulk(self) -> None:
        """A bulk retry of failed jobs or notices, or a bulk cancel of running jobs, while
        new failures arrive: preview, a pause in which more may fail or end, then the
        action with the count the preview showed; now and then the same request again."""
        if not self.tool_sessions:
            self.new_conversation(self.tool_sessions)
        if not self.tool_sessions:
            return
        session = self.random.choice(self.tool_sessions)  # never a value-fault session
        criteria = {"action": "cancel", "kind": tools.JOB_KIND, "status": "running",
                    "session_id": session[0]}
        if self.random.random() < 0.65:
            criteria = {"action": "retry", "outcome": "failed", "kind": tools.JOB_KIND,
                        "session_id": session[0]}
            if self.random.random() < 0.3:
                criteria = {"action": "retry", "outcome": "failed", "kind": "send-notice"}
        what = f"bulk-{criteria['action']}"
        code, preview = self.act(f"{what}-preview", "POST", "/api/actions/bulk/preview", criteria)
        if code != 200:
            return
        self.tool_turn(("soak_job", "fail"), seconds=0.2, session=session)  # a new failure
        time.sleep(self.random.uniform(0.0, 1.5))
        body = {**criteria, "expected_count": preview["count"],
                "expected_digest": preview["digest"], "action_id": self.name("k"),
                "reason": f"soak {what}"}
        code, answer = self.act(what, "POST", "/api/actions/bulk", body)
        entry = {"criteria": criteria, "preview": preview.get("task_ids", []), "code": code,
                 "answer": answer, "again": None}
        if code == 200 and self.random.random() < 0.3:
            entry["again"] = self.act(f"{what}-again", "POST", "/api/actions/bulk", body)
        self.bulk_log.append(entry)
        if code != 200:
            return
        done = [r["task_id"] for r in answer.get("results", []) if r.get("ok")]
        self.report.landed[f"{what}: tasks acted on"] += len(done)
        if criteria["action"] == "retry":
            self.retried.update(done)
        else:
            self.cancels.extend((task_id, "running (bulk)") for task_id in done)

    # -- the faults ---------------------------------------------------------------------

    def inject(self, stop: threading.Event) -> None:
        faults = [
            (self.kill_worker, 10), (self.stop_worker, 4), (self.kill_connection, 2),
            (self.step_clock, 2), (self.kill_beat, 1), (self.kill_web, 1),
            (self.restart_redis, 1), (self.restart_postgres, 1), (self.provider_fault, 2),
            (self.smtp_fault, 1),
        ]
        choices, weights = zip(*faults, strict=True)
        # Every fault's time and what it hit, so that a violation can be set beside the
        # faults around it (the report counts them; this says when).
        timeline = self.tmp / "soak-faults"
        while not stop.wait(self.fault_random.uniform(2.0, 6.0)):
            fault = self.fault_random.choices(choices, weights)[0]
            began = time.time()
            try:
                fault()
                done = "ok"
            except Exception as exc:  # a fault that could not be injected is reported
                self.report.faults[f"{fault.__name__}:error:{type(exc).__name__}"] += 1
                done = type(exc).__name__
            with timeline.open("a") as out:
                out.write(f"{began:.3f} {time.time():.3f} {fault.__name__} {done} "
                          f"clocks={dict(self.clock_offsets)}\n")

    def watch_threads_worker(self, stop: threading.Event) -> None:
        """Sample, every second, whether the threads-pool worker is up and consuming; if
        it ended by itself (nothing here kills it), count it and start it again, as the
        compose file's ``restart: unless-stopped`` would. (Celery's threads pool exits
        with "Unrecoverable error" when a Redis restart catches it restoring unacked
        messages, ``kombu`` 5.7.0.)"""
        worker = self.threads_worker
        while not stop.wait(1.0):
            self.report.faults["threads worker samples"] += 1
            if worker.alive and worker.ready():
                self.report.faults["threads worker samples: up"] += 1
            elif not worker.alive:
                self.cuts.append((time.time(), time.time(), worker.pid))
                self.report.faults["threads worker exited by itself (restarted)"] += 1
                self.report.checked[f"threads worker exit codes: {worker.popen.returncode}"] += 1
                worker.spawn()

    def kill_worker(self) -> None:
        """SIGKILL a solo worker: the threads-pool one stays up throughout (its start-up
        takes 10-15 s on a busy machine); it is stopped, cut off and stepped instead."""
        worker = self.fault_random.choice(
            [w for w in self.workers if w is not self.threads_worker])
        self.cuts.append((time.time(), time.time(), worker.pid))
        worker.kill()
        self.report.faults["worker SIGKILL"] += 1
        worker.spawn()  # the replacement's resume sweep and the beat recover its leases

    def leases(self) -> tuple[dict[str, list[datetime]], datetime] | None:
        """The live leases by owner (``host:pid``), and the database's time now."""
        rows = self._query(
            "SELECT lease_owner, lease_until, clock_timestamp() AS now FROM kernel_task "
            "WHERE lease_owner IS NOT NULL AND lease_until > clock_timestamp()", None)
        if rows is None:
            return None
        held: dict[str, list[datetime]] = defaultdict(list)
        for row in rows:
            if row:
                held[row["lease_owner"]].append(row["lease_until"])
        now = next((r["now"] for r in rows if r), None)
        return held, now or datetime.now().astimezone()

    def stop_worker(self) -> None:
        """SIGSTOP a worker that holds a lease (waiting up to 3 s for one to), until its
        leases have ended, plus 1-3 s; then SIGCONT it: a paused VM, a long GC."""
        deadline = time.monotonic() + 3
        while True:
            found = self.leases()
            alive = [w for w in self.workers if w.alive]
            holding = [w for w in alive if found and w.lease_owner in found[0]]
            if holding or time.monotonic() > deadline or not alive:
                break
            time.sleep(0.2)
        if not alive:
            return
        worker = self.fault_random.choice(holding or alive)
        ends = found[0].get(worker.lease_owner, []) if found else []
        pause = self.fault_random.uniform(1.0, 3.0)
        if ends and found:
            pause += max(0.0, (max(ends) - found[1]).total_seconds())
        pause = min(pause, STOP_LIMIT)
        worker.suspend()
        self.stopped = worker
        began = time.time()
        try:
            time.sleep(pause)
        finally:
            worker.resume()
            self.stopped = None
            self.cuts.append((began, time.time(), worker.pid))
        past = ends and found and (max(ends) - found[1]).total_seconds() < pause
        self.report.faults["worker SIGSTOP past a lease" if past
                           else "worker SIGSTOP (held no lease)"] += 1
        if past and worker is self.threads_worker:
            self.report.faults["worker SIGSTOP past a lease: the threads pool"] += 1

    def kill_connection(self) -> None:
        """Terminate one database connection of one worker (``pg_terminate_backend``),
        found by the application name the worker's connections carry. The worker is chosen
        among those that have one: a worker just started again (after a kill) has not
        connected yet, and choosing it would make the fault a no-op."""
        rows = self._query(
            "SELECT pid, state, application_name FROM pg_stat_activity "
            "WHERE left(application_name, 5) = 'soak-' ORDER BY pid", [])
        connected = {w.name: w for w in self.workers if w.alive}
        by_worker: dict[str, list[dict[str, Any]]] = {}
        for row in rows or []:
            name = str(row.get("application_name", "")).removeprefix("soak-")
            if name in connected:
                by_worker.setdefault(name, []).append(row)
        if not by_worker:
            self.report.faults["connection kill: no backend found"] += 1
            return
        worker = connected[self.fault_random.choice(sorted(by_worker))]
        backends = by_worker[worker.name]
        busy = [b for b in backends if b["state"] != "idle"]
        backend = self.fault_random.choice(
            busy if busy and self.fault_random.random() < 0.5 else backends)
        done = self._query("SELECT pg_terminate_backend(%s) AS done", [backend["pid"]])
        if done and done[0].get("done"):
            self.cuts.append((time.time(), time.time(), worker.pid))
            self.report.faults["connection kill"] += 1
            self.report.faults[f"connection kill: {backend['state']}"] += 1

    def step_clock(self) -> None:
        """Step one worker's wall clock by 2-8 s either way (kept within 10 s of true):
        what its kernel's clock reads until its database clock measures again."""
        worker = self.fault_random.choice(self.workers)
        step = self.fault_random.choice([-1, 1]) * self.fault_random.uniform(2.0, 8.0)
        offset = max(-CLOCK_STEP_LIMIT, min(CLOCK_STEP_LIMIT,
                                            self.clock_offsets[worker.name] + step))
        self.set_clock(worker.name, offset)
        self.report.faults["clock step"] += 1
        self.report.faults["clock step " + ("forward" if step > 0 else "back")] += 1

    def set_clock(self, name: str, offset: float) -> None:
        clock = self.tmp / f"clock-{name}"
        staged = clock.with_suffix(".new")
        staged.write_text(f"{offset:.3f}\n")
        staged.replace(clock)  # never read half-written
        self.clock_offsets[name] = offset

    def kill_beat(self) -> None:
        self.beat.kill()
        self.beat.spawn()
        self.report.faults["beat SIGKILL"] += 1

    def kill_web(self) -> None:
        self.web.kill()
        self.web.spawn()  # back on the same port once it has started
        self.report.faults["web SIGKILL"] += 1

    def restart_redis(self) -> None:
        self.stack.broker.restart()
        self.report.faults["Redis restart"] += 1

    def restart_postgres(self) -> None:
        began = time.time()
        self.stack.postgres.restart(self.fault_random.choice(["fast", "immediate"]))
        self.cuts.append((began, time.time(), None))
        self.report.faults["Postgres restart"] += 1

    def provider_fault(self) -> None:
        nth = self.fault_random.randint(1, 4)
        if self.fault_random.random() < 0.5:
            self.stack.admin.set_faults(
                stall={"nth": nth, "ms": self.fault_random.randint(1000, 8000), "times": 1})
        else:
            self.stack.admin.set_faults(drop_after_accept={"nth": nth, "times": 1})
        self.report.faults["provider stall or dropped answer"] += 1

    def smtp_fault(self) -> None:
        self.smtp.drop_after_data(nth=self.fault_random.randint(1, 3))
        self.report.faults["SMTP drop after DATA"] += 1

    # -- settling and the checks ----------------------------------------------------------

    def heal(self) -> None:
        """Faults have stopped: every process up and running, clocks true, knobs cleared."""
        self.settling = True
        with suppress(Exception):
            self.stack.admin.set_faults()
        self.smtp.clear_faults()
        if self.stopped is not None:
            self.stopped.resume()
        for name in self.clock_offsets:
            self.set_clock(name, 0.0)
        for process in [*self.workers, self.beat]:
            if not process.alive:
                process.spawn()
        if not self.web.alive:
            self.web.spawn()
        for process in [*self.workers, self.beat, self.web]:
            process.wait_ready(timeout=120)

    def query(self, sql: str, params: Any = None) -> list[dict[str, Any]]:
        return wait_for(lambda: self._query(sql, params), "Postgres to answer", timeout=60)

    def _query(self, sql: str, params: Any) -> list[dict[str, Any]] | None:
        try:
            return self.stack.query(sql, params) or [{}]
        except psycopg.OperationalError:
            return None

    def unsettled(self) -> list[dict[str, Any]]:
        rows = self.query(
            "SELECT id, kind, status, phase, wait, wake_at, lease_until FROM kernel_task "
            "WHERE status <> 'terminal' AND NOT (status = 'waiting' AND wait ? 'signal')"
        )
        return [r for r in rows if r]

    def settle(self, seconds: float = SETTLE_SECONDS) -> bool:
        """Wait until nothing moves; decide what waits for an operator, as one would."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            waiting = self.api.call("GET", "/api/tasks?waiting_for_resolution=true&limit=200")[1]
            for task in waiting or []:
                if task["kind"] == "send-notice":
                    self.act("resolve-settle", "POST", f"/api/tasks/{task['id']}/resolve",
                             {"decision": self.decision_for(task), "reason": "soak settles",
                              "action_id": self.name("z"), **step_of(task)})
            if not self.unsettled() and not waiting:
                return True
            time.sleep(2)
        return False

    def burst(self) -> None:
        """After settling, fresh work through every queue: a batch of HTTP notices
        (default), and tool turns (brain, hands) whose jobs run on default: the checks
        want it all ended, so a queue whose claims find only dead rows shows."""
        self.start_batch("http", [f"{self.name('p')}-{i}@example.com" for i in range(8)])
        for _ in range(TOOL_SESSIONS):
            self.tool_turn(("soak_job", "ok"), seconds=0.0)
            self.tool_turn(("soak_work", "ok"), seconds=0.0)
        if not self.settle(DRAIN_SECONDS):
            self.report.checked["burst after settling: not done in time"] += 1

    def check(self) -> None:
        self.check_answers()
        self.check_tasks()
        self.check_queues()
        self.check_leases()
        if "orphans" in self.enabled:
            self.check_dispatch()
        self.check_emails()
        self.check_conversations()
        self.check_submissions()
        self.check_tool_runs()
        if "values" in self.enabled:
            self.check_values()
        self.check_cancels()
        self.check_resolutions()
        if "bulk-set" in self.enabled:
            self.check_bulk()
        self.check_targets()
        self.check_seqs_and_feeds()

    def check_queues(self) -> None:
        """Every queue drains: no runnable task left, no message left in its list."""
        def drained() -> list[dict[str, Any]] | None:
            code, found = self.api.call("GET", "/api/queues")
            if code != 200:
                return None
            return found if all(q["runnable"] == 0 and not q["blocked"] and not q["broker"]
                                for q in found) else None

        # What the wait saw drained is the answer: read again, beat's next sweep message
        # may sit in a list for a moment. Only a wait that ran out reads what is left.
        try:
            rows = wait_for(drained, "every queue to drain", timeout=30, every=1)
        except TimeoutError:
            code, found = self.get("/api/queues")
            rows = found if code == 200 else []
        for row in rows:
            self.report.checked["queues"] += 1
            if row["runnable"] or row["blocked"] or row["broker"]:
                self.report.violation(
                    f"queue {row['queue']} did not drain: {row['runnable']} runnable tasks "
                    f"(the oldest since {row['oldest']}), {row['blocked']} blocked, "
                    f"{row['broker']} messages in Redis")

    def check_leases(self) -> None:
        """No lease held by a process that holds no phase: once nothing moves, a lease
        still held (and renewed) means a holder that will never commit it."""
        sql = ("SELECT id, kind, status, phase, updated_seq, lease_owner, lease_until "
               "FROM kernel_task WHERE lease_owner IS NOT NULL ORDER BY id")
        first = {r["id"]: r for r in self.query(sql) if r}
        if not first:
            return
        time.sleep(4)  # longer than a heartbeat: a holder that is alive renews meanwhile
        later = {r["id"]: r for r in self.query(sql) if r}
        registry = {r["id"]: r for r in self.query(
            "SELECT id, name, in_flight, last_heartbeat FROM controlplane_worker") if r}
        by_owner = {w.lease_owner: w for w in self.workers if w.alive}
        for task_id, row in first.items():
            now = later.get(task_id)
            if now is None or now["updated_seq"] != row["updated_seq"]:
                continue  # it moved: someone holds a phase of it
            worker = registry.get(row["lease_owner"]) or {}
            renewed = now["lease_until"] != row["lease_until"]
            self.report.violation(
                f"task {task_id} ({row['kind']}, {row['status']} in {row['phase']}) is leased "
                f"to {row['lease_owner']} ({worker.get('name', 'no registry row')}, "
                f"{'alive' if row['lease_owner'] in by_owner else 'not a live worker'}, "
                f"{worker.get('in_flight', '?')} messages in flight), lease "
                + (f"renewed from {row['lease_until']} to {now['lease_until']}" if renewed
                   else f"until {row['lease_until']}")
                + " while nothing committed: no phase holds it")

    def check_dispatch(self) -> None:
        """No dispatch row for a task that ended (or is gone): such a row never goes."""
        rows = [r for r in self.query(
            "SELECT d.id, d.task_id, d.queue, d.woken, d.delivered_at, t.status, t.kind "
            "FROM kernel_dispatch d LEFT JOIN kernel_task t ON t.id = d.task_id "
            "WHERE t.id IS NULL OR t.status = 'terminal' ORDER BY d.id") if r]
        self.report.checked["dispatch rows of ended tasks"] = len(rows)
        for row in rows[:20]:
            self.report.violation(
                f"dispatch row {row['id']} ({row['queue']}, woken {row['woken']}) outlives "
                f"task {row['task_id']} ({row['kind'] or 'gone'}, {row['status'] or 'no row'})")
        if len(rows) > 20:
            self.report.violation(f"... {len(rows) - 20} more dispatch rows of ended tasks")

    def tool_runs(self) -> Counter[tuple[str, str] | str]:
        """How often each soak tool's function started, by (tool, task) and by task."""
        runs = self.tmp / "soak-runs"
        lines = runs.read_text().splitlines() if runs.exists() else []
        started: Counter[tuple[str, str] | str] = Counter()
        for tool, task_id, _pid, what, *_at in (line.split() for line in lines):
            if what == "started":
                started[tool, task_id] += 1
                started[task_id] += 1
        return started

    def cut_short(self, task_id: str) -> bool:
        """Whether a fault (:attr:`cuts`) met a run of ``task_id``'s tool: its worker was
        killed, paused or cut off, or Postgres restarted, between the tool's start and a
        moment after it returned (its result's commit), or it never returned."""
        runs = self.tmp / "soak-runs"
        lines = runs.read_text().splitlines() if runs.exists() else []
        windows: dict[int, list[float]] = defaultdict(list)
        for _tool, task, pid, _what, *at in (line.split() for line in lines):
            if task == task_id and at:
                windows[int(pid)].append(float(at[0]))
        for pid, marks in windows.items():
            began = min(marks)
            ended = max(marks) + COMMIT_GRACE if len(marks) > 1 else float("inf")
            if any(start <= ended and end >= began and who in (None, pid)
                   for start, end, who in self.cuts):
                return True
        return False

    def check_tool_runs(self) -> None:
        """An unsafe tool runs at most once per call, whatever was killed or stopped."""
        started = {k: v for k, v in self.tool_runs().items() if isinstance(k, tuple)}
        self.report.checked["soak tool runs"] = sum(started.values())
        for (tool, task_id), count in sorted(started.items()):
            if tool in tools.UNSAFE_TOOLS and count > 1:
                self.report.violation(f"unsafe tool {tool} ran {count} times for task {task_id}")

    def check_values(self) -> None:
        """Results Postgres refuses end their own task failed, with an error that names
        the record and the field (one of :data:`VALUE_FIELDS`), not a restart limit; no
        other task records such an error as its own. (A tool task whose job was refused
        succeeds: its result tells the model the job failed.)"""
        rows = [r for r in self.query(
            "SELECT id, kind, status, outcome, input, parent_id FROM kernel_task") if r]
        carriers: set[str] = set()  # tasks whose own result holds the value
        callers: set[str] = set()  # tool tasks that spawned such a job
        for row in rows:
            if row["kind"] == tools.JOB_KIND and (row["input"] or {}).get("mode") in \
                    tools.VALUE_MODES:
                carriers.add(row["id"])
            elif row["kind"] == "agent-tool":
                call = row["input"]["call"]
                if (call.get("arguments") or {}).get("mode") not in tools.VALUE_MODES:
                    continue
                if call["name"] == "soak_job":
                    callers.add(row["id"])
                elif call["name"] in {t.name for t in tools.TOOLS}:
                    carriers.add(row["id"])
        faulty = carriers | callers
        markers = ("\\u0000", "\x00", "NUL", "datetime", "JSON serializable", "Unicode")
        for row in rows:
            outcome = row["outcome"] or {}
            error = outcome.get("error") or ""
            if row["id"] in faulty:
                self.report.checked[f"value tasks: {row['kind']} {row['status']} "
                                    f"{outcome.get('kind')}"] += 1
                if error:
                    self.report.checked[f"value task error: {error[:120]}"] += 1
                clear = any(f in error for f in VALUE_FIELDS) and "interrupted" not in error
                # Refused when the phase returns it (faulted: its commit was rejected) or
                # at the phase's own call (failed): either way at once, naming the field.
                if row["id"] in carriers and row["status"] == "terminal" and (
                    outcome.get("kind") not in ("failed", "faulted") or not clear
                ):
                    told = (outcome.get("result") or {}).get("interrupted")
                    if told and self.cut_short(row["id"]):
                        # The phase never got to hand the value to its kernel: its worker
                        # was killed, paused past its lease or cut off while the tool ran,
                        # so the next claim finds the call in flight, as the policy says.
                        self.report.checked["value tasks whose tool a fault cut short"] += 1
                        continue
                    ran = self.tool_runs().get(row["id"])
                    self.report.violation(
                        f"task {row['id']} ({row['kind']}"
                        + (f", {row['input']['call']['name']}" if row["kind"] == "agent-tool"
                           else "")
                        + f") holding a value Postgres refuses ended {outcome.get('kind')} "
                        f"({error[:120] or 'no error'})"
                        + (", its result telling the model the call was interrupted" if told
                           else "")
                        + (f", its tool ran {ran} times" if ran else "")
                        + ": not refused at once naming the record and the field")
            elif any(m in error for m in markers):
                self.report.violation(
                    f"task {row['id']} ({row['kind']}) records another task's value error: "
                    f"{error[:200]}")

    def check_cancels(self) -> None:
        """Count what the cancels did: a task answered 200 ends cancelled (with
        ``cancel-truth``, one that ended otherwise is a violation)."""
        ids = sorted({task_id for task_id, _ in self.cancels})
        outcomes = {r["id"]: r for r in self.query(
            "SELECT id, kind, outcome FROM kernel_task WHERE id = ANY(%s)", [ids]) if r}
        for task_id, status in self.cancels:
            row = outcomes.get(task_id) or {}
            kind = (row.get("outcome") or {}).get("kind")
            running = status.startswith("running")
            if kind == "cancelled":
                self.report.landed[f"cancels landed: {status}"] += 1
                if running:
                    self.report.landed["cancels of running work landed"] += 1
                continue
            if task_id in self.retried:
                self.report.landed["cancels answered 200, retried since"] += 1
                continue
            self.report.landed["cancels answered 200, ended otherwise"] += 1
            if "cancel-truth" in self.enabled:
                self.report.violation(
                    f"cancel of task {task_id} ({row.get('kind')}, {status}) answered 200; "
                    f"it ended {kind}")

    def check_resolutions(self) -> None:
        """Of two operators deciding one step at once, exactly one decision lands."""
        for task_id, answers in self.concurrent:
            if answers.count(200) > 1:
                self.report.violation(f"two concurrent resolutions of {task_id} both landed")

    def check_bulk(self) -> None:
        """A bulk action acts on the set its preview showed; the same request again
        answers what the first did."""
        for entry in self.bulk_log:
            what = f"bulk {entry['criteria']['action']} {entry['criteria']}"
            if entry["code"] == 200:
                acted = {r["task_id"] for r in entry["answer"].get("results", [])}
                outside = sorted(acted - set(entry["preview"]))
                if outside:
                    self.report.violation(
                        f"{what} acted on {outside[:5]}, which its preview did not show")
            again = entry["again"]
            if again is not None and again[0] in NO_ANSWER:
                self.report.checked["bulk repeats with no answer (web down)"] += 1
                continue
            if again is not None and (
                again[0] != entry["code"] or _unreplayed(again[1]) != _unreplayed(entry["answer"])
            ):
                self.report.violation(
                    f"{what} again under the same action id answered {again[0]}, the first "
                    f"{entry['code']}")

    def check_targets(self) -> None:
        """A full-length run must have done what it is for (:data:`TARGETS`)."""
        for name, target in self.report.targets().items():
            if not target["met"] and self.seconds >= TARGET_SECONDS:
                self.report.shortfalls.append(f"{name}: {target['got']}, want {target['want']}")

    def check_answers(self) -> None:
        """No request got a 500: while a service restarts the answer is 503 (or none)."""
        for key, count in sorted(self.report.actions.items()):
            if key.endswith(":500"):
                self.report.violation(f"{count} answers of 500 to {key.rsplit(':', 1)[0]}")

    def check_tasks(self) -> None:
        rows = [r for r in self.query("SELECT * FROM kernel_task") if r]
        self.report.checked["tasks"] = len(rows)
        for row in rows:
            if row["status"] == "terminal":
                continue
            if row["status"] == "waiting" and "signal" in (row["wait"] or {}):
                why = (row["checkpoint"] or {}).get("why")
                if not why:
                    self.report.violation(f"task {row['id']} waits for an operator, no reason")
                continue
            self.report.violation(
                f"task {row['id']} ({row['kind']}) stuck: {row['status']} in {row['phase']}, "
                f"lease until {row['lease_until']}, wake at {row['wake_at']}"
            )

    def get(self, path: str) -> tuple[int, Any]:
        """A read after the faults: the stack is up, so only a real answer will do."""
        answer: tuple[int, Any] = wait_for(
            lambda: (found := self.api.call("GET", path))[0] not in (0, 500, 502, 503)
            and found, f"GET {path} to answer", timeout=60, every=0.5)
        return answer

    def plan(self, session_id: str, batch_id: str) -> dict[str, Any] | None:
        code, doc = self.get(f"/api/sessions/{session_id}/documents/email-plan/{batch_id}")
        if code != 200:
            self.report.violation(f"plan of {batch_id}: GET answered {code} {doc}")
        return doc.get("value") if code == 200 and isinstance(doc, dict) else None

    def check_emails(self) -> None:
        held_http = self.stack.admin.messages()
        by_key = Counter(m["idempotency_key"] for m in held_http)
        for key, count in by_key.items():
            if count > 1:
                self.report.violation(f"operation {key}: {count} messages at the provider")
        smtp_ops = self.smtp_operations()
        notices = {r["input"]["operation_id"]: r for r in self.query(
            "SELECT id, status, wait, outcome, input, checkpoint FROM kernel_task "
            "WHERE kind = 'send-notice'") if r}
        planned: dict[str, dict[str, Any]] = {}
        for session_id, batch_id, _channel in list(self.batches):
            plan = self.plan(session_id, batch_id)
            for entry in (plan or {}).get("recipients", {}).values():
                planned[entry["operation_id"]] = {**entry, "channel": plan["channel"]}
        for batch in self.query(
            "SELECT id, session_id FROM kernel_task WHERE kind = 'send-batch'"
        ):
            if batch and batch["id"] not in {b for _, b, _ in self.batches}:
                plan = self.plan(batch["session_id"], batch["id"])  # started by the agent
                for entry in (plan or {}).get("recipients", {}).values():
                    planned[entry["operation_id"]] = {**entry, "channel": plan["channel"]}
        self.report.checked["emails planned"] = len(planned)
        self.report.checked["emails at the provider"] = len(held_http)
        self.report.checked["emails at the SMTP server"] = sum(smtp_ops.values())
        for op, entry in planned.items():
            at_provider = by_key[op] > 0 if entry["channel"] == "http" else smtp_ops[op] > 0
            notice = notices.get(op)
            waiting = notice is not None and notice["status"] == "waiting"
            smtp = entry["channel"] == "smtp"
            if entry.get("state") == "sent" and not at_provider:
                if smtp and entry.get("confirmed_by") not in ("send", "lookup"):
                    continue  # an operator said so (the soak's operator reads the SMTP log)
                self.report.violation(f"{op}: recorded sent, not at the {entry['channel']} server")
            if at_provider and entry.get("state") != "sent" and not waiting:
                if smtp and "may have been sent" in (entry.get("error") or ""):
                    continue  # a cancelled SMTP send whose fate nobody could know: said so
                self.report.violation(
                    f"{op}: at the {entry['channel']} server, recorded {entry.get('state')!r} "
                    f"({entry.get('error')}), notice {notice and notice['status']}"
                )
        for key in by_key:
            if key not in planned:
                self.report.violation(f"{key}: at the provider, in no plan")

    def conversations(self) -> list[tuple[str, str]]:
        rows = self.query("SELECT id, session_id FROM kernel_conversation")
        return [(r["session_id"], r["id"]) for r in rows if r and not r["id"].startswith(
            "conv_ops_")]

    def check_conversations(self) -> None:
        checked = 0
        for session_id, conversation in self.conversations():
            code, doc = self.get(
                f"/api/sessions/{session_id}/documents/agent-conversation/{conversation}")
            if code == 404:
                continue  # never used
            checked += 1
            value = (doc or {}).get("value") or {}
            if code != 200 or value.get("active") or value.get("queue"):
                self.report.violation(f"conversation {conversation} not idle: {code} {value}")
        self.report.checked["conversations"] = checked

    def check_submissions(self) -> None:
        rows = [r for r in self.query("SELECT * FROM kernel_submission") if r]
        self.report.checked["submissions"] = len(rows)
        for row in rows:
            self.report.checked[f"submissions {row['status']}"] += 1
            if row["status"] == "answered":
                continue
            if row["status"] not in ("cancelled", "failed", "unanswered") or not row["reason"]:
                self.report.violation(
                    f"submission {row['id']} is {row['status']} (reason {row['reason']!r})")
        self.report.checked["submissions refused (409)"] = sum(
            v for k, v in self.report.actions.items() if k.startswith("submit-reject:409"))

    def check_seqs_and_feeds(self) -> None:
        sessions = self.query(
            "SELECT s.id, s.head_seq, count(c.seq) AS commits, min(c.seq) AS first, "
            "max(c.seq) AS last FROM kernel_session s LEFT JOIN kernel_commit c "
            "ON c.session_id = s.id GROUP BY s.id, s.head_seq")
        heads = {}
        for row in sessions:
            if not row:
                continue
            heads[row["id"]] = row["head_seq"]
            if row["commits"] and (row["first"] != 1 or row["last"] != row["head_seq"]
                                   or row["commits"] != row["head_seq"]):
                self.report.violation(f"session {row['id']}: seqs not gapless {row}")
        self.report.checked["sessions"] = len(heads)
        for feed in self.feeds:
            head = heads.get(feed.session_id, 0)
            wait_for(lambda f=feed, h=head: len(f.seen) >= h or f.seen[-1:] == [h],
                     "a feed client to catch up", timeout=30)
        for feed in self.feeds:
            feed.stop.set()
        for feed in self.feeds:
            feed.join(timeout=5)
            head = heads.get(feed.session_id, 0)
            self.report.checked["feed clients"] += 1
            self.report.checked["feed reconnects"] += feed.reconnects
            if feed.seen != list(range(1, head + 1)):
                dupes = [s for s, n in Counter(feed.seen).items() if n > 1]
                self.report.violation(
                    f"feed client of {feed.session_id}: saw {len(feed.seen)} commits for head "
                    f"{head}; duplicates {dupes[:5]}, out of order or missing "
                    f"{sorted(set(range(1, head + 1)) - set(feed.seen))[:5]}")

    # -- the whole run ------------------------------------------------------------------------

    def run(self) -> Report:
        stop = threading.Event()
        faults = threading.Thread(target=self.inject, args=(stop,), daemon=True)
        watch = threading.Thread(target=self.watch_threads_worker, args=(stop,), daemon=True)
        starters = [threading.Thread(target=self.start_batches, args=(starting,), daemon=True)
                    for starting in (self.batch_queue, self.uncertain_queue)]
        faults.start()
        watch.start()
        for starter in starters:
            starter.start()
        try:
            self.drive()
        finally:
            stop.set()
            faults.join()
            watch.join()
            for starting, starter in zip((self.batch_queue, self.uncertain_queue), starters,
                                         strict=True):
                starting.put(None)
                starter.join()
        self.heal()
        time.sleep(2)
        self.settle()
        self.burst()
        self.check()
        return self.report


@contextmanager
def soak_stack(
    tmp: Path, template: PrivatePostgres, seed: int, seconds: float,
    enabled: frozenset[str] = frozenset(),
) -> Iterator[Soak]:
    """The soak on a copy of ``template`` (a stopped, migrated cluster)."""
    with ExitStack() as stack:
        private = stack.enter_context(private_stack(tmp, template, latency_ms=150))
        smtp = stack.enter_context(start_smtp_server())
        remote = stack.enter_context(model_stand_in(model.script))
        soak = Soak(seed, seconds, tmp, private, smtp, remote, enabled)
        try:
            yield soak
        finally:
            if soak.stopped is not None:  # never leave a stopped process behind
                soak.stopped.resume()


def _unreplayed(answer: Any) -> Any:
    """An action's answer without its ``replayed`` mark: a repeat says it is one."""
    if isinstance(answer, dict):
        return {k: _unreplayed(v) for k, v in answer.items() if k != "replayed"}
    if isinstance(answer, list):
        return [_unreplayed(v) for v in answer]
    return answer
