"""The authorization matrix (issue 15): who gets what from every route.

Callers (columns): anonymous; a logged-in viewer; a logged-in operator; an operator's
API token; the same kind of token revoked; and expired. Routes (rows): every HTTP route
of the URL configuration (the API's operations, one per method, from ninja's own
description of them; the pages; the admin; the API docs; the metrics; the login pages)
and every websocket route of :data:`controlplane.sockets.routes.websocket_urlpatterns`.

The routes are enumerated from the configuration and compared with the rules below: a
new route without a rule (or a rule for a route that is gone) fails the test, so a
route cannot appear without someone deciding who may use it.

What a cell says: a status code, :data:`LOGIN` (302 to the dashboard's login page) or
:data:`ADMIN_LOGIN` (302 to the admin's); for a websocket, ``"frames"`` (it streams) or
the close code. Reads and actions name records that do not exist where the record does
not matter (an operator then gets 404 for an action: past every role check, nothing
changed); a viewer's actions carry valid bodies, so that their 403 is the role's answer,
not the body's.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.contrib.staticfiles import finders
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from django.utils import timezone
from websockets.exceptions import ConnectionClosed

from controlplane.access import issue_token
from controlplane.api import api
from controlplane.models import ApiToken
from controlplane.reads.tasks import digest
from controlplane.sockets.routes import websocket_urlpatterns
from controlplane.worker.runtime import runtime
from kernel import Draft
from tests.e2e.server import Daphne, daphne_alone, feed

pytestmark = pytest.mark.django_db(transaction=True)

CALLERS = ("anonymous", "viewer", "operator", "token", "revoked", "expired")
LOGIN = "login"
ADMIN_LOGIN = "admin-login"
NOPE = "nope"  # an id that names no record

Expect = int | str


@dataclass(frozen=True)
class Cell:
    method: str
    path: str  # with {session} for the fixture's session
    expect: dict[str, Expect]
    body: dict[str, Any] | None = None


def row(anonymous: Expect, viewer: Expect, operator: Expect, token: Expect,
        revoked: Expect, expired: Expect) -> dict[str, Expect]:
    return dict(zip(CALLERS, (anonymous, viewer, operator, token, revoked, expired), strict=True))


def everyone(answer: Expect) -> dict[str, Expect]:
    return row(*[answer] * len(CALLERS))


def api_read(ok: int = 200) -> dict[str, Expect]:
    """A read: any role, by login or by a live token."""
    return row(401, ok, ok, ok, 401, 401)


def api_act(ok: int) -> dict[str, Expect]:
    """A change: operators only (by login or by a live token)."""
    return row(401, 403, ok, ok, 401, 401)


PAGE = row(LOGIN, 200, 200, LOGIN, LOGIN, LOGIN)
"""A dashboard page: a browser's login with a role; tokens are for programs, not pages."""
MISSING_PAGE = row(LOGIN, 404, 404, LOGIN, LOGIN, LOGIN)
UI_ACTION = row(LOGIN, 403, 422, LOGIN, LOGIN, LOGIN)
"""A dashboard form post: operators only; the operator's empty form is refused (422)."""

ACTION = {"action_id": "matrix-1", "reason": "authorization matrix"}
ZERO_DIGEST = "sha256:" + "0" * 64

# -- the rules: every HTTP route ------------------------------------------------------------

