"""Fuzz a real server: huge numbers and deep nesting, then ``st run --checks all``.

Usage (``make fuzz`` runs it with the services' environment loaded)::

    python -m controlplane.dev.fuzz [--max-examples N] [--seed S] [--skip-st] [-- ST_ARGS...]

What it does, against the database in ``DATABASE_URL`` (migrated first; a development
database, since the account, sessions and tasks it makes stay there):

1. an operator account ``fuzzer`` and a one-day API token for it;
2. a Daphne process serving the project with production settings (``DEBUG`` off, a
   random secret key), on a free port, its log in ``.data/fuzz/daphne.log``;
3. targeted requests built from the published schema: every numeric query parameter
   at ±10^30 and 10^400, every path parameter 10,000 characters long, and every JSON
   body nested 10,000 arrays or objects deep, or holding 10^400 and ±2^64; then the
   dashboard's pages (logged in through the login form) with every query parameter they
   read at those values, for a session and a task that exist;
4. the schemathesis CLI with every check (``schemathesis.toml`` applies: 5 s a request,
   long-polls exempt) - the whole run's operations, checks and failures are its summary
   - then once more over token revocation alone, with a token of its own (the fuzzer
   would otherwise revoke the token it runs with, and get only 401s after);
5. the server's own log read for 5xx answers (a crash the CLI could not attribute).

It exits non-zero if any request got a 5xx, the CLI found a failure, or the server
logged a server error.
"""

from __future__ import annotations

import argparse
import http.cookiejar
import json
import os
import re
import secrets
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from controlplane.dev.processes import ROOT, Daphne, process_env

ST = str(Path(sys.executable).parent / "st")
LOG_DIR = ROOT / ".data" / "fuzz"
DEEP = 10_000
HUGE_QUERY = ("1" + "0" * 30, "-1" + "0" * 30, "1e400", "-1e400")
HUGE_JSON = ("1e400", "-1e400", str(2**64), str(-(2**64)), "1" + "0" * 400)
LONG_TEXT = "9" * 10_000
PAGE_VALUES = (*HUGE_QUERY, "-1", "0", "1.5", LONG_TEXT)
PAGE_PARAMETERS = ("page", "since", "until", "sort", "q", "status", "kind", "outcome",
                   "session_id", "part", "action", "after", "limit", "version")
"""Every query parameter a dashboard page reads (ui/, ``pages.SEARCHED``), and some more."""
PAGES = ("/", "/attention/", "/tasks/", "/workers/", "/bulk/preview", "/sessions/{s}/",
         "/sessions/{s}/history", "/sessions/{s}/tasks/{t}/children", "/tasks/{t}/")
ACCESS_LINE = re.compile(r'"(GET|POST|PUT|PATCH|DELETE|HEAD|OPTIONS) (\S+)" (\d{3}) ')
REQUEST_TIMEOUT = 40.0
REVOKE = "/tokens/[^/]+/revoke$"


@dataclass(frozen=True)
class Probe:
    method: str
    path: str
    body: bytes | None
    what: str


def _prepare(password: str) -> Callable[[], str]:
    """Migrate, make the ``fuzzer`` operator (its password set); return what issues it a
    one-day API token."""
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    os.environ.setdefault("DJANGO_DEBUG", "1")  # this process only: the server runs without
    django.setup()
    from django.contrib.auth.models import Group, User
    from django.core.management import call_command
    from django.utils import timezone

    from controlplane.access import OPERATOR, issue_token

    call_command("migrate", interactive=False, verbosity=0)
    account, _ = User.objects.get_or_create(username="fuzzer")
    account.set_password(password)
    account.save()
    account.groups.add(Group.objects.get_or_create(name=OPERATOR)[0])
    return lambda: issue_token(account, "fuzz", timezone.now() + timedelta(days=1))


def _schema(base: str) -> Any:
    with urllib.request.urlopen(f"{base}/api/openapi.json", timeout=REQUEST_TIMEOUT) as answer:
        return json.load(answer)


