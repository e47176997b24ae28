"""The value types at the API's edge, each stating in the published schema exactly what the
server accepts, so that a request the schema allows is never refused and one it does not
allow is never taken (what schemathesis checks both ways).

- Text: no NUL characters (Postgres cannot store them), as a ``pattern``; ids and names
  at most :data:`MAX_NAME` characters, JSON strings at most :data:`MAX_TEXT`, keys
  :data:`MAX_NAME` (each a ``maxLength``).
- Submission input: ``text`` (at most :data:`kernel.agent.MAX_TEXT` characters), a
  ``model`` name, and ``options`` from the kernel's allow-list
  (:data:`kernel.agent.MODEL_OPTIONS`), nothing else in ``options``.
- Session metadata: JSON, and its ``retention_days`` (which the prune reads) a number of
  days within :data:`kernel.retention.MAX_RETENTION_DAYS`.
- JSON values (metadata, submission input, receipts): strings and keys without NUL,
  finite numbers within a double's range, nested at most :data:`MAX_DEPTH` containers
  deep - stated as a chain of component schemas ``Json0`` ... ``Json{MAX_DEPTH}``
  (:func:`json_components`), checked by :func:`storable`.
- Integers in a body: a JSON integer (``3`` or ``3.0``), never ``true`` or ``"3"``.
- Query booleans: ``true`` or ``false``; query date-times: RFC 3339 only (no unix
  timestamps such as ``0.5``).
"""

from __future__ import annotations

import math
import re
from datetime import datetime
from typing import Annotated, Any

from ninja import Field, Path, Query
from pydantic import BeforeValidator, WithJsonSchema

from kernel.agent import MAX_TEXT as MAX_SUBMISSION_TEXT
from kernel.agent import MODEL_OPTIONS
from kernel.agent.models import MAX_MODEL_NAME
from kernel.retention import MAX_RETENTION_DAYS, SESSION_RETENTION_KEY, check_retention_days

NO_NUL = r"^[^\x00]*$"
"""Text Postgres can store: anything but NUL (a ``pattern`` in the schema)."""
NOT_BLANK = r"^[^\x00]*[^\x00\t\n\v\f\r ][^\x00]*$"
"""Text with something in it besides spaces, tabs and line breaks (and no NUL). The
characters are named rather than written as a white-space class, since Python's class
and the validator's differ (on ``chr(0x1c)``) and the schema must say exactly what is
taken."""
MAX_NAME = 200
"""The longest id, name or key: what a text field or a query word may be unless it says."""
MAX_TEXT = MAX_SUBMISSION_TEXT
"""The longest string in a JSON value (metadata, a receipt, a submission's input)."""
MAX_DEPTH = 8
"""How deep a JSON value may nest containers (objects and arrays)."""
MAX_NUMBER = 1.7976931348623157e308
"""The largest JSON number stored (a double's range; jsonb could hold more, Python's
float cannot)."""
MAX_BIGINT = 2**63 - 1
COMPONENTS = "#/components/schemas/"


def text(default: Any = ..., **constraints: Any) -> Any:
    """A body field of text (``Field`` with the NUL-free pattern, at most
    :data:`MAX_NAME` characters unless it says)."""
    constraints.setdefault("pattern", NO_NUL)
    constraints.setdefault("max_length", MAX_NAME)
    return Field(default, **constraints)


def query_text(description: str | None = None) -> Any:
    return Query(None, pattern=NO_NUL, max_length=MAX_NAME, description=description)


PathText = Annotated[str, Path(..., pattern=NO_NUL, max_length=MAX_NAME)]
"""A path parameter: an id, a kind, a key."""


# -- JSON values -------------------------------------------------------------------------


def _check_text(value: str, where: str, longest: int = MAX_TEXT) -> None:
    if len(value) > longest:
        raise ValueError(f"{where}: text of at most {longest} characters, not {len(value)}")
    if "\x00" in value:
        raise ValueError(f"{where}: text may not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{where}: text is not valid Unicode") from exc


def storable(body: Any) -> None:
    """Refuse a request body Postgres cannot store, or nested deeper than the schema says
    (its JSON fields may nest :data:`MAX_DEPTH` containers; the body object is one more),
    with a ValueError naming where. Iterative, so a body nested a thousand deep is refused
    too, not a RecursionError."""
    stack: list[tuple[Any, str, int]] = [(body, "body", 0)]
    while stack:
        item, where, depth = stack.pop()
        if isinstance(item, str):
            _check_text(item, where)
        elif isinstance(item, bool) or item is None:
            continue
        elif isinstance(item, int | float):
            finite = abs(item) <= MAX_NUMBER if isinstance(item, int) else math.isfinite(item)
            if not finite:
                raise ValueError(f"{where}: numbers are at most {MAX_NUMBER:g} in size")
        elif isinstance(item, dict | list):
            if depth > MAX_DEPTH:
                raise ValueError(f"{where}: JSON values nest at most {MAX_DEPTH} levels deep")
            if isinstance(item, dict):
                for key, child in item.items():
                    _check_text(str(key), f"{where} (a key)", MAX_NAME)
                    stack.append((child, f"{where}.{key}", depth + 1))
            else:
                stack += [(child, f"{where}[{i}]", depth + 1) for i, child in enumerate(item)]


