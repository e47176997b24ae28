"""The control plane's HTTP API (django-ninja), one router per resource.

OpenAPI at ``/api/openapi.json`` (public: it holds no data), docs at ``/api/docs`` (for
logged-in viewers and operators; Swagger UI from ninja's static files, on this origin).
Every endpoint needs an authenticated viewer or operator; actions need an operator (see
:mod:`.auth`).
Routers are thin: reads come from :mod:`controlplane.reads`, changes from
:mod:`controlplane.commands`, and their domain errors become HTTP answers here, in one
place (:func:`controlplane.errors.http_status`): 403 for a role that does not allow it,
404 for no such record, 409 when the state does not allow it, 422 for bad input (naming
the field; nothing changed), 429 with ``Retry-After`` when the account holds as many
long-polls as it may or asks faster than its rate (or its address does:
:mod:`controlplane.web.rates`).
"""

from __future__ import annotations

import inspect
from functools import wraps
from typing import Any

from django.http import HttpRequest, HttpResponse
from ninja import NinjaAPI, Schema
from ninja.errors import ValidationError

from controlplane.api import actions, feed, sessions, tasks, tokens
from controlplane.api.auth import AUTH, docs_for_readers
from controlplane.api.types import json_components, refer_to_components
from controlplane.errors import ControlPlaneError, http_status
from controlplane.web.middleware import STORAGE_DOWN, storage_down
from kernel import CommitRejected

ERRORS = {
    "400": "The request body is not JSON",
    "401": "Not authenticated",
    "403": "Authenticated, but the role does not allow it (or a CSRF check failed)",
    "404": "No such record",
    "409": "The record's state does not allow this now",
    "422": "Invalid input; `detail` names the field",
    "429": "Too many requests from this account or this address (USER_REQUESTS_PER_SECOND, "
    "ADDRESS_REQUESTS_PER_SECOND), or this account's requests took its share of the "
    "server's time (USER_SERVER_SECONDS_PER_SECOND), or its other requests kept this one "
    "waiting too long for its turn (USER_TURN_WAIT_SECONDS); try again after `Retry-After` "
    "seconds, nothing was done",
    "503": "The database is unavailable; retry after `Retry-After` seconds (with the "
    "same `request_id` or `action_id`, a retry cannot apply a command twice)",
}


class ControlPlaneAPI(NinjaAPI):
    """Documents the error answers every operation can give, once, for all of them; the
    schema is built once per process (it is public, and building it takes tens of ms)."""

    _schemas: dict[str, Any]

    def get_openapi_operation_id(self, operation: Any) -> str:
        """The view's own name (``create_session``; unique across the routers), so that a
        client generated from the schema names its calls so, not by module path."""
        return str(operation.view_func.__name__)

    def forget_schema(self) -> None:
        self._schemas = {}

    def get_openapi_schema(self, **kwargs: Any) -> Any:
        key = repr(sorted(kwargs.items()))
        cached = getattr(self, "_schemas", {})
        if key not in cached:
            self._schemas = {**cached, key: self._build_schema(**kwargs)}
        return self._schemas[key]

    def _build_schema(self, **kwargs: Any) -> Any:
        schema = super().get_openapi_schema(**kwargs)
        schema["paths"] = refer_to_components(schema["paths"])
        components = schema.setdefault("components", {})
        components["schemas"] = {
            **refer_to_components(components.get("schemas", {})), **json_components()
        }
        # One component for every error answer: a client generated from the schema gets
        # one error type, not one per operation and status.
        components["schemas"]["Error"] = {
            "type": "object", "properties": {"detail": {}}, "required": ["detail"],
            "description": "why the request was refused; `detail` names the field for 422",
        }
        error = {"$ref": "#/components/schemas/Error"}
        for operations in schema["paths"].values():
            for operation in operations.values():
                responses = operation.setdefault("responses", {})
                for code, description in ERRORS.items():
                    answer: dict[str, Any] = {
                        "description": description,
                        "content": {"application/json": {"schema": error}},
                    }
                    if code in ("429", "503"):
                        answer["headers"] = {"Retry-After": {"schema": {"type": "integer"}}}
                    responses.setdefault(code, answer)
        return schema


api = ControlPlaneAPI(
    title="Durable control plane",
    version="1",
    description="Observe and steer durable agent tasks: sessions, tasks, documents, "
    "submissions, the change feed, and operator actions.",
    auth=AUTH,
    docs_decorator=docs_for_readers,
    urls_namespace="api",
)


def refuse_unknown_parameters(view: Any) -> Any:
    """An operation refuses a query parameter it does not take (422 naming it, before it
    does anything): ignored, a misspelt filter would answer every record, and a cursor
    under another name (the websockets' ``after_seq``) would read a feed from 0."""

    def check(request: HttpRequest, values: dict[str, Any]) -> None:
        unknown = sorted(set(request.GET) - set(values))
        if unknown:
            match = request.resolver_match
            route = match.kwargs if match is not None else {}
            taken = [name for name, value in values.items()
                     if name not in route and not isinstance(value, Schema)]
            raise ValidationError([
                {"type": "unknown_parameter", "loc": ["query", name],
                 "msg": f"unknown parameter; this takes {', '.join(taken) or 'none'}"}
                for name in unknown
            ])

    if inspect.iscoroutinefunction(view):
        @wraps(view)
        async def checked_async(request: HttpRequest, **values: Any) -> Any:
            check(request, values)
            return await view(request, **values)

        return checked_async

    @wraps(view)
    def checked(request: HttpRequest, **values: Any) -> Any:
        check(request, values)
        return view(request, **values)

    return checked


api.add_decorator(refuse_unknown_parameters)
api.add_router("/", sessions.router)
api.add_router("/", tasks.router)
api.add_router("/", actions.router)
api.add_router("/", feed.router)
api.add_router("/", tokens.router)


def domain_error(request: HttpRequest, exc: Any) -> HttpResponse:
    status = http_status(exc)
    assert status is not None, exc
    response = api.create_response(request, {"detail": str(exc)}, status=status)
    retry_after = getattr(exc, "retry_after", None)  # TooBusy says when to ask again
    if retry_after is not None:
        response["Retry-After"] = str(retry_after)
    return response


api.add_exception_handler(ControlPlaneError, domain_error)
api.add_exception_handler(CommitRejected, domain_error)  # UnknownRecord among them: 404
for unavailable in STORAGE_DOWN:
    api.add_exception_handler(unavailable, storage_down)