API_RULES: dict[str, list[Cell]] = {
    "GET api/sessions": [Cell("GET", "/api/sessions", api_read())],
    "GET api/models": [Cell("GET", "/api/models", api_read())],
    "POST api/sessions": [Cell("POST", "/api/sessions", api_act(201), {"metadata": {}})],
    "GET api/sessions/<session_id>": [
        Cell("GET", "/api/sessions/{session}", api_read()),
        Cell("GET", f"/api/sessions/{NOPE}", api_read(404)),
    ],
    "GET api/sessions/<session_id>/conversations": [
        Cell("GET", "/api/sessions/{session}/conversations", api_read())],
    "POST api/sessions/<session_id>/conversations": [
        Cell("POST", f"/api/sessions/{NOPE}/conversations", api_act(404), {})],
    "GET api/conversations/<conversation_id>/entries": [
        Cell("GET", f"/api/conversations/{NOPE}/entries", api_read(404))],
    "GET api/sessions/<session_id>/documents/<kind>/<key>": [
        Cell("GET", "/api/sessions/{session}/documents/email-plan/doc", api_read())],
    "GET api/sessions/<session_id>/submissions": [
        Cell("GET", "/api/sessions/{session}/submissions", api_read())],
    "POST api/sessions/<session_id>/submissions": [
        Cell("POST", f"/api/sessions/{NOPE}/submissions", api_act(404),
             {"conversation_id": NOPE, "request_id": "r1", "input": {"text": "hi"}})],
    "GET api/sessions/<session_id>/approvals": [
        Cell("GET", "/api/sessions/{session}/approvals", api_read()),
        Cell("GET", f"/api/sessions/{NOPE}/approvals", api_read(404)),
    ],
    "POST api/sessions/<session_id>/calls/<call_id>/approve": [
        Cell("POST", f"/api/sessions/{{session}}/calls/{NOPE}/approve", api_act(404),
             {**ACTION, "digest": ZERO_DIGEST, "expected_request": ZERO_DIGEST})],
    "POST api/sessions/<session_id>/calls/<call_id>/deny": [
        Cell("POST", f"/api/sessions/{{session}}/calls/{NOPE}/deny", api_act(404),
             {**ACTION, "digest": ZERO_DIGEST, "expected_request": ZERO_DIGEST})],
    "GET api/sessions/<session_id>/graph": [  # the fixture's session holds no graph thread
        Cell("GET", "/api/sessions/{session}/graph", api_read(404)),
        Cell("GET", f"/api/sessions/{NOPE}/graph", api_read(404)),
    ],
    "GET api/sessions/<session_id>/graph/checkpoints": [
        Cell("GET", "/api/sessions/{session}/graph/checkpoints", api_read(404)),
        Cell("GET", f"/api/sessions/{NOPE}/graph/checkpoints?namespace=a", api_read(404)),
    ],
    "POST api/sessions/<session_id>/graph/runs": [
        Cell("POST", f"/api/sessions/{NOPE}/graph/runs", api_act(404),
             {**ACTION, "kind": "k", "input": {}, "expected_version": 0})],
    "POST api/sessions/<session_id>/graph/fork": [
        Cell("POST", f"/api/sessions/{NOPE}/graph/fork", api_act(404),
             {**ACTION, "checkpoint_id": "c1", "expected_version": 1})],
    "GET api/submissions/<submission_id>": [
        Cell("GET", f"/api/submissions/{NOPE}", api_read(404))],
    "GET api/tasks": [Cell("GET", "/api/tasks", api_read())],
    "GET api/sessions/<session_id>/tree": [
        Cell("GET", "/api/sessions/{session}/tree", api_read())],
    "GET api/tasks/<task_id>": [Cell("GET", f"/api/tasks/{NOPE}", api_read(404))],
    "GET api/workers": [Cell("GET", "/api/workers", api_read())],
    "GET api/queues": [Cell("GET", "/api/queues", api_read())],
    "POST api/tasks/<task_id>/cancel": [
        Cell("POST", f"/api/tasks/{NOPE}/cancel", api_act(404), {**ACTION, "expected_run": 0})],
    "POST api/tasks/<task_id>/retry": [
        Cell("POST", f"/api/tasks/{NOPE}/retry", api_act(404), {**ACTION, "expected_seq": 1})],
    "POST api/tasks/<task_id>/resolve": [
        Cell("POST", f"/api/tasks/{NOPE}/resolve", api_act(404),
             {**ACTION, "decision": "sent", "signal": "resolution-1", "epoch": 1})],
    "POST api/tasks/<task_id>/resume": [
        Cell("POST", f"/api/tasks/{NOPE}/resume", api_act(404),
             {**ACTION, "checkpoint_id": "c1", "value": {"approved": True},
              "interrupt_ids": ["i1"]})],
    "POST api/tasks/<task_id>/wake": [
        Cell("POST", f"/api/tasks/{NOPE}/wake", api_act(404), {**ACTION, "expected_seq": 1})],
    "GET api/tasks/<task_id>/restarts": [
        Cell("GET", f"/api/tasks/{NOPE}/restarts", api_read(404))],
    "GET api/tasks/<task_id>/restarts/<seq>": [  # a preview of an action: operators only
        Cell("GET", f"/api/tasks/{NOPE}/restarts/1", api_act(404))],
    "POST api/tasks/<task_id>/restart": [
        Cell("POST", f"/api/tasks/{NOPE}/restart", api_act(404),
             {**ACTION, "seq": 1, "expected_seq": 1})],
    "POST api/tasks/<task_id>/migrate": [
        Cell("POST", f"/api/tasks/{NOPE}/migrate", api_act(404),
             {**ACTION, "expected_seq": 1, "expected_report": "0"})],
    "POST api/sessions/<session_id>/entries/<entry_id>/branch": [
        Cell("POST", f"/api/sessions/{{session}}/entries/{NOPE}/branch", api_act(404), ACTION)],
    "POST api/submissions/<submission_id>/resubmit": [
        Cell("POST", f"/api/submissions/{NOPE}/resubmit", api_act(404),
             {**ACTION, "expected_seq": 1})],
    "POST api/conversations/<conversation_id>/compact": [
        Cell("POST", f"/api/conversations/{NOPE}/compact", api_act(404),
             {**ACTION, "last_entry_id": NOPE})],
    "POST api/actions/bulk/preview": [
        Cell("POST", "/api/actions/bulk/preview", api_act(200),
             {"action": "cancel", "session_id": NOPE})],
    "POST api/actions/bulk": [
        Cell("POST", "/api/actions/bulk", api_act(200),
             {**ACTION, "action": "cancel", "session_id": NOPE, "expected_count": 0,
              "expected_digest": digest([])})],
    "GET api/sessions/<session_id>/changes": [
        Cell("GET", "/api/sessions/{session}/changes", api_read())],
    "GET api/changes": [Cell("GET", "/api/changes", api_read())],
    # Your own tokens, any role; another account's token is "no such token".
    "GET api/tokens": [Cell("GET", "/api/tokens", api_read())],
    "POST api/tokens/<token_id>/revoke": [
        Cell("POST", "/api/tokens/{someone_elses_token}/revoke", api_read(404))],
}