def _scalars() -> list[dict[str, Any]]:
    return [
        {"type": "string", "pattern": NO_NUL, "maxLength": MAX_TEXT},
        {"type": "number", "minimum": -MAX_NUMBER, "maximum": MAX_NUMBER},
        {"type": "boolean"},
        {"type": "null"},
    ]


def _object(children: str, **more: Any) -> dict[str, Any]:
    return {"type": "object", "propertyNames": {"pattern": NO_NUL, "maxLength": MAX_NAME},
            "additionalProperties": {"$ref": COMPONENTS + children}, **more}


def _model_options() -> dict[str, Any]:
    """The allow-list of model options (:data:`kernel.agent.MODEL_OPTIONS`) as a schema."""
    return {
        "type": "object", "additionalProperties": False,
        "description": "model options: only these, each within its range",
        "properties": {
            o.name: {"type": o.kind, "minimum": o.minimum, "maximum": o.maximum,
                     "description": o.description}
            for o in MODEL_OPTIONS
        },
    }


def json_components() -> dict[str, Any]:
    """The component schemas the JSON types refer to: ``Json{k}`` is a value nested at
    depth k, so a container there holds ``Json{k+1}`` and ``Json{MAX_DEPTH}`` is a scalar."""
    found: dict[str, Any] = {}
    for k in range(MAX_DEPTH + 1):
        variants = _scalars()
        if k < MAX_DEPTH:
            child = f"Json{k + 1}"
            variants += [{"type": "array", "items": {"$ref": COMPONENTS + child}},
                         _object(child)]
        found[f"Json{k}"] = {"anyOf": variants}
    found["JsonObject"] = _object(
        "Json1", description=f"a JSON object, nesting at most {MAX_DEPTH} levels")
    found["SubmissionInput"] = _object(
        "Json1", required=["text"], properties={
            "text": {"type": "string", "pattern": NO_NUL, "maxLength": MAX_SUBMISSION_TEXT},
            "model": {"type": "string", "pattern": NO_NUL, "minLength": 1,
                      "maxLength": MAX_MODEL_NAME},
            "options": _model_options(),
        },
        description="the input of a turn: `text`, and optionally `model`, `options`",
    )
    found["SessionMetadata"] = _object(
        "Json1", properties={SESSION_RETENTION_KEY: {
            "type": "number", "minimum": 0, "maximum": MAX_RETENTION_DAYS,
            "description": "days its history is kept once it is finished (retention)"}},
        description=f"a JSON object, nesting at most {MAX_DEPTH} levels",
    )
    return found


PLACEHOLDER = "x-component"
"""Pydantic resolves every ``$ref`` it emits, so the JSON types name their component
under this key, and :func:`refer_to_components` turns it into a ``$ref``."""
JsonObject = Annotated[dict[str, Any], WithJsonSchema({PLACEHOLDER: "JsonObject"})]
SubmissionInput = Annotated[Any, WithJsonSchema({PLACEHOLDER: "SubmissionInput"})]


def _session_metadata(value: Any) -> Any:
    if isinstance(value, dict) and SESSION_RETENTION_KEY in value:
        check_retention_days(value[SESSION_RETENTION_KEY])
    return value


SessionMetadata = Annotated[
    dict[str, Any], BeforeValidator(_session_metadata),
    WithJsonSchema({PLACEHOLDER: "SessionMetadata"}),
]


def refer_to_components(schema: Any) -> Any:
    """``schema`` with each placeholder of a JSON type made a ``$ref`` to its component."""
    if isinstance(schema, dict):
        if PLACEHOLDER in schema:
            return {"$ref": COMPONENTS + schema[PLACEHOLDER]}
        return {key: refer_to_components(value) for key, value in schema.items()}
    if isinstance(schema, list):
        return [refer_to_components(value) for value in schema]
    return schema


# -- numbers, booleans, date-times -----------------------------------------------------


def _json_integer(value: Any) -> Any:
    """A JSON integer: ``3`` or ``3.0`` (the same number in JSON), not ``true`` or ``"3"``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("must be an integer")
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError("must be an integer")
        return int(value)
    return value


Integer = Annotated[int, BeforeValidator(_json_integer)]


def _query_boolean(value: Any) -> Any:
    if isinstance(value, bool):
        return value
    if value in ("true", "false"):
        return value == "true"
    raise ValueError("must be true or false")


QueryBoolean = Annotated[bool, BeforeValidator(_query_boolean)]

RFC3339 = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})", re.ASCII
)


def _rfc3339(value: Any) -> Any:
    if isinstance(value, datetime):
        return value
    if not isinstance(value, str) or not RFC3339.fullmatch(value):
        raise ValueError("must be an RFC 3339 date-time, such as 2026-01-31T12:00:00Z")
    return value


DateTime = Annotated[
    datetime, BeforeValidator(_rfc3339), WithJsonSchema({"type": "string", "format": "date-time"})
]


__all__ = [
    "MAX_BIGINT", "MAX_DEPTH", "MAX_NAME", "MAX_TEXT", "NOT_BLANK", "NO_NUL", "DateTime",
    "Integer", "JsonObject", "PathText", "QueryBoolean", "SessionMetadata", "SubmissionInput",
    "json_components", "query_text", "refer_to_components", "storable", "text",
]