def _sample(parameter: dict[str, Any]) -> str:
    """A value the parameter accepts, so that only the probed one is out of range."""
    schema = parameter.get("schema", {})
    kind = schema.get("type") or next(
        (s.get("type") for s in schema.get("anyOf", []) if s.get("type") != "null"), "string"
    )
    if schema.get("enum"):
        return str(schema["enum"][0])
    return {"integer": "1", "number": "1", "boolean": "true"}.get(kind, "x")


def _numeric(parameter: dict[str, Any]) -> bool:
    schema = parameter.get("schema", {})
    kinds = {schema.get("type")} | {s.get("type") for s in schema.get("anyOf", [])}
    return bool(kinds & {"integer", "number"})


def probes(schema: Any) -> Iterator[Probe]:
    """Out-of-range values for every operation the schema publishes."""
    deep_array = "[" * DEEP + "]" * DEEP
    deep_object = '{"a":' * DEEP + "1" + "}" * DEEP
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            parameters = operation.get("parameters", [])
            in_path = {p["name"]: _sample(p) for p in parameters if p["in"] == "path"}
            queries = [p for p in parameters if p["in"] == "query"]
            url = path.format(**in_path)
            body = "requestBody" in operation
            for p in queries:
                if not _numeric(p):
                    continue
                for value in HUGE_QUERY:
                    query = urllib.parse.urlencode({p["name"]: value})
                    yield Probe(method.upper(), f"{url}?{query}", b"{}" if body else None,
                                f"query {p['name']}={value[:8]}")
            for name in in_path:
                yield Probe(method.upper(), path.format(**{**in_path, name: LONG_TEXT}),
                            b"{}" if body else None, f"path {name} of {len(LONG_TEXT)} chars")
            if not body:
                continue
            for text in (deep_array, deep_object, '{"metadata":' + deep_object + "}"):
                yield Probe(method.upper(), url, text.encode(), f"body nested {DEEP} deep")
            for number in HUGE_JSON:
                for field in ("metadata", "epoch", "expected_count", "receipt", "input"):
                    yield Probe(method.upper(), url, f'{{"{field}": {number}}}'.encode(),
                                f"body {field}={number[:8]}")


Opener = Callable[..., Any]


def send(base: str, token: str, probe: Probe, opener: Opener | None = None) -> int:
    """The status ``probe`` is answered with: with the token, or through ``opener`` (a
    browser's cookies) if given."""
    headers = {"Content-Type": "application/json"}
    if opener is None:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(base + probe.path, data=probe.body, method=probe.method,
                                     headers=headers)
    try:
        with (opener or urllib.request.urlopen)(request, timeout=REQUEST_TIMEOUT) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def _api(base: str, token: str, path: str, body: Any = None) -> Any:
    request = urllib.request.Request(
        base + path, data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT) as answer:
        return json.load(answer)


def logged_in(base: str, password: str) -> Opener:
    """A browser's session: the login form posted with its CSRF token."""
    opener = urllib.request.build_opener(
        urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    form = opener.open(f"{base}/accounts/login/", timeout=REQUEST_TIMEOUT).read().decode()
    found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form)
    assert found, "no CSRF token in the login form"
    fields = {"username": "fuzzer", "password": password, "csrfmiddlewaretoken": found[1]}
    opener.open(f"{base}/accounts/login/", urllib.parse.urlencode(fields).encode(),
                timeout=REQUEST_TIMEOUT)
    return opener.open


def page_probes(base: str, token: str) -> Iterator[Probe]:
    """Every page, for a session with a task (a submission's turn), with each query
    parameter at each out-of-range value."""
    session = _api(base, token, "/api/sessions", {"metadata": {"title": "fuzz"}})["id"]
    conversation = _api(base, token, f"/api/sessions/{session}/conversations", {})["id"]
    _api(base, token, f"/api/sessions/{session}/submissions",
         {"conversation_id": conversation, "request_id": "fuzz", "input": {"text": "hi"}})
    [task] = _api(base, token, f"/api/tasks?session_id={session}")
    for page in PAGES:
        path = page.format(s=session, t=task["id"])
        for name in PAGE_PARAMETERS:
            for value in PAGE_VALUES:
                query = urllib.parse.urlencode({name: value})
                yield Probe("GET", f"{path}?{query}", None, f"page {name}={value[:8]}")