OTHER_RULES: dict[str, list[Cell]] = {
    # The schema is public (no data in it); the docs page is for logged-in readers.
    "api/openapi.json": [Cell("GET", "/api/openapi.json", everyone(200))],
    "api/docs": [Cell("GET", "/api/docs", PAGE)],
    "api/": [Cell("GET", "/api/", everyone(404))],  # ninja's root: nothing there
    "healthz": [Cell("GET", "/healthz", everyone(200))],
    # The readiness probe (load balancers, compose): public, says only what is missing.
    "readyz": [Cell("GET", "/readyz", everyone(200))],
    # Prometheus's bearer token (METRICS_TOKEN, see test_metrics_take_the_scrapers_token)
    # or an operator's login: API tokens are not metrics tokens.
    "metrics": [Cell("GET", "/metrics", row(401, 403, 200, 401, 401, 401))],
    "accounts/login/": [Cell("GET", "/accounts/login/", everyone(200))],
    "accounts/logout/": [
        Cell("POST", "/accounts/logout/", everyone(LOGIN)),
        Cell("GET", "/accounts/logout/", everyone(405)),
    ],
    "": [Cell("GET", "/", PAGE), Cell("GET", "/?q=x&status=failed", PAGE)],
    "attention/": [Cell("GET", "/attention/", PAGE)],
    "workers/": [Cell("GET", "/workers/", PAGE)],
    "activity": [Cell("GET", "/activity", PAGE)],  # the overview's charts, refetched
    "tasks/": [Cell("GET", "/tasks/", PAGE),
               Cell("GET", "/tasks/?q=x&status=failed&sort=kind&page=2", PAGE)],
    "sessions/<session:session_id>/history": [
        Cell("GET", "/sessions/{session}/history", PAGE),
        Cell("GET", f"/sessions/{NOPE}/history", MISSING_PAGE),
    ],
    # Bulk actions on the tasks page's filter: operators only; no action named is 422.
    "bulk/preview": [Cell("GET", "/bulk/preview?q=x", UI_ACTION)],
    "bulk/act": [Cell("POST", "/bulk/act", UI_ACTION),
                 Cell("GET", "/bulk/act", everyone(405))],
    "sessions/<session:session_id>/": [
        Cell("GET", "/sessions/{session}/", PAGE),
        Cell("GET", f"/sessions/{NOPE}/", MISSING_PAGE),
    ],
    "sessions/<session:session_id>/conversations/<str:conversation_id>/entries": [
        # A page of a conversation's earlier entries: 404 for one the session lacks.
        Cell("GET", f"/sessions/{{session}}/conversations/{NOPE}/entries?before={NOPE}",
             MISSING_PAGE)],
    "sessions/<session:session_id>/tasks/<str:task_id>/children": [
        # A fragment of children: none for a task that is not there (an empty list).
        Cell("GET", f"/sessions/{{session}}/tasks/{NOPE}/children", PAGE)],
    "tasks/<str:task_id>/": [Cell("GET", f"/tasks/{NOPE}/", MISSING_PAGE)],
    "sessions/<session:session_id>/artifacts/<str:digest>": [
        Cell("GET", "/sessions/{session}/artifacts/sha256:" + "0" * 64, MISSING_PAGE)],
    "^tasks/(?P<target>[^/]+)/(?P<action>cancel|retry|resolve)$": [
        Cell("POST", f"/tasks/{NOPE}/{action}", UI_ACTION) for action in
        ("cancel", "retry", "resolve")
    ] + [Cell("GET", f"/tasks/{NOPE}/cancel", everyone(405))],
    "^submissions/(?P<target>[^/]+)/(?P<action>resubmit)$": [
        Cell("POST", f"/submissions/{NOPE}/resubmit", UI_ACTION)],
    "^conversations/(?P<target>[^/]+)/(?P<action>compact)$": [
        Cell("POST", f"/conversations/{NOPE}/compact", UI_ACTION)],
    "attention/retry-failed": [Cell("POST", "/attention/retry-failed", UI_ACTION)],
    # Start again from a phase (a preview, then the form) and migrate: operators only; an
    # empty form (no seq, no reason) is 422.
    "tasks/<str:task_id>/restart/preview": [
        Cell("GET", f"/tasks/{NOPE}/restart/preview", UI_ACTION)],
    "tasks/<str:task_id>/restart": [Cell("POST", f"/tasks/{NOPE}/restart", UI_ACTION),
                                    Cell("GET", f"/tasks/{NOPE}/restart", everyone(405))],
    "tasks/<str:task_id>/migrate": [Cell("POST", f"/tasks/{NOPE}/migrate", UI_ACTION),
                                    Cell("GET", f"/tasks/{NOPE}/migrate", everyone(405))],
    "sessions/<session:session_id>/calls/<str:call_id>/decide": [
        Cell("POST", f"/sessions/{{session}}/calls/{NOPE}/decide", UI_ACTION),
        Cell("GET", f"/sessions/{{session}}/calls/{NOPE}/decide", everyone(405))],
    "tasks/<str:task_id>/resume": [Cell("POST", f"/tasks/{NOPE}/resume", UI_ACTION),
                                   Cell("GET", f"/tasks/{NOPE}/resume", everyone(405))],
    "sessions/<session:session_id>/graph/runs": [
        Cell("POST", "/sessions/{session}/graph/runs", UI_ACTION),
        Cell("GET", "/sessions/{session}/graph/runs", everyone(405))],
    "sessions/<session:session_id>/graph/fork": [
        Cell("POST", "/sessions/{session}/graph/fork", UI_ACTION),
        Cell("GET", "/sessions/{session}/graph/fork", everyone(405))],
}

