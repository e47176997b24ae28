"""The soak: the real stack under a seeded random mix of operator actions and faults,
then the invariants of issue 11 checked on what it left behind.

The stack (all through ``controlplane.dev``'s launchers and the chaos suite's private
services): a private Postgres and Redis, the local email provider, the SMTP stand-in,
Daphne (the API and the change feeds), two Celery workers and beat.

The driver (one thread, ``random.Random(seed)``) does, until the time is up:
email batches over HTTP and SMTP (``manage.py send_notices``, as an operator would),
agent submissions through the API (steer / follow_up / reject; text with addresses
makes the scripted model call the ``send_notices`` tool), cancels of running turns,
batches and single notices, resolutions of uncertain sends (stale ones, and two at
once), resubmits of settled submissions, bulk retries of failed notices. The fault
thread (its own ``Random(seed + 1)``) SIGKILLs workers, beat and the web server,
restarts Redis and Postgres, and arms provider stalls and dropped answers; websocket
clients follow session feeds, drop and reconnect with their last seq.

Then faults stop, every process is up, the SMTP sends still waiting for an operator
are decided (truthfully, from the SMTP server's log, as an operator would), and once
nothing moves the checks run. A seed reproduces the mix and the fault schedule (not
the timing): ``SOAK_SEED=... make soak``.
"""

from __future__ import annotations

import itertools
import json
import queue
import random
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from websockets.exceptions import WebSocketException
from websockets.sync.client import connect

from controlplane.dev.processes import ROOT, CeleryWorker, Daphne, Process, wait_for
from controlplane.dev.smtp_server import SmtpStandIn, start_smtp_server
from tests.chaos.private_services import (
    PrivatePostgres,
    PrivateStack,
    private_stack,
)

SETTLE_SECONDS = 240.0
WEBSOCKET_CLIENTS = 3
TERMINALISH = ("terminal",)