def server_errors(log: Path) -> list[str]:
    """The 5xx answers Daphne's access log shows."""
    text = log.read_text(errors="replace") if log.exists() else ""
    return [f"{m[0]} {m[1][:120]} -> {m[2]}" for m in ACCESS_LINE.findall(text)
            if m[2].startswith("5")]


def _st(base: str, token: str, scope: list[str], args: argparse.Namespace) -> bool:
    """Run the schemathesis CLI with every check; True if it found a failure."""
    command = [ST, "run", "--checks", "all", "-H", f"Authorization: Bearer {token}",
               "--report", "junit", "--report-dir", str(args.log_dir), *scope]
    if args.max_examples is not None:
        command += ["--max-examples", str(args.max_examples)]
    if args.seed is not None:
        command += ["--seed", str(args.seed)]
    command += [*args.st_args, f"{base}/api/openapi.json"]
    print("==> " + " ".join(c if not c.startswith("Authorization") else
                            "'Authorization: Bearer ...'" for c in command), flush=True)
    return subprocess.run(command, cwd=ROOT, check=False).returncode != 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-examples", type=int, default=None)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--skip-st", action="store_true", help="the targeted requests only")
    parser.add_argument("--log-dir", type=Path, default=LOG_DIR,
                        help="the server's log and the CLI's report (default: .data/fuzz)")
    parser.add_argument("st_args", nargs="*", help="more arguments for `st run` (after --)")
    args = parser.parse_args(argv)

    password = secrets.token_urlsafe(16)
    issue = _prepare(password)
    token = issue()
    args.log_dir.mkdir(parents=True, exist_ok=True)
    log = args.log_dir / "daphne.log"
    log.unlink(missing_ok=True)
    # Request rates off: the fuzzer asks thousands of times a minute from one token, and
    # every 429 would be a request whose answer nobody checked.
    env = process_env(DJANGO_DEBUG="0", DJANGO_SECRET_KEY=secrets.token_urlsafe(50),
                      DJANGO_CONN_MAX_AGE="0", USER_REQUESTS_PER_SECOND="0",
                      ADDRESS_REQUESTS_PER_SECOND="0",
                      USER_SERVER_SECONDS_PER_SECOND="0")
    server = Daphne(log, env)
    failed = False
    try:
        server.start()
        base = server.http
        bad: list[str] = []
        browser = logged_in(base, password)
        for what, found, opener in (("API", probes(_schema(base)), None),
                                    ("pages", page_probes(base, token), browser)):
            answers: dict[int, int] = {}
            for probe in found:
                status = send(base, token, probe, opener)
                answers[status] = answers.get(status, 0) + 1
                if status >= 500:
                    bad.append(f"{probe.method} {probe.path[:100]} ({probe.what}) -> {status}")
            print(f"==> targeted requests ({what}): {sum(answers.values())}, answers "
                  f"{dict(sorted(answers.items()))}")
        print(f"==> targeted requests: server errors {len(bad)}")
        for line in bad:
            print(f"    {line}")
        failed = bool(bad)
        if not args.skip_st:
            # Revoking tokens is fuzzed last, with a token of its own: the fuzzer guesses
            # token ids, and its own is among them.
            failed = _st(base, token, ["--exclude-path-regex", REVOKE], args) or failed
            if send(base, token, Probe("GET", "/api/sessions?limit=1", None, "")) != 200:
                print("!! the token stopped working during the run: its figures mean little")
                failed = True
            failed = _st(base, issue(), ["--include-path-regex", REVOKE], args) or failed
    finally:
        server.stop()
    logged = server_errors(log)
    print(f"==> server errors in the server's log: {len(logged)}")
    for line in logged[:20]:
        print(f"    {line}")
    return 1 if failed or logged else 0


if __name__ == "__main__":
    sys.exit(main())