# The admin: for staff accounts only (the demo's accounts are not staff, nor are the
# viewer and operator here), read-only even for them. Every other caller is sent to the
# admin's login; tokens do not work there. Only its login page is open.
ADMIN_OPEN: dict[str, list[Cell]] = {
    "admin/login/": [Cell("GET", "/admin/login/", everyone(200))],
    # Someone who may not use the admin is sent to its index (and from there to its login).
    "admin/logout/": [Cell("GET", "/admin/logout/", everyone("302 /admin/"))],
}


def admin_rule(route: str) -> list[Cell]:
    """Any other admin route: staff only, everyone here goes to the admin's login."""
    if route in ADMIN_OPEN:
        return ADMIN_OPEN[route]
    path = "/" + re.sub(r"\^\(\?P<app_label>[\w|]+\)/\$", "auth/", route)  # in any order
    path = path.replace("(?P<url>.*)$", "no-such-page/")
    path = re.sub(r"<[^>]+>", "1", path)
    assert "(" not in path and "^" not in path, f"no concrete path for {route}: add a rule"
    return [Cell("GET", path, everyone(ADMIN_LOGIN))]


# -- the rules: every websocket route -------------------------------------------------------

STREAMS = row(4403, "frames", "frames", "frames", 4403, 4403)
"""A socket: a role, by a browser's login or a live token (header); else closed 4403."""