@dataclass
class Report:
    seed: int
    seconds: float
    operations: Counter[str] = field(default_factory=Counter)
    actions: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    checked: Counter[str] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)

    def violation(self, what: str) -> None:
        self.violations.append(what)

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "seconds": self.seconds,
            "operations": sum(self.operations.values()),
            "operations_by_kind": dict(sorted(self.operations.items())),
            "actions_by_answer": dict(sorted(self.actions.items())),
            "faults_by_kind": dict(sorted(self.faults.items())),
            "checked": dict(sorted(self.checked.items())),
            "violations": len(self.violations),
            "violation_list": self.violations[:50],
        }

    def markdown(self, command: str) -> str:
        data = self.to_json()
        lines = [
            f"Reproduce: `{command}`",
            "",
            f"- seed {self.seed}, {self.seconds:g} s of load and faults",
            f"- operations: {data['operations']} ("
            + ", ".join(f"{k} {v}" for k, v in data["operations_by_kind"].items()) + ")",
            "- faults: " + ", ".join(f"{k} {v}" for k, v in data["faults_by_kind"].items()),
            "- actions by answer: "
            + ", ".join(f"{k} {v}" for k, v in data["actions_by_answer"].items()),
            "- checked: " + ", ".join(f"{k} {v}" for k, v in data["checked"].items()),
            f"- **violations: {data['violations']}**",
        ]
        lines += [f"  - {v}" for v in data["violation_list"]]
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
    web: Daphne = field(init=False)
    workers: list[CeleryWorker] = field(default_factory=list)
    beat: Process = field(init=False)
    token: str = ""
    settling: bool = False
    report: Report = field(init=False)
    sessions: list[tuple[str, str]] = field(default_factory=list)  # agent (session, conv)
    batches: list[tuple[str, str, str]] = field(default_factory=list)  # session, task, chan
    submissions: list[str] = field(default_factory=list)
    feeds: list[FeedClient] = field(default_factory=list)
    names: Iterator[int] = field(default_factory=itertools.count)
    batch_queue: queue.Queue[Any] = field(default_factory=lambda: queue.Queue(maxsize=1))

    def __post_init__(self) -> None:
        self.report = Report(self.seed, self.seconds)
        self.random = random.Random(self.seed)
        self.fault_random = random.Random(self.seed + 1)
        env = {**self.stack.env, "SMTP_HOST": "127.0.0.1", "SMTP_PORT": str(self.smtp.port),
               "EMAIL_PROVIDER_TIMEOUT": "5"}
        self.stack.env = env
        self.web = Daphne(self.tmp / "web.log", env)
        self.web.start()
        self.stack.processes.append(self.web)
        for n in (1, 2):
            self.workers.append(self.stack.worker(f"w{n}"))
        self.beat = self.stack.beat()
        self.stack.manage(
            "shell", "-c",
            "from django.contrib.auth.models import User, Group; "
            "u = User.objects.create_user('soak'); "
            "u.groups.add(Group.objects.get_or_create(name='operator')[0])",
        )
        self.token = self.stack.manage("api_token", "soak").strip()
        self.api = Api(self.web.http, self.token)

    # -- the driver ---------------------------------------------------------------------

    def name(self, prefix: str) -> str:
        return f"{prefix}-{self.seed}-{next(self.names)}"

    def act(self, kind: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        status, answer = self.api.call(method, path, body)
        self.report.actions[f"{kind}:{status}"] += 1
        return status, answer

    def drive(self) -> None:
        operations = [
            (self.batch, 3), (self.agent, 5), (self.cancel, 3), (self.resolve, 2),
            (self.resubmit, 1), (self.bulk_retry, 1), (self.wake, 1), (self.retry, 1),
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
        recipients = [f"{tag}-{i}@example.com" for i in range(self.random.randint(1, 4))]
        self.batch_queue.put((channel, recipients))

    def start_batches(self) -> None:
        while True:
            item = self.batch_queue.get()
            if item is None:
                return
            channel, recipients = item
            try:
                done = subprocess.run(
                    [sys.executable, "manage.py", "send_notices", *recipients, "--channel",
                     channel, "--actor", "user:soak"],
                    cwd=ROOT, env=self.stack.env, capture_output=True, text=True, timeout=60,
                )
            except subprocess.TimeoutExpired:
                self.report.actions["batch:timeout"] += 1
                continue
            if done.returncode != 0:
                self.report.actions["batch:refused"] += 1  # Postgres down, say
                continue
            fields = dict(line.split(" ", 1) for line in done.stdout.split("\n") if " " in line)
            self.batches.append((fields["session"], fields["task"], channel))
            self.report.actions["batch:started"] += 1

    def conversation(self) -> tuple[str, str] | None:
        if len(self.sessions) < 4 or self.random.random() < 0.05:
            status, session = self.act("session", "POST", "/api/sessions", {})
            if status != 201:
                return None
            status, conv = self.act(
                "conversation", "POST", f"/api/sessions/{session['id']}/conversations", {}
            )
            if status != 201:
                return None
            self.sessions.append((session["id"], conv["id"]))
            if len(self.feeds) < WEBSOCKET_CLIENTS:
                feed = FeedClient(self, session["id"], self.random.randrange(1 << 30))
                self.feeds.append(feed)
                feed.start()
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

    def cancel(self) -> None:
        kind = self.random.choice(["agent-turn", "send-batch", "send-notice"])
        found = []
        for status in ("running", "waiting", "sleeping", "pending"):
            code, tasks = self.act("find", "GET", f"/api/tasks?kind={kind}&status={status}"
                                   "&limit=20")
            found += tasks if code == 200 else []
        if not found:
            return
        task = self.random.choice(sorted(found, key=lambda t: t["id"]))
        self.act(f"cancel-{kind}", "POST", f"/api/tasks/{task['id']}/cancel",
                 {"action_id": self.name("c"), "reason": "soak cancel"})

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
        if code != 200 or not found:
            return
        task = self.random.choice(found)
        body = {"decision": self.decision_for(task), "reason": "soak decides", **step_of(task)}
        shape = self.random.choice(["once", "twice-at-once", "stale"])
        path = f"/api/tasks/{task['id']}/resolve"
        if shape == "twice-at-once":
            threads = [
                threading.Thread(target=self.act, args=(
                    "resolve-concurrent", "POST", path, {**body, "action_id": self.name("r")}))
                for _ in range(2)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            return
        self.act("resolve", "POST", path, {**body, "action_id": self.name("r")})
        if shape == "stale":
            self.act("resolve-stale", "POST", path, {**body, "action_id": self.name("r")})

    def resubmit(self) -> None:
        if not self.submissions:
            return
        submission = self.random.choice(self.submissions)
        code, found = self.act("find", "GET", f"/api/submissions/{submission}")
        if code != 200 or found["status"] not in ("cancelled", "failed", "unanswered"):
            return
        code, answer = self.act("resubmit", "POST", f"/api/submissions/{submission}/resubmit",
                                {"action_id": self.name("s"), "reason": "soak resubmit"})

    def one_task(self, query: str) -> dict[str, Any] | None:
        code, found = self.act("find", "GET", f"/api/tasks?{query}&limit=20")
        if code != 200 or not found:
            return None
        return self.random.choice(sorted(found, key=lambda t: t["id"]))

    def wake(self) -> None:
        """An operator wakes a sleeping task early (a batch's notice in its backoff)."""
        task = self.one_task("status=sleeping")
        if task is not None:
            self.act("wake", "POST", f"/api/tasks/{task['id']}/wake",
                     {"action_id": self.name("w"), "reason": "soak wakes"})

    def retry(self) -> None:
        """An operator retries one failed or cancelled task (the bulk form covers many)."""
        task = self.one_task(f"outcome={self.random.choice(['failed', 'cancelled'])}")
        if task is not None:
            self.act(f"retry-{task['kind']}", "POST", f"/api/tasks/{task['id']}/retry",
                     {"action_id": self.name("t"), "reason": "soak retries"})

    def bulk_retry(self) -> None:
        criteria = {"action": "retry", "kind": "send-notice", "outcome": "failed"}
        code, preview = self.act("bulk-preview", "POST", "/api/actions/bulk/preview", criteria)
        if code != 200:
            return
        self.act("bulk-retry", "POST", "/api/actions/bulk",
                 {**criteria, "expected_count": preview["count"],
                  "expected_digest": preview["digest"], "action_id": self.name("k"),
                  "reason": "soak bulk retry"})

    # -- the faults ---------------------------------------------------------------------

    def inject(self, stop: threading.Event) -> None:
        faults = [
            (self.kill_worker, 8), (self.kill_beat, 1), (self.kill_web, 1),
            (self.restart_redis, 1), (self.restart_postgres, 1), (self.provider_fault, 2),
            (self.smtp_fault, 1),
        ]
        choices, weights = zip(*faults, strict=True)
        while not stop.wait(self.fault_random.uniform(2.0, 6.0)):
            fault = self.fault_random.choices(choices, weights)[0]
            self.report.faults[fault.__name__] += 1
            try:
                fault()
            except Exception as exc:  # a fault that could not be injected is reported
                self.report.faults[f"{fault.__name__}:error:{type(exc).__name__}"] += 1

    def kill_worker(self) -> None:
        worker = self.fault_random.choice(self.workers)
        worker.kill()
        worker.spawn()  # the replacement's resume sweep and the beat recover its leases

    def kill_beat(self) -> None:
        self.beat.kill()
        self.beat.spawn()

    def kill_web(self) -> None:
        self.web.kill()
        self.web.spawn()  # back on the same port once it has started

    def restart_redis(self) -> None:
        self.stack.broker.restart()

    def restart_postgres(self) -> None:
        self.stack.postgres.restart(self.fault_random.choice(["fast", "immediate"]))

    def provider_fault(self) -> None:
        nth = self.fault_random.randint(1, 4)
        if self.fault_random.random() < 0.5:
            self.stack.admin.set_faults(
                stall={"nth": nth, "ms": self.fault_random.randint(1000, 8000), "times": 1})
        else:
            self.stack.admin.set_faults(drop_after_accept={"nth": nth, "times": 1})

    def smtp_fault(self) -> None:
        self.smtp.drop_after_data(nth=self.fault_random.randint(1, 3))

    # -- settling and the checks ----------------------------------------------------------

    def heal(self) -> None:
        """Faults have stopped: every process up, fault knobs cleared."""
        self.settling = True
        with suppress(Exception):
            self.stack.admin.set_faults()
        self.smtp.clear_faults()
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

    def settle(self) -> None:
        """Wait until nothing moves; decide what waits for an operator, as one would."""
        deadline = time.monotonic() + SETTLE_SECONDS
        while time.monotonic() < deadline:
            waiting = self.api.call("GET", "/api/tasks?waiting_for_resolution=true&limit=200")[1]
            for task in waiting or []:
                if task["kind"] == "send-notice":
                    self.act("resolve-settle", "POST", f"/api/tasks/{task['id']}/resolve",
                             {"decision": self.decision_for(task), "reason": "soak settles",
                              "action_id": self.name("z"), **step_of(task)})
            if not self.unsettled() and not waiting:
                return
            time.sleep(2)

    def check(self) -> None:
        self.check_answers()
        self.check_tasks()
        self.check_emails()
        self.check_conversations()
        self.check_submissions()
        self.check_seqs_and_feeds()

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
        starter = threading.Thread(target=self.start_batches, daemon=True)
        faults.start()
        starter.start()
        try:
            self.drive()
        finally:
            stop.set()
            faults.join()
            self.batch_queue.put(None)
            starter.join()
        self.heal()
        time.sleep(2)
        self.settle()
        self.check()
        return self.report


@contextmanager
def soak_stack(
    tmp: Path, template: PrivatePostgres, seed: int, seconds: float
) -> Iterator[Soak]:
    """The soak on a copy of ``template`` (a stopped, migrated cluster)."""
    with ExitStack() as stack:
        private = stack.enter_context(private_stack(tmp, template, latency_ms=150))
        smtp = stack.enter_context(start_smtp_server())
        yield Soak(seed, seconds, tmp, private, smtp)
