"""The ``kernel_*`` tables: one definition, matched by name, mapped once at import.

The Django models (:mod:`controlplane.models`, the migration source) are the one
schema definition; the kernel records (:mod:`kernel.records`) say what a row holds.
A :class:`Table` pairs a record with its model by *name*: a record field is the model
column whose ``attname`` it is (``session_id`` for the ``session`` foreign key). At
import every pair is checked, and :class:`SchemaMismatch` names any field on one side
without a partner on the other. Conversions are chosen by type, never listed per
column: a model ``JSONField`` is wrapped in ``Jsonb`` on the way in (SQL NULL for
``None`` only where the column is nullable) and decoded from text on the way out of
SQL; a record field annotated with a ``StrEnum`` is stored as its value.

Besides the record's fields a model may have
- an automatic primary key the record does not carry (``DocumentVersion.id``): the
  database assigns it, nothing here reads or writes it;
- a column that is a read-only *property* of the record (``Task.wait_deps``): written
  from the property, never read back.
A record field that is the model's automatic primary key (``Commit.id``,
``Dispatch.id``) is read but never inserted: the insert returns it.

Public interface (storage and the control plane's read layer use the same objects):
one :class:`Table` per table - :data:`SESSION`, :data:`CONVERSATION`, :data:`ENTRY`,
:data:`DOCUMENT_HEAD`, :data:`DOCUMENT_VERSION`, :data:`TASK`, :data:`SUBMISSION`,
:data:`COMMIT`, :data:`DISPATCH` - each with

- ``columns``: the record's columns in the record's field order, usable in SQL and
  in ``Model.objects.values(*columns)``;
- ``record(row)``: a mapping column -> value as the ORM returns it (``.values()``
  dicts: JSON already decoded) -> the kernel record;
- ``from_sql(row)``: a row from a cursor on Django's connection (Django loads
  ``jsonb`` as text), a sequence in ``columns`` order -> the kernel record;
- ``row(record)``: the record -> dict column -> DB value (psycopg parameters), for
  every column an insert writes (:attr:`Table.inserted`).

Example (the read layer)::

    from controlplane.storage.schema import TASK
    tasks = [TASK.record(v) for v in models.Task.objects.filter(...).values(*TASK.columns)]
    cur.execute(f"SELECT {TASK.select_list} FROM {TASK.name} WHERE id = %s", [task_id])
    task = TASK.from_sql(cur.fetchone())
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from enum import Enum
from operator import attrgetter, itemgetter
from typing import Any, Generic, TypeVar

from django.db import models
from psycopg.types.json import Jsonb

from controlplane import models as tables
from kernel import records

R = TypeVar("R")
Convert = Callable[[Any], Any]


class SchemaMismatch(Exception):
    """A kernel record and its Django model do not correspond field for field."""


def json_from_text(value: Any) -> Any:
    """Django registers a text loader for jsonb; decode here so records hold real values."""
    return json.loads(value) if isinstance(value, str) else value


def _enum_of(annotation: Any) -> type[Enum] | None:
    """The Enum class an annotation names (``Status``, ``Status | None``), if any."""
    options = typing.get_args(annotation) if _is_union(annotation) else (annotation,)
    found = [t for t in options if isinstance(t, type) and issubclass(t, Enum)]
    return found[0] if found else None


def _is_union(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (typing.Union, types.UnionType)


def _null_safe(convert: Convert) -> Convert:
    return lambda value: None if value is None else convert(value)


def _is_auto(field: models.Field) -> bool:
    return bool(field.primary_key and isinstance(field, models.AutoField | models.BigAutoField))


def _getter(make: Callable[..., Any], names: Sequence[str]) -> Callable[[Any], tuple]:
    """``itemgetter``/``attrgetter`` of ``names`` that returns a tuple whatever their count."""
    if len(names) > 1:
        return make(*names)  # type: ignore[no-any-return]
    if not names:
        return lambda _: ()
    one = make(names[0])
    return lambda source: (one(source),)


def mismatches(record: type, model: type[models.Model]) -> list[str]:
    """What keeps ``record`` and ``model`` from corresponding by name (empty: they do)."""
    label = f"{record.__name__} <-> {model.__name__} ({model._meta.db_table})"
    by_name = {f.attname: f for f in model._meta.concrete_fields}
    names = [f.name for f in dataclasses.fields(record)]
    problems = [
        f"{label}: record field {n!r} has no model column" for n in names if n not in by_name
    ]
    for attname, field in by_name.items():
        if field.column != attname:
            problems.append(f"{label}: column {field.column!r} is not named {attname!r}")
        elif attname in names or _is_auto(field):
            continue
        elif not isinstance(getattr(record, attname, None), property):
            problems.append(f"{label}: model column {attname!r} is not a field of the record")
    return problems


class Table(Generic[R]):
    """One ``kernel_*`` table: its record, its model, and the mapping between them.

    ``fixed`` names the columns that never change once a row is inserted; updates
    (:attr:`updated`) write every other inserted column. Everything is computed here,
    once: mapping a row is a precomputed getter plus the few conversions it needs.
    """

    def __init__(
        self, record: type[R], model: type[models.Model], fixed: Sequence[str] = ()
    ) -> None:
        problems = mismatches(record, model)
        hints = typing.get_type_hints(record)
        fields = {f.attname: f for f in model._meta.concrete_fields}
        names = tuple(f.name for f in dataclasses.fields(record))  # type: ignore[arg-type]
        problems += [f"{model.__name__}: no column {c!r} to fix" for c in fixed if c not in fields]
        if problems:
            raise SchemaMismatch("; ".join(problems))
        self.record_type = record
        self.model = model
        self.name: str = model._meta.db_table
        self.columns: tuple[str, ...] = names
        self.select_list = ", ".join(names)
        pk = model._meta.pk
        assert pk is not None
        self.key: str = pk.attname
        derived = tuple(c for c in fields if c not in names and not _is_auto(fields[c]))
        self.inserted: tuple[str, ...] = tuple(
            c for c in names if not _is_auto(fields[c])
        ) + derived
        self.updated: tuple[str, ...] = tuple(
            c for c in self.inserted if c not in fixed and c != self.key
        )

        decode: list[tuple[int, Convert]] = []  # for rows from SQL: JSON as text
        load: list[tuple[int, Convert]] = []  # for rows from the ORM: JSON decoded
        for i, name in enumerate(names):
            enum = _enum_of(hints[name])
            convert: Convert | None = enum
            if isinstance(fields[name], models.JSONField):
                decode.append((i, json_from_text))
            if convert is not None:
                convert = _null_safe(convert) if fields[name].null else convert
                decode.append((i, convert))
                load.append((i, convert))
        self._decode = tuple(decode)
        self._load = tuple(load)
        self._get_row = _getter(itemgetter, names)

        def encoder(columns: Sequence[str]) -> tuple[Callable[[Any], Any], tuple]:
            """A getter of ``columns`` from a record and the conversions their values need."""
            encode: list[tuple[int, Convert]] = []
            for i, name in enumerate(columns):
                field = fields[name]
                if isinstance(field, models.JSONField):
                    encode.append((i, _null_safe(Jsonb) if field.null else Jsonb))
                elif name in names and _enum_of(hints[name]) is not None:
                    encode.append((i, _null_safe(str) if field.null else str))
            return _getter(attrgetter, columns), tuple(encode)

        self._encoder = encoder
        self._get_inserted, self._encode_inserted = encoder(self.inserted)
        keyed = (*self.updated, self.key) if self.key in self.inserted else self.updated
        self._get_updated, self._encode_updated = encoder(keyed)
        self._updaters: dict[tuple[str, ...], tuple[Callable[[Any], Any], tuple]] = {}
        self._get_changeable = _getter(attrgetter, self.updated)

    def __repr__(self) -> str:
        return f"<Table {self.name}: {self.record_type.__name__}>"

    def qualified(self, alias: str) -> str:
        """The column list with a table alias: ``t.id, t.session_id, ...``."""
        return ", ".join(f"{alias}.{c}" for c in self.columns)

    def from_sql(self, row: Sequence[Any]) -> R:
        """A row read by SQL on Django's connection, in :attr:`columns` order."""
        values = list(row)
        for i, convert in self._decode:
            values[i] = convert(values[i])
        return self.record_type(*values)

    def record(self, row: Mapping[str, Any]) -> R:
        """A mapping by column name, values as the ORM returns them (JSON decoded)."""
        values = list(self._get_row(row))
        for i, convert in self._load:
            values[i] = convert(values[i])
        return self.record_type(*values)

    def values(self, record: R) -> list[Any]:
        """The DB values of :attr:`inserted`, in that order: an insert's parameters."""
        values = list(self._get_inserted(record))
        for i, convert in self._encode_inserted:
            values[i] = convert(values[i])
        return values

    def update_values(self, record: R, columns: tuple[str, ...] | None = None) -> list[Any]:
        """The DB values of :attr:`updated` (or of ``columns``, some of them), then the
        key: an update's parameters."""
        if columns is None:
            get, encode = self._get_updated, self._encode_updated
        else:
            found = self._updaters.get(columns)
            if found is None:
                found = self._updaters[columns] = self._encoder((*columns, self.key))
            get, encode = found
        values = list(get(record))
        for i, convert in encode:
            values[i] = convert(values[i])
        return values

    def changed(self, before: R, after: R, always: tuple[str, ...] = ()) -> tuple[str, ...]:
        """The columns of :attr:`updated` whose values differ from ``before`` to
        ``after``, and ``always``, in :attr:`updated`'s order: what an update of a row
        known to hold ``before`` must write."""
        return tuple(c for c, was, now in zip(self.updated, self._get_changeable(before),
                                              self._get_changeable(after), strict=True)
                     if c in always or was != now)

    def row(self, record: R) -> dict[str, Any]:
        """The record as a dict column -> DB value, for every column an insert writes."""
        return dict(zip(self.inserted, self.values(record), strict=True))


SESSION = Table(records.SessionRecord, tables.Session, fixed=("created_at",))
CONVERSATION = Table(records.Conversation, tables.Conversation)
ENTRY = Table(records.Entry, tables.Entry)
DOCUMENT_HEAD = Table(records.DocumentHead, tables.Document, fixed=("session_id", "kind", "key"))
DOCUMENT_VERSION = Table(records.DocumentVersion, tables.DocumentVersion)
TASK = Table(
    records.Task,
    tables.Task,
    fixed=("session_id", "kind", "created_seq", "parent_id", "owned", "queue", "trace"),
)
SUBMISSION = Table(
    records.Submission,
    tables.Submission,
    fixed=("session_id", "conversation_id", "request_id", "input", "created_seq", "resubmit_of"),
)
COMMIT = Table(records.Commit, tables.Commit)
DISPATCH = Table(records.Dispatch, tables.Dispatch)

TABLES: tuple[Table[Any], ...] = (
    SESSION,
    CONVERSATION,
    ENTRY,
    DOCUMENT_HEAD,
    DOCUMENT_VERSION,
    TASK,
    SUBMISSION,
    COMMIT,
    DISPATCH,
)