WS_RULES: dict[str, list[str]] = {
    "ws/sessions/<session:session_id>/feed/": ["/ws/sessions/{session}/feed/"],
    "ws/feed/": ["/ws/feed/"],
    "ws/ui/sessions/<session:session_id>/": ["/ws/ui/sessions/{session}/"],
    "^ws/ui/(?P<page>overview|attention|tasks)/$": ["/ws/ui/overview/", "/ws/ui/attention/",
                                                     "/ws/ui/tasks/"],
}


# -- enumerating the routes -----------------------------------------------------------------


def walk(patterns: list[Any], prefix: str = "") -> Iterator[tuple[str, URLPattern]]:
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            yield from walk(pattern.url_patterns, prefix + str(pattern.pattern))
        else:
            yield prefix + str(pattern.pattern), pattern


def api_operations() -> set[str]:
    """``METHOD route`` of every API operation, from ninja's OpenAPI description; each
    must be one of the URL configuration's routes."""
    found = set()
    for path, methods in api.get_openapi_schema()["paths"].items():
        route = re.sub(r"\{(\w+)\}", r"<\1>", path.lstrip("/"))
        found.update(f"{method.upper()} {route}" for method in methods)
    return found


def http_routes() -> tuple[set[str], set[str], set[str]]:
    """(API operations, admin routes, other routes) of the URL configuration."""
    routes = {route for route, _ in walk(get_resolver().url_patterns)}
    operations = api_operations()
    api_routes = {op.split(" ", 1)[1] for op in operations}
    ninja_own = {"api/openapi.json", "api/docs", "api/"}
    assert {r for r in routes if r.startswith("api/")} - ninja_own == api_routes
    admin = {r for r in routes if r.startswith("admin/")}
    return operations, admin, routes - api_routes - admin


def test_every_route_has_a_rule() -> None:
    operations, admin, other = http_routes()
    assert operations - set(API_RULES) == set(), "API operations without a rule"
    assert set(API_RULES) - operations == set(), "rules for API operations that are gone"
    assert other - set(OTHER_RULES) == set(), "routes without a rule"
    assert set(OTHER_RULES) - other == set(), "rules for routes that are gone"
    assert set(ADMIN_OPEN) <= admin
    assert len(admin) > 40  # the admin's routes were found
    sockets = {str(p.pattern) for p in websocket_urlpatterns}
    assert sockets == set(WS_RULES), "websocket routes and their rules differ"


# -- the callers ----------------------------------------------------------------------------


def account(name: str, role: str) -> User:
    user = User.objects.create_user(name)
    user.groups.add(Group.objects.get_or_create(name=role)[0])
    return user


@dataclass
class World:
    session: str
    someone_elses_token: int
    users: dict[str, User]
    keys: dict[str, str]

    def client(self, caller: str) -> Client:
        if caller in ("viewer", "operator"):
            client = Client()
            client.force_login(self.users[caller])
            return client
        if caller in self.keys:
            return Client(headers={"Authorization": f"Bearer {self.keys[caller]}"})
        return Client()

    def path(self, cell_path: str) -> str:
        return cell_path.format(session=self.session,
                                someone_elses_token=self.someone_elses_token)


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> World:
    monkeypatch.setattr(runtime().dispatcher, "deliver", lambda task, queue: None)
    handle = runtime().kernel.create_session()
    draft = Draft(actor="user:ann")
    draft.set("email-plan", "doc", ["n"], 1)
    handle.commit(draft)
    viewer, operator = account("vic", "viewer"), account("olga", "operator")
    keys = {
        "token": issue_token(operator, "live"),
        "revoked": issue_token(operator, "revoked"),
        "expired": issue_token(operator, "expired", timezone.now() - timedelta(seconds=1)),
    }
    ApiToken.objects.filter(name="revoked").update(revoked_at=timezone.now())
    issue_token(viewer, "the viewer's own")
    issue_token(account("otto", "operator"), "someone else's")
    other = ApiToken.objects.get(name="someone else's").pk
    return World(handle.id, other, {"viewer": viewer, "operator": operator}, keys)


def answer(response: Any) -> Expect:
    if response.status_code == 302:
        location = response["Location"]
        if location.startswith(f"{reverse('login')}?") or location == reverse("login"):
            return LOGIN
        if location.startswith("/admin/login/?"):
            return ADMIN_LOGIN
        return f"302 {location}"
    return int(response.status_code)


def check(world: World, cells: list[Cell]) -> str:
    """Every cell whose answer differs from its rule, a line each ("" if none)."""
    wrong: dict[str, dict[str, Expect]] = {}
    for cell in cells:
        for caller, expected in cell.expect.items():
            client = world.client(caller)
            path = world.path(cell.path)
            if cell.method == "GET":
                got = answer(client.get(path))
            else:
                got = answer(client.post(path, cell.body or {}, content_type="application/json")
                             if path.startswith("/api/") else client.post(path, cell.body or {}))
            if got != expected:
                wrong.setdefault(f"{cell.method} {path}", {})[caller] = (
                    f"expected {expected}, got {got}")
    return "\n".join(f"{where}: {callers}" for where, callers in wrong.items())


def test_the_api_answers_each_caller_by_its_rule(world: World) -> None:
    assert check(world, [c for cells in API_RULES.values() for c in cells]) == ""


def test_pages_docs_metrics_and_logins_answer_each_caller_by_their_rule(world: World) -> None:
    assert check(world, [c for cells in OTHER_RULES.values() for c in cells]) == ""


def test_the_admin_is_for_staff_only(world: World) -> None:
    _, admin, _ = http_routes()
    assert check(world, [c for route in sorted(admin) for c in admin_rule(route)]) == ""
    staff = Client()
    staff.force_login(User.objects.create_superuser("root"))
    assert staff.get("/admin/").status_code == 200
    assert staff.get("/admin/controlplane/task/").status_code == 200
    assert staff.get("/admin/controlplane/task/add/").status_code == 403  # read-only


def test_the_api_docs_load_their_assets_from_this_origin(world: World) -> None:
    page = world.client("viewer").get("/api/docs").content.decode()
    scripts = re.findall(r'(?:src|href)="([^"]+)"', page)
    assert "/static/ninja/swagger-ui-bundle.js" in scripts
    assert all(s.startswith("/") and not s.startswith("//") for s in scripts), scripts
    # What the ASGI app's static files handler serves (as it serves the dashboard's).
    assert finders.find("ninja/swagger-ui-bundle.js")


def test_metrics_take_the_scrapers_token(world: World, settings: Any) -> None:
    settings.METRICS_TOKEN = "prometheus-secret"
    scraper = Client(headers={"Authorization": "Bearer prometheus-secret"})
    assert scraper.get("/metrics").status_code == 200
    wrong = Client(headers={"Authorization": "Bearer prometheus-guess"})
    refused = wrong.get("/metrics")
    assert refused.status_code == 401 and refused["WWW-Authenticate"].startswith("Bearer")
    settings.METRICS_TOKEN = ""  # unset: no bearer opens it, operators' logins still do
    assert Client(headers={"Authorization": "Bearer "}).get("/metrics").status_code == 401


# -- websockets, against a real Daphne --------------------------------------------------------


@pytest.fixture
def web(tmp_path: Path, world: World) -> Iterator[Daphne]:
    with daphne_alone(tmp_path / "daphne.log", FEED_HEARTBEAT_SECONDS="1") as server:
        yield server


def socket_answer(web: Daphne, world: World, caller: str, path: str) -> Expect:
    url = web.ws + world.path(path)
    options: dict[str, Any] = {}
    if caller in ("viewer", "operator"):
        client = world.client(caller)
        options = {"origin": web.http, "additional_headers": {
            "Cookie": f"sessionid={client.cookies['sessionid'].value}"}}
    elif caller in world.keys:
        options = {"token": world.keys[caller]}
    try:
        with feed(url, first={"after": 0}, **options) as socket:
            socket.ws.recv(timeout=10)  # a commit, a heartbeat or a page's HTML
            return "frames"
    except ConnectionClosed as closed:  # on sending the cursor, or while waiting
        return closed.rcvd.code if closed.rcvd is not None else "closed"


def test_every_socket_answers_each_caller_by_its_rule(web: Daphne, world: World) -> None:
    wrong = {}
    for paths in WS_RULES.values():
        for path in paths:
            for caller, expected in STREAMS.items():
                got = socket_answer(web, world, caller, path)
                if got != expected:
                    wrong[f"{path} {caller}"] = f"expected {expected}, got {got}"
    assert wrong == {}
